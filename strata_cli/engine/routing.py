"""Router picks of a real run: an engine over a token sequence, every row committed, counting which (layer, expert)
pairs the router chose (the input of `strata make-profile` and of held-out hit rates).

device "cpu": the numpy reference engine's route hook. device "gpu": the GPU engine with `--expert-cache` `cache`
(default auto: every expert in VRAM when they fit, else what fits, tiers/residency.choose_residency) and no PCIe
share. The counts do not depend on where the experts live:
  * every expert resident: the engine keeps its doorbell-free graph; a RouteTap set before the first capture makes
    each layer's MoE copy its routed ids into one device buffer (engine/gpu/window._moe), read after the window;
  * some experts on the host: every (layer, token group) of every window rings the host with its routed ids
    (tiers/host.py route_hook), whatever share of them VRAM serves.
(At full size, 48 x 512 experts, on the H200 at 02f665e: cache 0 costs ~36-49 ms a window at T = 1 on the CPU
pool, all resident ~9.4.)"""

from __future__ import annotations

from typing import Callable

import numpy as np

COUNTING_CACHE = "auto"  # make-profile --expert-cache's default


def counting_tiers(cache: str = COUNTING_CACHE):
    """The TierConfig of a GPU counting run: --expert-cache `cache` (all | auto | N | SIZE; a bad value is one
    OptionError), no PCIe share (the CPU pool serves what VRAM does not hold)."""
    from ..tiers.config import TierConfig

    return TierConfig(cache=cache, pcie_frac=0.0, counting=True)


class RouteTap:
    """The routed ids of every layer of the last window of an all-resident GPU engine: a device buffer [L, M * W]
    that the window copies layer l's ids [T, W] into (rows(l, shape) gives the destination; W = K, or K + 1 where
    the shared expert rides along as the last slot, engine/gpu/window._moe), read on the host by picks(T).
    Set as engine.route_tap before the engine captures any window graph: the graphs captured with it are the
    counting run's (one copy node a layer); verify-bench's engines never have one."""

    def __init__(self, n_layers: int, max_t: int, k: int, zeros=None):
        if zeros is None:
            from ..gpu.runtime import cupy

            zeros = cupy().zeros
        self.K = k
        self.ids = zeros((n_layers, max_t * (k + 1)), dtype=np.int32)
        self.width = [0] * n_layers  # W of each layer, set when a window is recorded (the same for every T)

    def rows(self, layer: int, shape: tuple[int, int]):
        """The device view [T, W] layer's ids are copied to (called while a window is recorded)."""
        T, W = (int(v) for v in shape)
        if W not in (self.K, self.K + 1):
            raise ValueError(f"layer {layer}: routed ids of width {W}, expected {self.K} or {self.K + 1}")
        self.width[layer] = W
        return self.ids[layer, :T * W].reshape(T, W)

    def picks(self, T: int, host=None) -> list[tuple[int, np.ndarray]]:
        """(layer, ids [T, K]) of every layer the last window recorded, in layer order. host: the buffer already on
        the host (default: copied now, after the window's stream finished)."""
        if host is None:
            from ..gpu.runtime import cupy

            host = cupy().asnumpy(self.ids)
        return [(layer, host[layer, :T * W].reshape(T, W)[:, :self.K]) for layer, W in enumerate(self.width) if W]


def _routing_engine(model, device: str, n_ctx: int | None, hook, cache: str):
    """(engine, tap): tap is the RouteTap of an all-resident GPU engine, else None (the hook is set instead)."""
    if device == "gpu":
        from . import make_engine

        engine = make_engine(model, "gpu", n_ctx, tiers=counting_tiers(cache))
        if engine.tiers is not None:
            engine.tier_host.route_hook = hook  # after the engine's own warm-up window
            return engine, None
        assert not engine.graphs, "a route tap is set before the first capture"
        try:
            engine.route_tap = RouteTap(model.geometry.n_layers, engine.max_t, model.geometry.n_expert_used)
        except BaseException:
            engine.close()
            raise
        return engine, engine.route_tap
    from ..engine.reference import ReferenceEngine

    engine = ReferenceEngine(model, n_ctx=n_ctx)
    engine.route_hook = hook
    return engine, None


def count_routing(model, tokens: np.ndarray, window: int = 8, n_ctx: int | None = None,
                  progress: Callable[[int], None] | None = None, device: str = "cpu", trace=None,
                  cache: str = COUNTING_CACHE) -> np.ndarray:
    """int64 [L, E]: how often the router picked each pair over `tokens` (each token routed once per layer).
    Sequences longer than the context restart from an empty context. trace: a tiers/trace.TraceRecorder that also
    gets every pick, window by window (make-profile --trace). cache: the GPU engine's --expert-cache (the numpy
    engine holds every expert)."""
    from ..errors import NonFiniteError
    from .contract import window_nonfinite

    g = model.geometry
    counts = np.zeros((g.n_layers, g.n_expert), dtype=np.int64)

    def hook(layer: int, ids: np.ndarray) -> None:
        counts[layer] += np.bincount(ids.reshape(-1), minlength=g.n_expert)
        if trace is not None:
            trace.pick(layer, ids)

    engine, tap = _routing_engine(model, device, n_ctx, hook, cache)
    with engine:
        window = min(window, engine.max_t or window)
        done = n_windows = 0
        while done < len(tokens):
            if engine.n_past >= engine.n_ctx:
                engine.reset()
            n = min(window, len(tokens) - done, engine.n_ctx - engine.n_past)
            if trace is not None:
                trace.window(n_windows, done)
            n_windows += 1
            bad = window_nonfinite(engine.run(tokens[done:done + n]))
            if bad:  # the router's picks over NaN scores mean nothing: no profile is counted from them
                raise NonFiniteError(f"{model.path}: non-finite values (NaN/Inf) in the window at tokens {done}.."
                                     f"{done + n - 1}, first in {bad}: no profile written")
            if tap is not None:
                for layer, ids in tap.picks(n):
                    hook(layer, ids)
            engine.commit(n)
            done += n
            if progress is not None:
                progress(done)
    return counts
