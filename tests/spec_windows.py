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


def committed_state(engine) -> dict[str, np.ndarray]:
    """Host copies of an engine's committed state (engine/state.py): what any later window may read.

    Keys name the part and layer: n_past, S/conv (GDN), k/v (KV cells below n_past), tail, pooled (blocks
    below n_past // ratio), ple_history, ple_prev. Works on the numpy engine and the GPU engine alike, and on a
    layer split of either (engine/layer_split.py): its stages' parts together."""
    if getattr(engine, "stages", None) is not None:
        out = {}
        for stage in engine.stages:
            out.update(committed_state(stage))
        return out
    g, n = engine.g, engine.n_past
    lo, hi = getattr(engine, "layers", (0, g.n_layers))
    if engine.device == "gpu":
        def part(kind, layer=None):  # read_state: after the commit in flight (engine/gpu/engine.py)
            name = {"S": "S", "conv": "conv", "k": "kc", "v": "vc", "tail": "tail", "pooled": "pooled",
                    "ple_history": "ple_history", "ple_prev": "ple_prev"}[kind]
            return engine.read_state(name if layer is None else f"{name}.{layer}")
    else:
        st = engine.state

        def part(kind, layer=None):
            table = {"S": st.gdn_state, "conv": st.gdn_conv, "k": st.k_cache, "v": st.v_cache, "tail": st.idx_tail,
                     "pooled": st.idx_pooled}
            if kind in table:
                return table[kind][layer].copy()
            return getattr(st, kind).copy()

    out = {"n_past": np.array(n)}
    for layer in (lay for lay in g.gdn_layers if lo <= lay < hi):
        out[f"S.{layer}"], out[f"conv.{layer}"] = part("S", layer), part("conv", layer)
    for layer in (lay for lay in g.attn_layers if lo <= lay < hi):
        out[f"k.{layer}"], out[f"v.{layer}"] = part("k", layer)[:n], part("v", layer)[:n]
        ratio = g.compress_ratios[layer]
        if ratio:
            out[f"tail.{layer}"] = part("tail", layer)
            out[f"pooled.{layer}"] = part("pooled", layer)[:n // ratio]
    if g.ple is not None and lo <= g.ple.layer < hi:
        out["ple_history"], out["ple_prev"] = part("ple_history"), part("ple_prev")
    return out


def assert_same_state(a: dict, b: dict, atol: float = 0.0, rtol: float = 0.0, what: str = "") -> None:
    """Every part of two committed_state() dicts equal (exactly, or within atol + rtol * max|b|)."""
    assert a.keys() == b.keys(), what
    for key in a:
        x, y = a[key], b[key]
        assert x.shape == y.shape, f"{what} {key}: shape {x.shape} vs {y.shape}"
        if x.size == 0:
            continue
        bound = atol + rtol * float(np.abs(y).max())
        err = float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max())
        assert err <= bound, f"{what} {key}: max |diff| {err:.3e} > {bound:.3e}"


def dropped_window_cases(g, tokens, rng):
    """(prefix, dropped windows, T, n_keep) for the dropped-window contract on geometry g (QSA + PLE).

    Prefixes sit before, at and after indexer block boundaries, one in the sparse-selection range and 0; the
    first dropped window always wraps the indexer tail over the committed slots of the block being filled and
    completes a block; the windows carry an EOS (PLE n-gram reset) and are long enough to cross the conv rows.
    Every window fits in 16 rows and every case in len(tokens) >= 48 tokens."""
    ratio = max(g.compress_ratios)
    sparse = g.idx_budget + ratio + ratio - 1        # one slot short of a block end, selection already sparse
    prefixes = [min(sparse, 26), 3 * ratio + 1, 2 * ratio, 0]
    eos = g.eos_token_id if g.eos_token_id is not None else 0
    for prefix in prefixes:
        wrap = ratio - prefix % ratio + 1 + int(rng.integers(ratio))
        first = rng.integers(0, g.n_vocab, wrap)
        first[int(rng.integers(wrap))] = eos
        dropped = [first]
        if rng.random() < 0.5:
            dropped.append(rng.integers(0, g.n_vocab, int(rng.integers(1, 13))))
        T = int(rng.integers(1, 12))
        yield prefix, dropped, T, int(rng.integers(0, T + 1))


def draws_whole_and_cut(engine, tokens, temperature: float, seed: int):
    """Rows 6..17 of `tokens` (the first 6 committed before) sampled from one 12-row window and from three windows of
    3, 5 and 4 rows (each committed): (whole window's result, its ids, the ids of the three windows concatenated).
    The engine must hold exactly tokens[:6]. A draw keyed by absolute position gives the same ids both ways."""
    from strata_cli.ops.sampling import sample_rows

    whole = engine.run(tokens[6:18], 6)
    one = engine.sample(whole, temperature, seed)
    np.testing.assert_array_equal(one, sample_rows(whole.logits, 6 + np.arange(12), temperature, seed))
    parts = []
    for lo, hi in ((6, 9), (9, 14), (14, 18)):
        result = engine.run(tokens[lo:hi], lo)
        parts.append(engine.sample(result, temperature, seed))
        engine.commit(hi - lo)
    return whole, one, np.concatenate(parts)
