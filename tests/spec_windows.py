"""The speculative loop the window/commit tests drive an engine through (numpy and GPU alike)."""

from __future__ import annotations

import numpy as np


def speculative_run(engine, tokens, rng, max_t: int, allow_zero: bool = False):
    """Windows of random size; the drafts after a random accepted prefix are corrupted and only that prefix is
    committed. Returns the kept rows' logits [N, V] and greedy ids [N] (every position is kept exactly once)."""
    vocab = engine.g.n_vocab
    logits = np.full((len(tokens), vocab), np.nan, dtype=np.float32)
    ids = np.full(len(tokens), -1, dtype=np.int32)
    engine.reset()
    while engine.n_past < len(tokens):
        pos = engine.n_past
        T = int(rng.integers(1, min(max_t, len(tokens) - pos) + 1))
        keep = int(rng.integers(0 if allow_zero else 1, T + 1))
        window = tokens[pos:pos + T].copy()
        for j in range(max(keep, 1), T):
            window[j] = (window[j] + 1 + rng.integers(vocab - 1)) % vocab
        result = engine.run(window, pos)
        logits[pos:pos + keep] = result.logits[:keep]
        ids[pos:pos + keep] = result.ids[:keep]
        engine.commit(keep)
    return logits, ids
