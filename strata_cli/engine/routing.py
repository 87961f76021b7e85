"""Router picks of a real run: an engine over a token sequence, every row committed, counting which (layer, expert)
pairs the router chose (the input of `strata make-profile` and of held-out hit rates).

device "cpu": the numpy reference engine's route hook. device "gpu": the GPU engine with no routed expert in VRAM
(--expert-cache 0, no PCIe share), so every (layer, token group) of every window rings the host with its routed ids
(tiers/host.py route_hook): the same counts, from the engine that will use the profile, far faster."""

from __future__ import annotations

from typing import Callable

import numpy as np


def _routing_engine(model, device: str, n_ctx: int | None, hook):
    if device == "gpu":
        from ..tiers.config import TierConfig
        from . import make_engine

        engine = make_engine(model, "gpu", n_ctx, tiers=TierConfig(cache="0", pcie_frac=0.0))
        engine.tier_host.route_hook = hook  # after the engine's own warm-up window
        return engine
    from ..engine.reference import ReferenceEngine

    engine = ReferenceEngine(model, n_ctx=n_ctx)
    engine.route_hook = hook
    return engine


def count_routing(model, tokens: np.ndarray, window: int = 8, n_ctx: int | None = None,
                  progress: Callable[[int], None] | None = None, device: str = "cpu", trace=None) -> np.ndarray:
    """int64 [L, E]: how often the router picked each pair over `tokens` (each token routed once per layer).
    Sequences longer than the context restart from an empty context. trace: a tiers/trace.TraceRecorder that also
    gets every pick, window by window (make-profile --trace)."""
    from ..errors import NonFiniteError
    from .contract import window_nonfinite

    g = model.geometry
    counts = np.zeros((g.n_layers, g.n_expert), dtype=np.int64)

    def hook(layer: int, ids: np.ndarray) -> None:
        counts[layer] += np.bincount(ids.reshape(-1), minlength=g.n_expert)
        if trace is not None:
            trace.pick(layer, ids)

    with _routing_engine(model, device, n_ctx, hook) as engine:
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
            engine.commit(n)
            done += n
            if progress is not None:
                progress(done)
    return counts
