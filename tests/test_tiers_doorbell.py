"""The doorbell protocol as the GPU engine serves it (tiers/host.py TierHost, the one implementation)
against a simulated GPU side (a thread that publishes rows, rings, waits for flagB and flag and reads the plan and
ymiss as the graph would): PCIe shares with the copy thread, bounded waits for a ring that never
comes, a stream that ends without ringing; the doorbell words; the stall hook's number and the watchdog."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from test_tier_engine_host import _expert_out, _sim

from strata_cli.tiers.doorbell import FLAG, FLAG_A, FLAG_B, RELEASED
from strata_cli.tiers.host import EngineReleased, TierHost
from strata_cli.tiers.step_plan import SRC_CPU, SRC_PCIE, SRC_VRAM
from strata_cli.errors import StrataError
from strata_cli.gpu.launch_util import GEMV_MAXT
from strata_cli.tiers import watchdog
from strata_cli.tiers.doorbell import wait_word
from strata_cli.tiers.plan import n_pcie


@pytest.mark.parametrize("cache,pcie_frac", [("0", 0.5), ("0", 1.0), ("40", 0.5), ("40", 0.4)])
def test_windows_served_with_a_pcie_share(monkeypatch, fixture_dir, cache, pcie_frac):
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, cache, pcie_frac=pcie_frac)
    T, K, JM = 3, tiers.K, tiers.JM
    host.launched(T, gpu.start)
    gpu.join(5)
    assert gpu.done.is_set() and not gpu.timed_out
    assert len(gpu.seen) == tiers.L == len(tiers.copies)
    assert all(name.startswith("sim-pcie-copy") for *_, name in tiers.copies)  # issued beside the pool
    total = {SRC_VRAM: 0, SRC_PCIE: 0, SRC_CPU: 0}
    for (layer, r0, n, src, ymiss), slot, (c_layer, _, pcie, _) in zip(gpu.seen, gpu.slots, tiers.copies):
        assert c_layer == layer
        flat = ids[layer, r0:r0 + n].reshape(-1)
        misses = [e for e in dict.fromkeys(flat.tolist()) if tiers.table_host[layer, e] < 0]
        want_pcie = misses[len(misses) - n_pcie(len(misses), pcie_frac):]
        assert pcie == want_pcie  # the last floor(misses x share) distinct misses, in routing order
        g_expert, g_count = slot[JM:2 * JM], slot[2 * JM:3 * JM]
        g_entries = slot[3 * JM:].reshape(JM, GEMV_MAXT)
        for q, e in enumerate(want_pcie):  # staging slot q holds expert e: its entries, global numbering
            assert g_expert[q] == q
            np.testing.assert_array_equal(g_entries[q, :g_count[q]], r0 * K + np.flatnonzero(flat == e))
        for i, e in enumerate(flat.tolist()):
            kind = SRC_VRAM if tiers.table_host[layer, e] >= 0 else SRC_PCIE if e in want_pcie else SRC_CPU
            assert src[i] == kind
            total[kind] += 1
            if kind == SRC_CPU:
                want = _expert_out(model, layer, e, x[layer, r0 + i // K])
                np.testing.assert_allclose(ymiss[i], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    stats = host.history[-1]
    assert (stats["vram"], stats["pcie"], stats["cpu"]) == (total[SRC_VRAM], total[SRC_PCIE], total[SRC_CPU])
    assert total[SRC_PCIE] > 0 and (total[SRC_CPU] > 0) == (pcie_frac < 1)
    assert int(tiers.words.host[FLAG_B]) == int(tiers.words.host[FLAG]) == len(gpu.seen)


def test_gpu_that_never_rings_times_out_bounded(monkeypatch, fixture_dir):
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0", timeout_s=0.2)
    # the stream stays busy (the GPU never got to its ring) until the release lets its waits pass
    monkeypatch.setattr(TierHost, "_idle", staticmethod(lambda stream, strict=False: host.released is not None))
    t0 = time.monotonic()
    host.begin(3)
    with pytest.raises(StrataError, match="layer 0 never rang within 0.2 s"):
        host.serve(3)
    assert time.monotonic() - t0 < 3.0
    assert all(int(tiers.words.host[w]) == RELEASED for w in (FLAG_A, FLAG_B, FLAG))
    with pytest.raises(EngineReleased, match="never rang"):
        host.begin(3)


def test_stream_that_ends_without_ringing(monkeypatch, fixture_dir):
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    tiers.words.host[0] = 1  # the GPU rang step 0 ...
    monkeypatch.setattr(TierHost, "_idle", staticmethod(lambda stream, strict=False: True))  # ... and its stream ended
    host.begin(3)
    tiers.words.host[0] = 1
    with pytest.raises(StrataError, match=r"layer 1 never rang \(the window's stream ended first"):
        host.serve(3)


def test_words():
    words = np.zeros(32, dtype=np.uint32)
    seq, flag = words[0:1], words[16:17]
    seq[0] = 7
    assert wait_word(seq, 7, 0.0) == 7
    t0 = time.monotonic()
    assert wait_word(flag, 1, 0.05) == 0 and 0.04 < time.monotonic() - t0 < 1.0  # bounded
    threading.Timer(0.02, lambda: flag.__setitem__(0, RELEASED)).start()
    assert wait_word(flag, 9, 2.0) == RELEASED  # a release passes every wait


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
