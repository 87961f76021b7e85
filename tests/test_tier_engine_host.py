"""Host side of the GPU engine's expert tiers, without a GPU: the step plan and its mapped words, cache specs,
the residency table and the default ranking."""

from __future__ import annotations

import threading
import time


import numpy as np
import pytest
from strata_cli.engine.gpu.tiers import ExpertTiers
from strata_cli.gpu.launch_util import GEMV_MAXT
from strata_cli.tiers.config import TierConfig
from strata_cli.tiers.doorbell import FLAG, FLAG_A, FLAG_B, N_WORDS, RELEASED, SEQ, StepRange
from strata_cli.tiers.host import EngineReleased, TierHost
from strata_cli.tiers.step_plan import SRC_CPU, SRC_PCIE, SRC_VRAM, plan_step, write_plan
from strata_cli.tiers.residency import choose_residency, expert_bytes, ranked_pairs, residency_table


def _entries(part):
    """{expert: (group rows, group entries)} of an ExpertEntries."""
    return {int(e): tuple(v.tolist() for v in part.entries(i)) for i, e in enumerate(part.experts)}


def test_plan_step_splits_misses_in_routing_order():
    resident = np.array([0, -1, 1, -1, -1, -1, 2, -1], dtype=np.int32)
    ids = np.array([[1, 0], [3, 5], [3, 7], [1, 4]], dtype=np.int32)  # rows of K=2
    flat = ids.reshape(-1)
    for frac, want_pcie in [(0.0, []), (0.5, [7, 4]), (1.0, [1, 3, 5, 7, 4])]:
        plan = plan_step(ids, resident, frac)
        assert plan.pcie.experts.tolist() == want_pcie
        # distinct misses, first-seen order
        assert plan.cpu.experts.tolist() == [e for e in (1, 3, 5, 7, 4) if e not in want_pcie]
        want = np.array([SRC_VRAM if resident[e] >= 0 else SRC_PCIE if e in want_pcie else SRC_CPU for e in flat])
        np.testing.assert_array_equal(plan.src, want)
        both = {**_entries(plan.cpu), **_entries(plan.pcie)}
        assert both[1] == ([0, 3], [0, 6]) and both[3] == ([1, 2], [2, 4])


def test_plan_step_floor_of_the_pcie_share():
    resident = np.full(10, -1, dtype=np.int32)
    plan = plan_step(np.arange(7, dtype=np.int32)[:, None], resident, 0.3)  # floor(7 * 0.3) = 2: the last two
    assert plan.pcie.experts.tolist() == [5, 6] and plan.cpu.experts.tolist() == [0, 1, 2, 3, 4]


def test_write_plan_words():
    JM, j0 = 12, 4
    slot = np.full(JM * (3 + GEMV_MAXT), -7, dtype=np.int32)
    resident = np.array([-1, 0, -1, -1], dtype=np.int32)
    ids = np.array([[0, 2], [1, 3], [2, 0]], dtype=np.int32)  # global entries 4..9
    plan = plan_step(ids, resident, 1.0)
    write_plan(slot, plan, j0, JM)
    np.testing.assert_array_equal(slot[j0:j0 + 6], [SRC_PCIE, SRC_PCIE, SRC_VRAM, SRC_PCIE, SRC_PCIE, SRC_PCIE])
    assert (slot[:j0] == -7).all() and (slot[j0 + 6:JM] == -7).all()  # other groups' entries untouched
    g_expert, g_count = slot[JM:2 * JM], slot[2 * JM:3 * JM]
    g_entries = slot[3 * JM:].reshape(JM, GEMV_MAXT)
    assert plan.pcie.experts.tolist() == [0, 2, 3]
    np.testing.assert_array_equal(g_expert[:3], [0, 1, 2])  # staging slot = position in the PCIe list
    np.testing.assert_array_equal(g_count[:6], [2, 2, 1, 0, 0, 0])
    np.testing.assert_array_equal(g_entries[0, :2], [4, 9])
    np.testing.assert_array_equal(g_entries[1, :2], [5, 8])
    np.testing.assert_array_equal(g_entries[2, :1], [7])


class _Info:
    def __init__(self, n_bytes):
        self.n_bytes = n_bytes


class _Geometry:
    n_layers, n_expert = 3, 4


class _Model:
    geometry = _Geometry()

    def info(self, name):
        return _Info(4 * 100)  # 100 bytes per expert and projection


def test_ranking_residency_and_sizes():
    model = _Model()
    ranked = ranked_pairs(model, None)
    assert ranked.shape == (12, 2)
    np.testing.assert_array_equal(ranked[:4], [[0, 0], [1, 0], [2, 0], [0, 1]])  # layers share the cache evenly
    table = residency_table(model, ranked, 5)
    np.testing.assert_array_equal(table, [[0, 1, -1, -1], [0, 1, -1, -1], [0, -1, -1, -1]])
    for cache, n in [("0", 0), ("5", 5), ("all", 12), ("1500B", 5), ("100000", 12)]:  # 300 bytes per pair
        table, note = choose_residency(model, TierConfig(cache=cache), None, 0)
        assert int((table >= 0).sum()) == n, cache
        assert f"{n} of 12" in note
    table, _ = choose_residency(model, TierConfig(cache="auto"), (1 << 30) + 2000, 500)
    assert int((table >= 0).sum()) == 5  # (2000 - 500) // 300


# ---- the host's per-step loop (tiers/host.py TierHost) against a simulated GPU side over the same words


class _Mapped:
    """Stands in for a MappedBuffer: the host view only (the simulated GPU shares it)."""

    def __init__(self, shape, dtype):
        self.host = np.zeros(shape, dtype=dtype)


class _SimTiers:
    """The fields of ExpertTiers that TierHost reads, on plain host memory."""

    groups = ExpertTiers.groups
    n_groups = ExpertTiers.n_groups

    def __init__(self, model, table, cfg, max_t):
        g = model.geometry
        self.model, self.table_host, self.cfg = model, table, cfg
        self.K, self.D, self.E, self.L, self.M = g.n_expert_used, g.n_embd, g.n_expert, g.n_layers, max_t
        self.JM = max_t * self.K
        self.G = 1
        self.pcie, self.copy_stream, self.fill = cfg.pcie_frac > 0, None, None
        self.expert_bytes = expert_bytes(model)[:, None].repeat(3, axis=1) // 3
        self.pub_x = _Mapped((max_t, self.D), np.float32)
        self.pub_ids = _Mapped((max_t, self.K), np.int32)
        self.words = _Mapped((N_WORDS,), np.uint32)
        self.ymiss = _Mapped((self.JM, self.D), np.float32)
        self.plan = _Mapped((2, self.JM * (3 + GEMV_MAXT)), np.int32)
        self.wait_ns = _Mapped((self.L * 2, 2), np.uint64)
        self.steps = StepRange(0, self.L)
        self.ring = self.steps.ring


def _gpu_order(L: int) -> list[tuple[str, int, int]]:
    """The window's (pre | post, layer, group) in stream order: window.py's pre/post per layer (one group)."""
    return [(part, layer, 0) for layer in range(L) for part in ("pre", "post")]


class _SimGPU(threading.Thread):
    """The window's stream in the engine's order (_gpu_order): pre publishes the group's rows and rings seq =
    ring(layer, grp); post waits (bounded, like the spin kernel) for flag >= that ring and keeps what the host left
    in the plan and ymiss."""

    def __init__(self, tiers, x, ids, T, bound_s=5.0):
        super().__init__(daemon=True)
        self.t, self.x, self.ids, self.T, self.bound_s = tiers, x, ids, T, bound_s
        self.seen, self.timed_out, self.slots = [], [], []
        self.done = threading.Event()

    def run(self):
        t, w = self.t, self.t.words.host
        groups = t.groups(self.T)
        G = len(groups)
        for part, layer, grp in _gpu_order(t.L):
            r0, n = groups[grp]
            ring = t.ring(layer, grp, G)
            if part == "pre":
                t.pub_x.host[r0:r0 + n] = self.x[layer, r0:r0 + n]
                t.pub_ids.host[r0:r0 + n] = self.ids[layer, r0:r0 + n]
                w[SEQ] = ring
                continue
            for word in ((FLAG_B, FLAG) if t.pcie else (FLAG,)):  # the graph: [flagB, PCIe experts], flag
                start = time.monotonic()
                while w[word] < ring and time.monotonic() - start < self.bound_s:
                    time.sleep(1e-4)
                if w[word] < ring:
                    self.timed_out.append(ring - 1)
            j0, J = r0 * t.K, n * t.K
            self.seen.append((layer, r0, n, t.plan.host[grp, j0:j0 + J].copy(), t.ymiss.host[j0:j0 + J].copy()))
            self.slots.append(t.plan.host[grp].copy())
        self.done.set()


def _sim(monkeypatch, fixture_dir, cache, stall=0, T=3, seed=0, pcie_frac=0.0, timeout_s=20.0):
    """A TierHost over host memory, and a simulated GPU side. With a PCIe share the copy thread is a plain one and
    the copy stream is played by a timer that raises flagB a moment after the host issued the step's copies."""
    from concurrent.futures import ThreadPoolExecutor

    from strata_cli.model.gguf_file import open_model

    model = open_model(fixture_dir / "model-q8_0.gguf")
    g = model.geometry
    table, _ = choose_residency(model, TierConfig(cache=cache), None, 0)
    cfg = TierConfig(cache=cache, pcie_frac=pcie_frac, timeout_s=timeout_s)
    tiers = _SimTiers(model, table, cfg, max_t=4)
    tiers.copies = []

    def copy_pcie(self, layer, grp, experts, want):
        tiers.copies.append((layer, grp, [int(e) for e in experts], threading.current_thread().name))
        threading.Timer(0.002, lambda: tiers.words.host.__setitem__(FLAG_B, max(int(tiers.words.host[FLAG_B]),
                                                                                 want))).start()

    monkeypatch.setattr(TierHost, "_make_copier", staticmethod(lambda: ThreadPoolExecutor(1, "sim-pcie-copy")))
    monkeypatch.setattr(TierHost, "_copy_pcie", copy_pcie)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.n_layers, T, g.n_embd)).astype(np.float32)
    ids = np.stack([[rng.permutation(g.n_expert)[:g.n_expert_used] for _ in range(T)]
                    for _ in range(g.n_layers)]).astype(np.int32)
    gpu = _SimGPU(tiers, x, ids, T)
    monkeypatch.setattr(TierHost, "_idle", staticmethod(lambda stream, strict=False: gpu.done.is_set()))
    engine = type("SimEngine", (), {"stream": object()})()
    host = TierHost(tiers, engine, stall=stall)
    return model, tiers, host, gpu, x, ids


def _expert_out(model, layer, e, x):
    from strata_cli.ops.gemv import dequant_rows
    from strata_cli.ops.moe import swiglu

    infos = [model.info(f"blk.{layer}.ffn_{p}_exps.weight") for p in ("gate", "up", "down")]
    wg = dequant_rows(infos[0].raw[e], infos[0].ggml_type, x.shape[-1])
    wu = dequant_rows(infos[1].raw[e], infos[1].ggml_type, x.shape[-1])
    wd = dequant_rows(infos[2].raw[e], infos[2].ggml_type, wg.shape[0])
    return swiglu(x[None], wg, wu, wd)[0]


@pytest.mark.parametrize("cache", ["0", "40"])
def test_host_serves_every_step_of_a_simulated_window(monkeypatch, fixture_dir, cache):
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, cache)
    T, K = 3, tiers.K
    host.begin(T)
    gpu.start()
    host.serve(T)
    gpu.join(5)
    assert gpu.done.is_set() and not gpu.timed_out
    assert len(gpu.seen) == tiers.L
    cpu_entries = 0
    for layer, r0, n, src, ymiss in gpu.seen:
        for i in range(n * K):
            row, e = r0 + i // K, int(ids[layer, r0 + i // K, i % K])
            resident = tiers.table_host[layer, e] >= 0
            assert src[i] == (SRC_VRAM if resident else SRC_CPU)
            if not resident:
                cpu_entries += 1
                want = _expert_out(model, layer, e, x[layer, row])
                np.testing.assert_allclose(ymiss[i], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert cpu_entries > 0
    stats = host.history[-1]
    assert stats["cpu"] == cpu_entries and stats["vram"] + stats["cpu"] == tiers.L * T * K
    assert int(tiers.words.host[FLAG]) == len(gpu.seen)


def test_route_hook_sees_every_routed_id_once(monkeypatch, fixture_dir):
    """make-profile --device gpu counts what the host is rung with: every row's ids of every layer, once."""
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    counts = np.zeros((tiers.L, tiers.E), np.int64)
    host.route_hook = lambda layer, got: np.add.at(counts[layer], got.reshape(-1), 1)
    host.begin(3)
    gpu.start()
    host.serve(3)
    want = np.stack([np.bincount(ids[layer].reshape(-1), minlength=tiers.E) for layer in range(tiers.L)])
    np.testing.assert_array_equal(counts, want)


def test_stalled_window_released_by_the_watchdog(monkeypatch, fixture_dir):
    from strata_cli.tiers.watchdog import Watchdog

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0", stall=1)
    host.after_warm_up()  # as the engine does after its warm-up window
    dog = Watchdog(0.2).start()
    host.begin(3)
    gpu.start()
    with pytest.raises(EngineReleased):
        host.serve(3)
    dog.stop()
    assert dog.fired.wait(5) and gpu.done.wait(5)
    assert not gpu.timed_out  # the release (0xFFFFFFFF) passed the withheld wait, not the bound
    assert dog.lines[0].startswith(f"window 1 stalled at layer {tiers.L - 1}; GPU waits released; streams idle after")
    assert all(int(tiers.words.host[w]) == RELEASED for w in (FLAG_A, FLAG_B, FLAG))
    with pytest.raises(EngineReleased, match="#267"):
        host.begin(3)


@pytest.mark.parametrize("path", ["python", "native"])
def test_interrupt_during_a_window_releases(monkeypatch, fixture_dir, path):
    """Ctrl-C in the middle of a window: in the Python steps (the second step's pool call raises), or in the native
    loop (tiers/serve_loop.py: Python raises a signal's exception when the C call returns; here after 2 steps)."""
    from strata_cli.tiers.host import ExpertSource
    from strata_cli.tiers.serve_loop import NativeServe

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    calls = []
    if path == "python":
        def interrupted(self, *args):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return original(self, *args)

        original = ExpertSource.compute_into
        monkeypatch.setattr(NativeServe, "usable", staticmethod(lambda host: False))
        monkeypatch.setattr(ExpertSource, "compute_into", interrupted)
    else:
        assert NativeServe.usable(host)

        def interrupted_loop(self, k, max_wait_ns):
            n = self.args.n_steps
            self.args.n_steps = 2
            try:
                got = k
                while got < 2:  # a ring the simulated GPU is late with ends a call too
                    got = original_run(self, got, max_wait_ns)
            finally:
                self.args.n_steps = n
            calls.append(got)
            raise KeyboardInterrupt

        original_run = NativeServe.run
        monkeypatch.setattr(NativeServe, "run", interrupted_loop)
    host.begin(3)
    gpu.start()
    with pytest.raises(KeyboardInterrupt):
        host.serve(3)
    assert gpu.done.wait(5) and not gpu.timed_out  # every later GPU wait passed on the released flags
    assert int(tiers.words.host[FLAG]) == RELEASED
    with pytest.raises(EngineReleased, match="KeyboardInterrupt"):
        host.begin(3)
    assert calls == ([1, 1] if path == "python" else [2])


def test_verify_bench_tier_columns_average_the_timed_windows():
    from strata_cli.tiers.stats import TIER_COLUMNS, add_tier_stats
    from strata_cli.report.records import BenchRecord

    def window(T, cpu, pool_ms):
        return {"T": T, "vram": 10 - cpu, "pcie": 0, "cpu": cpu, "vram_share": (10 - cpu) / 10, "pcie_share": 0.0,
                "cpu_share": cpu / 10, "wait_b_ms": 0.0, "wait_flag_ms": 0.5, "host_wait_ms": 0.1,
                "pool_ms": pool_ms, "pcie_bytes": 0, "cpu_bytes": cpu * 1e6}

    history = [window(4, 9, 9.0), window(1, 2, 1.0), window(4, 4, 2.0), window(4, 6, 4.0)]  # 1st T=4: warm-up
    cfg = TierConfig(cache="3")
    tiers = type("T", (), {"table_host": np.array([[0, -1], [1, -1]]), "cfg": cfg,
                           "stage_table": lambda self: self.table_host})()
    engine = type("E", (), {"tiers": tiers, "tier_host": type("H", (), {"history": history})()})()
    records = [BenchRecord(window=4, samples_ms=[1.0], host_samples_ms=[1.0], kept=[1], expected_tokens=1.0),
               BenchRecord(window=1, samples_ms=[1.0], host_samples_ms=[1.0], kept=[1], expected_tokens=1.0)]
    add_tier_stats(records, engine, n_windows=2)
    row = records[0].flat()
    assert row["cpu_share"] == 0.5 and row["pool_ms"] == 3.0 and row["vram_pairs"] == 0.5
    assert abs(row["pool_gb_s"] - 5e6 / 1e9 / 3e-3) < 1e-9 and row["expert_cache"] == "3"
    assert records[1].flat()["cpu_share"] == 0.2
    assert all(key in row for key, _, _ in TIER_COLUMNS)


def test_tier_breakdown_gpu_time_copy_rate_and_tier_floor():
    from strata_cli.tiers.stats import add_tier_stats, tier_floor_ms
    from strata_cli.report.records import BenchRecord

    from strata_cli.tiers.share import ShareRates

    # 10 MB at 10 GB/s of pool and 51 MB at 51 GB/s of copies overlap: 1 ms over the all-resident 2 ms
    assert tier_floor_ms(2.0, 10e6, 51e6, ShareRates(10.0, 51.0)) == pytest.approx(3.0)
    assert tier_floor_ms(2.0, 30e6, 51e6, ShareRates(10.0, 51.0)) == pytest.approx(5.0)
    assert tier_floor_ms(2.0, 10e6, 102e6, ShareRates(10.0, 51.0)) == pytest.approx(4.0)  # the DMA's 2 ms
    assert tier_floor_ms(None, 1.0, 1.0) is None
    history = [{"T": 2, "vram": 0, "pcie": 4, "cpu": 4, "vram_share": 0.0, "pcie_share": 0.5, "cpu_share": 0.5,
                "wait_b_ms": 1.5, "wait_flag_ms": 2.5, "host_wait_ms": 0.1, "pool_ms": 4.0, "pcie_bytes": 8e6,
                "cpu_bytes": 8e6, "issue_ms": 0.5, "copy_ms": 0.25}]
    tiers = type("T", (), {"table_host": np.array([[-1, -1]]), "cfg": TierConfig(cache="0", pcie_frac=0.5),
                           "stage_table": lambda self: self.table_host})()
    engine = type("E", (), {"tiers": tiers, "tier_host": type("H", (), {"history": history})()})()
    rec = BenchRecord(window=2, samples_ms=[10.0], host_samples_ms=[10.0], kept=[1], expected_tokens=1.0,
                      read_bytes=int(1e9), copy_bytes_per_s=1e12)
    add_tier_stats([rec], engine, n_windows=1)
    row = rec.flat()
    assert row["gpu_ms"] == pytest.approx(6.0) and row["copy_gb_s"] == pytest.approx(32.0)
    assert row["host_gb_s"] == pytest.approx(16e6 / 1e9 / 4e-3)  # both shares' bytes over the longer path (pool)
    assert row["issue_ms"] == 0.5 and row["tier_floor_ms"] == pytest.approx(1.0 + tier_floor_ms(0.0, 8e6, 8e6))


@pytest.mark.parametrize("command", [["logprobs", "--random", "5"], ["verify-bench", "--window", "1", "-r", "1"]])
def test_tier_options_check_the_cache_spec_on_any_device(fixture_dir, command):
    from click.testing import CliRunner

    from strata_cli.cli import main

    model = str(fixture_dir / "model-q8_0.gguf")
    result = CliRunner().invoke(main, [command[0], model, *command[1:], "--device", "cpu", "--expert-cache",
                                       "0,12parsecs"])
    assert result.exit_code == 2  # a bad option value: usage error
    assert "--expert-cache" in result.output and "12parsecs" in result.output
    ok = CliRunner().invoke(main, [command[0], model, *command[1:], "--device", "cpu", "--expert-cache", "0"])
    assert ok.exit_code == 0, ok.output
    assert "GPU engine only" in ok.output


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_release_during_a_step_is_never_undone_by_the_host(monkeypatch, fixture_dir, path):
    """The watchdog may fire while the host computes a step: the host must not lower the released flags after (the
    native loop raises its flags by a compare-and-swap maximum and stops at a released flag)."""
    from strata_cli.tiers.host import ExpertSource
    from strata_cli.tiers.serve_loop import NativeServe

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    if path == "python":
        original = ExpertSource.compute_into

        def released_midway(self, *args):
            original(self, *args)
            host.release(2000, reason="watchdog (simulated)")

        monkeypatch.setattr(NativeServe, "usable", staticmethod(lambda host: False))
        monkeypatch.setattr(ExpertSource, "compute_into", released_midway)
    else:
        original_run = NativeServe.run

        def released_after_a_step(self, k, max_wait_ns):
            if k == 0:
                self.args.n_steps = 1
                try:
                    while k < 1:
                        k = original_run(self, k, max_wait_ns)
                finally:
                    self.args.n_steps = tiers.L
                host.release(2000, reason="watchdog (simulated)")
            return original_run(self, k, max_wait_ns)

        monkeypatch.setattr(NativeServe, "run", released_after_a_step)
    host.begin(3)
    gpu.start()
    with pytest.raises(EngineReleased, match="watchdog"):
        host.serve(3)
    assert gpu.done.wait(5) and not gpu.timed_out
    assert all(int(tiers.words.host[w]) == RELEASED for w in (FLAG_A, FLAG_B, FLAG))


def test_gpu_order_rings_one_step_per_layer():
    assert _gpu_order(2) == [("pre", 0, 0), ("post", 0, 0), ("pre", 1, 0), ("post", 1, 0)]
    assert [StepRange(0, 2).ring(layer, grp, 1) for _, layer, grp in _gpu_order(2)] == [1, 1, 2, 2]
    # a stage of the layer split over layers 3, 4 rings the same numbers, its steps map back to its layers
    steps = StepRange(3, 5)
    assert [steps.ring(layer + 3, grp, 1) for _, layer, grp in _gpu_order(2)] == [1, 1, 2, 2]
    assert [steps.at(k, 1) for k in range(steps.count(1))] == [(3, 0), (4, 0)] and list(steps.layers) == [3, 4]


def test_watchdog_waits_while_an_eager_window_is_still_launched(monkeypatch, fixture_dir):
    """The eager launcher compiles and loads kernels (minutes on a cold cache, seconds per module): that is no
    stall. The watchdog's clock restarts when the launcher is done."""
    from strata_cli.tiers.watchdog import Watchdog

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    dog = Watchdog(0.05)
    host.launching = True
    host.begin(3)
    host.progress -= 10.0
    assert not host.busy and host not in dog.stalled()
    host.launch_done()
    assert host.busy and host not in dog.stalled()
    host.progress -= 10.0
    assert host in dog.stalled()
    host.active = False


def test_a_failed_launch_leaves_the_host_idle_and_unreleased(monkeypatch, fixture_dir):
    """A graph whose launch (or capture) fails put no window on the GPU: no watchdog release 60 s later of a window
    that never ran (it would release every live verifier of the process)."""
    from strata_cli.tiers.watchdog import Watchdog

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    host.step_layer = 5

    def failing():
        assert host.step_layer == -1  # begin(): the stall line names this window's layer
        raise RuntimeError("capture invalidated")

    with pytest.raises(RuntimeError, match="capture"):
        host.launched(3, failing)
    host.progress -= 100.0
    assert not host.busy and host not in Watchdog(0.05).stalled() and host.released is None
    host.launched(3, gpu.start)  # the next window runs
    assert gpu.done.wait(5) and not gpu.timed_out and host.history


@pytest.mark.parametrize("where", ["launch", "before serve"])
def test_a_signal_at_the_launch_releases_the_window(monkeypatch, fixture_dir, where):
    """Python raises a signal's exception (Ctrl-C; SIGTERM as sysio/signals.Terminated) once the C call that was
    running returns: right after the graph launch put the window on the GPU, or at serve()'s first instruction. The
    window is released (every GPU wait passes at once), not left spinning to its bound for a host that has gone."""
    import signal

    from strata_cli.sysio.signals import Terminated

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    gpu.bound_s = 2.0

    def launch_then_signal():
        gpu.start()  # the window is on the GPU
        raise Terminated(signal.SIGTERM)

    def signal_at_serve(self, T):
        raise Terminated(signal.SIGTERM)

    if where == "before serve":
        monkeypatch.setattr(TierHost, "serve", signal_at_serve)
    with pytest.raises(Terminated):
        host.launched(3, launch_then_signal if where == "launch" else gpu.start)
    assert host.released is not None and "Terminated: SIGTERM" in host.released
    assert gpu.done.wait(5) and not gpu.timed_out  # no wait ran to its bound
    assert not host.busy
    with pytest.raises(EngineReleased):
        host.launched(3, gpu.start)


def test_cuda_kernels_load_eagerly():
    """A lazily loaded kernel may wait for a running tier spin-wait (see gpu/runtime.eager_module_loading)."""
    import os

    from strata_cli.gpu.runtime import MODULE_LOADING_ENV, eager_module_loading

    assert os.environ[MODULE_LOADING_ENV] == "EAGER"
    env = {MODULE_LOADING_ENV: "LAZY"}
    eager_module_loading(env)
    assert env == {MODULE_LOADING_ENV: "EAGER"}
    env = {}
    eager_module_loading(env)
    assert env == {MODULE_LOADING_ENV: "EAGER"}


def test_a_tiered_window_is_served_with_device_frees_deferred(monkeypatch):
    """A finalizer's cudaFreeHost (cyclic GC on the serving or launching thread) synchronises the device, which
    waits for the host's flags: the tiered window runs under runtime.capture_guard (GC paused, frees deferred)."""
    import gc

    from strata_cli.engine.gpu.engine import GPUEngine
    from strata_cli.gpu import runtime

    freed, seen = [], []
    engine = GPUEngine.__new__(GPUEngine)
    engine._commit_pending = False  # no commit in flight (the tiered launch waits for one first)

    def serve(self, T, eager, profile):
        runtime.free_later_if_capturing(freed.append, "mapped buffer")
        seen.append((T, eager, gc.isenabled(), list(freed)))

    monkeypatch.setattr(GPUEngine, "_serve_tiered", serve)
    was = gc.isenabled()
    engine._launch_tiered(3, True)
    assert seen == [(3, True, False, [])] and freed == ["mapped buffer"] and gc.isenabled() == was


def test_close_stops_the_host_and_leaves_the_watchdog(monkeypatch, fixture_dir):
    """TierHost.close() (every tiered engine's close(), e.g. the end of `with engine:`) runs on the CPU too: its
    lazy import once climbed out of the package and failed every tiered GPU test at its first close()."""
    from strata_cli.tiers import watchdog

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    host.launched(3, gpu.start)
    assert host in watchdog.live_verifiers()
    host.close()
    assert host not in watchdog.live_verifiers() and host._events == []


def test_the_warm_up_window_never_stalls(monkeypatch, fixture_dir):
    """stall-test --stall-window 1: the engine's own warm-up window (served before after_warm_up) is not window 1,
    so it is served to the end (else the engine's construction waited for the GPU's bound and failed); the user's
    first window then withholds its last flag."""
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0", stall=1, timeout_s=5.0)
    host.launched(3, gpu.start)  # the warm-up
    assert gpu.done.wait(5) and not gpu.timed_out and int(tiers.words.host[FLAG]) == tiers.L
    host.after_warm_up()
    second = _SimGPU(tiers, x, ids, 3, bound_s=0.3)
    monkeypatch.setattr(TierHost, "_idle", staticmethod(lambda stream, strict=False: second.done.is_set()))
    host.launched(3, second.start)
    assert second.done.wait(5) and second.timed_out == [tiers.L - 1]  # the last step's flag was withheld


def test_a_ring_awaited_while_an_eager_window_is_launched_says_what_it_waits_for(monkeypatch, fixture_dir, capsys):
    """That wait has no bound (a cold kernel cache compiles for minutes), so every LAUNCH_NOTE_S it prints one line
    naming the layer and what the copy thread is doing: a stuck warm-up is never silent."""
    from strata_cli.tiers import host as host_mod

    monkeypatch.setattr(host_mod, "LAUNCH_NOTE_S", 0.05)
    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    host.launching = True

    def late_start():
        threading.Timer(0.3, gpu.start).start()
        threading.Timer(0.35, host.launch_done).start()

    host.launched(3, late_start)
    assert gpu.done.wait(5) and not gpu.timed_out
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tiers: waiting")]
    assert lines and "for layer 0's ring: the eager window is still being launched" in lines[0]
    assert lines[0].endswith("(kernels compiling or loading)")  # no PCIe share: no copy thread to name


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_routed_id_out_of_range_fails_the_window_in_one_line(monkeypatch, fixture_dir, path):
    """A GPU side that publishes an expert id >= E (a corrupt router output) ends the window with a ValueError
    naming the layer, on either serving path, and releases it (no GPU wait is left behind)."""
    from strata_cli.tiers.serve_loop import NativeServe

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "0")
    if path == "python":
        monkeypatch.setattr(NativeServe, "usable", staticmethod(lambda host: False))
    else:
        assert NativeServe.usable(host)
    ids[2, 1, 0] = tiers.E + 3
    host.begin(3)
    gpu.start()
    with pytest.raises(ValueError, match=r"outside 0\.\." if path == "python" else r"layer 2: a routed expert id"):
        host.serve(3)
    assert gpu.done.wait(5) and not gpu.timed_out
    assert int(tiers.words.host[FLAG]) == RELEASED
