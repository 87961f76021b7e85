"""The eager tiered window (the engine's warm-up) without a GPU: GPUEngine._serve_tiered's launcher thread runs the
real ExpertTiers.pre / post (engine/gpu/tiers.py) while the real TierHost serves the steps and its copy thread
issues the PCIe share's copies (tests/test_tier_windows_cpu.py's stand-ins for the kernels and the driver).

Unlike a graph, an eager window's launches are queued, not run: here a thread plays the stream and runs each launch
in order from a bounded queue, and every driver call takes one lock (the driver's), held by a launch that waits for
room in a full queue, as cuLaunchKernel does when the GPU is stopped at a wait. That is the deadlock of #17 ("the
PCIe share's copies were not issued within 20 s" at layer 0 of the warm-up; 20 s per layer at full size): the
launcher runs ahead and blocks in the driver, the GPU waits for flagB, and the copy thread's cudaMemcpyAsync waits
for the driver behind the launcher. The launcher's gate (TierHost.wait_issued before each flagB wait) must prevent
it: every window equals the numpy reference's MoE and no GPU wait reaches its bound."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest
from test_tier_windows_cpu import MOE_LAUNCHES, TIER_LAUNCHES, Reference, _stream_order, _tiered

QUEUE_DEPTH = 4  # launches the simulated stream holds before a launch blocks (far below one layer's)


class _Stream:
    """The engine's stream: a context manager (GPUEngine._serve_tiered launches `with self.stream:`)."""

    ptr = 101

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _EagerGPU(threading.Thread):
    """Runs queued launches in order; enqueue() (the launcher's) blocks while the queue is full, holding the
    driver lock."""

    def __init__(self, driver: threading.Lock, rt):
        super().__init__(daemon=True)
        self.driver, self.rt = driver, rt
        self.q: queue.Queue = queue.Queue(maxsize=QUEUE_DEPTH)
        self.failed: list = []

    def enqueue(self, fn) -> None:
        with self.driver:
            self.q.put(fn)

    def run(self):
        while True:
            fn = self.q.get()
            if fn is None:
                break
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                self.failed.append(exc)


def _eager_engine(monkeypatch, fixture_dir, tier_args):
    """The tiered stand-in engine of test_tier_windows_cpu with every launch deferred to a simulated stream and the
    copy thread's driver calls under the driver lock; returns (engine, kernels, rt, reference, run(T, moes))."""
    from strata_cli.engine.gpu import window
    from strata_cli.engine.gpu.engine import GPUEngine
    from strata_cli.gpu import launch_moe, launch_tiers
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.config import TierConfig

    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    sizes = [1, 3, 5]
    windows = [tokens[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(sizes))]
    ref = Reference(model, windows, monkeypatch)
    engine, kernels, rt = _tiered(monkeypatch, model, TierConfig(**tier_args), None)
    kernels.ref = ref
    driver = threading.Lock()
    state = {"gpu": None}

    def deferred(fn):
        return lambda *a, **k: state["gpu"].enqueue(lambda: fn(*a, **k))

    for name in TIER_LAUNCHES:
        monkeypatch.setattr(launch_tiers, name, deferred(getattr(kernels, name)))
    for name in MOE_LAUNCHES:
        monkeypatch.setattr(launch_moe, name, deferred(getattr(kernels, name)))
    monkeypatch.setattr(window, "gemv_weight", deferred(kernels.gemv_weight))
    monkeypatch.setattr(window, "copy_async", deferred(kernels.copy_async))

    def locked(fn):
        def call(*a, **k):
            with driver:
                return fn(*a, **k)
        return call

    # the copy thread's driver calls (the copy stream's work lands at once: what matters is when it is issued)
    for name in ("cudaEventRecord", "cudaMemcpyAsync"):
        monkeypatch.setattr(rt, name, locked(getattr(rt, name)))
    monkeypatch.setattr(launch_tiers, "write_word", locked(lambda word, value, stream: word.__setitem__(0, value)))

    shell = GPUEngine.__new__(GPUEngine)
    shell.tier_host, shell.tiers, shell.stream = engine.tier_host, engine.tiers, _Stream()
    t = engine.tiers

    def run(T, moes):
        """One eager window through the real GPUEngine._serve_tiered; {(layer, r0): block_out rows} after each post."""
        got = {}
        groups = t.groups(T)
        order = _stream_order(monkeypatch, engine.g, T, len(groups), engine.layers)
        gpu = state["gpu"] = _EagerGPU(driver, rt)

        def record(T_, stream, profile):
            for part, layer, grp in order:
                r0, n = groups[grp]
                if part == "pre":
                    gpu.enqueue(lambda layer=layer, r0=r0, n=n: engine.buf["mixed"].__setitem__(
                        slice(r0, r0 + n), moes[layer]["x"][r0:r0 + n]))
                    t.pre(layer, grp, r0, n, len(groups), stream)
                else:
                    t.post(layer, grp, r0, n, len(groups), stream)
                    gpu.enqueue(lambda layer=layer, r0=r0, n=n: got.__setitem__(
                        (layer, r0), np.array(engine.buf["block_out"][r0:r0 + n])))
            gpu.enqueue(rt.window_done.set)  # the stream runs out after the window's last launch

        shell._record = record
        rt.window_done.clear()
        gpu.start()
        try:
            shell._serve_tiered(T, True, False)
        finally:
            gpu.q.put(None)
            gpu.join(10)
        assert not gpu.failed, gpu.failed
        return got

    return engine, kernels, rt, ref, windows, run


@pytest.mark.parametrize("tier_args", [dict(cache="0", pcie_frac=0.5), dict(cache="7", pcie_frac=1.0)],
                         ids=["pcie0.5", "pcie1"])
def test_eager_windows_with_a_pcie_share_never_wait_for_the_gpus_bound(monkeypatch, fixture_dir, tier_args):
    engine, kernels, rt, ref, windows, run = _eager_engine(monkeypatch, fixture_dir, dict(tier_args, timeout_s=3.0))
    t, host = engine.tiers, engine.tier_host
    t0 = time.monotonic()
    for w, tokens in enumerate(windows):
        ref.current = ref.by_window[w]
        got = run(len(tokens), ref.current)
        assert int(t.words.host[4]) == 0, f"window {w}: a GPU wait reached its bound"  # ERR
        for (layer, r0), rows in got.items():
            want = ref.current[layer]["out"][r0:r0 + len(rows)]
            err = np.abs(rows - want).max() / np.abs(want).max()
            assert err <= 2e-5, f"window {w} layer {layer} rows {r0}..: relative error {err:.2e}"
        assert len(got) == t.L * t.n_groups(len(tokens)) and host.history[-1]["pcie"] > 0
    assert time.monotonic() - t0 < 3.0 * len(windows)  # no step waited for the 3 s bound
    assert t.launch_gate is None  # set for the launcher's window only (a later capture must not call it)
    host.close()
    t.close()


def test_without_the_gate_the_eager_window_deadlocks_until_the_bound(monkeypatch, fixture_dir):
    """The same window with the gate taken out: the launcher blocks in the driver while the GPU waits for flagB, the
    copy thread's driver calls wait behind it, and only the GPU's bound (1 s here) ends the wait: the model of
    the failure, so the test above tests the gate and not a lucky schedule."""
    from strata_cli.errors import StrataError
    from strata_cli.tiers.host import TierHost

    monkeypatch.setattr(TierHost, "wait_issued", lambda self, ring: None)
    engine, kernels, rt, ref, windows, run = _eager_engine(monkeypatch, fixture_dir,
                                                           dict(cache="0", pcie_frac=0.5, timeout_s=1.0))
    ref.current = ref.by_window[0]
    t0 = time.monotonic()
    with pytest.raises(StrataError, match="stalled at layer 0|copies were not issued"):
        run(len(windows[0]), ref.current)
    assert time.monotonic() - t0 >= 0.9  # ended by the bound, not by the copies
    engine.tier_host.close()
    engine.tiers.close()


def test_the_gate_opens_for_a_failing_window_and_is_bounded(monkeypatch, fixture_dir):
    """TierHost.wait_issued: returns once the step's copies were issued, at once when the window fails or was
    released, and raises after the tiers' bound naming what the copy thread was doing."""
    from strata_cli.errors import StrataError

    engine, kernels, rt, ref, windows, run = _eager_engine(monkeypatch, fixture_dir,
                                                           dict(cache="0", pcie_frac=0.5, timeout_s=0.3))
    host = engine.tier_host
    host.begin(1)
    with pytest.raises(StrataError, match=r"waited 0.3 s for step 1's PCIe copies.*the copy thread: idle"):
        host.wait_issued(1)
    opener = threading.Timer(0.05, host._open_gate)
    opener.start()
    t0 = time.monotonic()
    host.wait_issued(5)  # the window fails: the launcher goes on (its waits pass on the released flags)
    assert time.monotonic() - t0 < 0.25
    host.begin(1)  # a new window closes the gate again
    with host._issued_cv:
        host._issued = 2
    host.wait_issued(2)
    host.release(100, reason="test")
    host.wait_issued(3)  # released: open
    host.active = False
    host.close()
    engine.tiers.close()
