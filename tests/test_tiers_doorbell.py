"""The doorbell protocol against a simulated GPU (a thread that stages rows, rings, waits for the flags and reads the
plan and ymiss as the graph would), the stall hook, bounded waits, and the watchdog releasing a stalled window."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from strata_cli.errors import InputError
from strata_cli.tiers import watchdog
from strata_cli.tiers.doorbell import (RELEASED, DoorbellError, DoorbellServer, DoorbellStaging, VerifierReleased,
                                       stall_window, store_word, wait_word, window_steps)
from strata_cli.tiers.plan import PlanLayout, build_plan, read_plan
from strata_cli.tiers.pool import ExpertPool
from strata_cli.tiers.residency import Residency
from test_tiers_pool import FakeModel

MAX_T, K, E, H, L = 5, 3, 6, 64, 3


class SimGPU:
    """Plays the graph's side of one window: per step stage x/ids, ring seq, wait flagA (read the plan), flagB,
    flag (read the CPU rows of ymiss). Records what it saw; stops at a released (0xFFFFFFFF) flag or a timeout."""

    def __init__(self, st: DoorbellStaging, layout: PlanLayout, wait_s: float = 5.0):
        self.st, self.layout, self.wait_s = st, layout, wait_s
        self.seen, self.outcome, self.thread = [], None, None

    def launch(self, steps, xs, ids):
        def run():
            st = self.st
            for k, step in enumerate(steps):
                ring, rows = k + 1, slice(step.row0, step.row0 + step.n_rows)
                st.x[rows] = xs[step.layer, rows]
                st.ids[rows] = ids[step.layer, rows]
                store_word(st.seq, ring)
                for name, word in (("flagA", st.flag_a), ("flagB", st.flag_b), ("flag", st.flag)):
                    got = wait_word(word, ring, self.wait_s)
                    if got == RELEASED:
                        self.outcome = ("released", k, name)
                        return
                    if got < ring:
                        self.outcome = ("timeout", k, name)
                        return
                    if name == "flagA":
                        plan = read_plan(st.plans[step.group], self.layout)
                cpu_rows = sorted(set(range(step.row0 * K, (step.row0 + step.n_rows) * K)) - set(plan.dst.tolist()))
                self.seen.append((step, plan, {r: st.ymiss[r].copy() for r in cpu_rows}))
            self.outcome = ("done", len(steps), None)

        self.seen, self.outcome = [], None
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=10.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the simulated GPU is still waiting"


@pytest.fixture
def rig():
    model = FakeModel(("Q8_0", "F16", "Q8_0"), n_layers=L, E=E, H=H, F=96, k=K)
    pool = ExpertPool(model, n_threads=2)
    table = np.full((L, E), -1, np.int32)
    table[0, 1] = table[2, 0] = table[2, 5] = 0
    res = Residency(table=table, pairs=np.argwhere(table >= 0).astype(np.int32), slot_bytes=1)
    layout = PlanLayout(MAX_T * K)
    st = DoorbellStaging.allocate(MAX_T, K, H, layout)
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((L, MAX_T, H)).astype(np.float32)
    ids = np.stack([[rng.choice(E, K, replace=False) for _ in range(MAX_T)] for _ in range(L)]).astype(np.int32)
    servers = []
    yield SimpleNamespace(model=model, pool=pool, res=res, layout=layout, st=st, xs=xs, ids=ids, servers=servers)
    for s in servers:
        s.close()


def make_server(rig, **kw):
    server = DoorbellServer(rig.pool, rig.res, rig.st, rig.layout, name=f"test{len(rig.servers)}", **kw)
    rig.servers.append(server)
    return server


def check_window(rig, sim, steps, pcie_frac):
    ref_pool = ExpertPool(rig.model, use_native=False)
    assert len(sim.seen) == len(steps)
    for step, plan_view, cpu_rows in sim.seen:
        ids = rig.ids[step.layer, step.row0:step.row0 + step.n_rows]
        plan = build_plan(step.layer, ids, rig.res.row(step.layer), pcie_frac, row0=step.row0)
        assert plan_view.counts.tolist() == [plan.vram.n_groups, plan.n_gpu_entries, plan.pcie.n_groups, 0]
        assert sorted(cpu_rows) == sorted(plan.cpu.dst.tolist())
        want = ref_pool.compute(step.layer, rig.xs[step.layer], plan.cpu)
        for r, got in cpu_rows.items():
            np.testing.assert_allclose(got, want[r], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("split,pcie_frac", [(False, 0.0), (True, 0.0), (False, 0.5), (True, 1.0)])
def test_windows_served(rig, split, pcie_frac):
    copies = []

    def copy_pcie(step, plan, ring, raise_b):  # the copy stream's host function raises flagB a moment later
        copies.append((step.layer, plan.pcie.experts.tolist()))
        threading.Timer(0.002, raise_b).start()

    server = make_server(rig, pcie_frac=pcie_frac, copy_pcie=copy_pcie if pcie_frac else None, stall=0)
    sim = SimGPU(rig.st, rig.layout)
    for T in (MAX_T, 1, 4):
        steps = window_steps(T, range(L), split)
        assert len(steps) == L * (2 if split and T >= 2 else 1)
        server.begin_window(steps)
        sim.launch(steps, rig.xs, rig.ids)
        stats = server.finish_window()
        sim.join()
        server.end_window()
        assert sim.outcome == ("done", len(steps), None)
        check_window(rig, sim, steps, pcie_frac)
        assert stats.steps == len(steps) and not stats.stalled
        assert stats.vram_entries + stats.pcie_entries + stats.cpu_entries == T * K * L
        assert (stats.cpu_entries > 0) == (pcie_frac < 1) and stats.pool_s > 0
        assert (stats.pcie_entries > 0) == (pcie_frac > 0)
    assert bool(copies) == (pcie_frac > 0)


def test_window_steps_order():
    steps = window_steps(5, [2, 3], split=True)
    assert [(s.layer, s.group, s.row0, s.n_rows) for s in steps] == [(2, 0, 0, 3), (2, 1, 3, 2), (3, 0, 0, 3),
                                                                     (3, 1, 3, 2)]
    assert [(s.group, s.n_rows) for s in window_steps(1, [0], split=True)] == [(0, 1)]


def test_stall_hook_watchdog_releases_and_refuses_later_windows(rig):
    server = make_server(rig, stall=2)
    sim = SimGPU(rig.st, rig.layout, wait_s=10.0)
    steps = window_steps(3, range(L))
    fired = []
    with watchdog.Watchdog(0.3, on_fire=fired.extend):
        for window in (1, 2):
            assert server.begin_window(steps) == window
            sim.launch(steps, rig.xs, rig.ids)
            stats = server.finish_window()
            t0 = time.monotonic()
            sim.join(timeout=5.0)
            if window == 1:
                server.end_window()
                assert sim.outcome[0] == "done" and not stats.stalled
        waited = time.monotonic() - t0
    assert stats.stalled and sim.outcome == ("released", len(steps) - 1, "flag")
    assert 0.25 < waited < 2.0
    assert fired and fired[0].startswith(f"window 2 stalled at layer {L - 1}; GPU waits released; streams idle after ")
    assert server.released and not server.busy
    with pytest.raises(VerifierReleased, match="runs no more windows"):
        server.begin_window(steps)


def test_gpu_that_never_rings_times_out_bounded(rig):
    server = make_server(rig, step_timeout_s=0.2, stall=0)
    t0 = time.monotonic()
    server.begin_window(window_steps(2, range(L)))
    with pytest.raises(DoorbellError, match="layer 0 did not ring within 0.2 s; GPU waits released"):
        server.finish_window()
    assert time.monotonic() - t0 < 2.0
    assert rig.st.flag[0] == RELEASED and server.released


def test_stream_that_ends_without_ringing(rig):
    done = threading.Event()
    server = make_server(rig, stream_done=done.is_set, stall=0)
    steps = window_steps(2, range(L))
    server.begin_window(steps)
    store_word(rig.st.seq, 1)  # the GPU rang step 0 and died
    time.sleep(0.05)
    done.set()
    with pytest.raises(DoorbellError, match=r"layer 1 never rang \(the GPU stream ended at ring 1 of 3\)"):
        server.finish_window()


def test_fence_callback_bounds_the_release(rig):
    calls = []
    server = make_server(rig, fence_and_wait=lambda ms: calls.append(ms) or False, stall=0)
    assert server.release(timeout_ms=1234) is None and calls == [1234]
    assert all(int(w[0]) == RELEASED for w in rig.st.flags())


def test_stall_env(monkeypatch):
    assert stall_window({}) == 0 and stall_window({"STRATA_TEST_VERIFY_STALL": "3"}) == 3
    with pytest.raises(InputError, match="STRATA_TEST_VERIFY_STALL='x'"):
        stall_window({"STRATA_TEST_VERIFY_STALL": "x"})
    monkeypatch.setenv("STRATA_TEST_VERIFY_STALL", "4")
    assert stall_window() == 4


class FakeVerifier:
    def __init__(self, name, busy, last):
        self.name, self.busy, self.last_progress, self.released, self.calls = name, busy, last, False, []

    def describe_stall(self):
        return f"window 1 stalled at layer {self.name}"

    def release(self, timeout_ms, reason):
        self.calls.append((timeout_ms, reason))
        self.released, self.busy = True, False
        return 12.0


def test_watchdog_fires_once_on_no_progress_and_releases_every_live_verifier():
    now = [100.0]
    a, b, idle = FakeVerifier("a", True, 100.0), FakeVerifier("b", True, 100.0), FakeVerifier("c", False, 0.0)
    for v in (a, b, idle):
        watchdog.register(v)
    try:
        dog = watchdog.Watchdog(5.0, clock=lambda: now[0], release_timeout_ms=777)
        now[0] = 104.9
        assert not dog.check() and not a.calls
        b.last_progress = 104.0  # b made progress; a did not
        now[0] = 105.5
        assert dog.stalled() == [a]
        assert dog.check() and dog.fired.is_set()
        assert a.calls == [(777, "no progress for 5 s")] and b.calls and idle.calls  # every live one is released
        assert "window 1 stalled at layer a; GPU waits released; streams idle after 12 ms" in dog.lines
        assert not dog.check()  # fires once
    finally:
        for v in (a, b, idle):
            watchdog.unregister(v)


def test_sigterm_releases_busy_verifiers_then_exits():
    v, idle = FakeVerifier("s", True, 0.0), FakeVerifier("t", False, 0.0)
    watchdog.register(v)
    watchdog.register(idle)
    assert watchdog.install_signal_release()
    try:
        with pytest.raises(SystemExit) as exc:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
        assert exc.value.code == 128 + signal.SIGTERM
        assert v.calls and v.calls[0][1] == "signal SIGTERM" and not idle.calls
    finally:
        watchdog.uninstall_signal_release()
        watchdog.unregister(v)
        watchdog.unregister(idle)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_env_watchdog_timeout(monkeypatch):
    assert watchdog.env_timeout({}) == 60.0 and watchdog.env_timeout({"STRATA_WATCHDOG_S": "0"}) == 0.0
    assert watchdog.env_timeout({"STRATA_WATCHDOG_S": "2.5"}) == 2.5
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(InputError, match=f"STRATA_WATCHDOG_S='{bad}'"):
            watchdog.env_timeout({"STRATA_WATCHDOG_S": bad})


def test_first_registration_starts_the_process_watchdog(monkeypatch, capsys):
    monkeypatch.setattr(watchdog, "_env_watchdog", None)
    monkeypatch.setenv("STRATA_WATCHDOG_S", "0.2")
    v = FakeVerifier("w", True, time.monotonic())
    try:
        watchdog.register(v)
        dog = watchdog._env_watchdog
        assert dog is not None and dog.timeout_s == 0.2
        assert dog.fired.wait(3.0) and v.calls
        assert "strata: watchdog: window 1 stalled at layer w; GPU waits released" in capsys.readouterr().err
    finally:
        watchdog.unregister(v)
        if watchdog._env_watchdog is not None:
            watchdog._env_watchdog.stop()
