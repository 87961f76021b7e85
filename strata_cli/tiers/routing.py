"""Router picks of a real run: the numpy reference engine over a token sequence, every row committed, counting
which (layer, expert) pairs the router chose (the input of `strata make-profile` and of held-out hit rates)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..engine.reference import ReferenceEngine


def count_routing(model, tokens: np.ndarray, window: int = 8, n_ctx: int | None = None,
                  progress: Callable[[int], None] | None = None) -> np.ndarray:
    """int64 [L, E]: how often the router picked each pair over `tokens` (each token routed once per layer).
    Sequences longer than the context restart from an empty context."""
    g = model.geometry
    counts = np.zeros((g.n_layers, g.n_expert), dtype=np.int64)

    def hook(layer: int, ids: np.ndarray) -> None:
        counts[layer] += np.bincount(ids.reshape(-1), minlength=g.n_expert)

    engine = ReferenceEngine(model, n_ctx=n_ctx)
    engine.route_hook = hook
    done = 0
    while done < len(tokens):
        if engine.n_past >= engine.n_ctx:
            engine.reset()
        n = min(window, len(tokens) - done, engine.n_ctx - engine.n_past)
        engine.run(tokens[done:done + n])
        engine.commit(n)
        done += n
        if progress is not None:
            progress(done)
    return counts


def slot_counts(n_pairs: int, extra: list[int] | tuple[int, ...] = ()) -> list[int]:
    """The slot counts a report shows by default: 10/25/50/75/100 % of the pairs, plus `extra` (e.g. the profile's)."""
    picks = {int(round(n_pairs * f)) for f in (0.1, 0.25, 0.5, 0.75, 1.0)} | {int(e) for e in extra}
    return sorted(p for p in picks if 0 <= p <= n_pairs)
