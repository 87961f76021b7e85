"""The window contract (engine/state.py) on the GPU engine, on random geometries strata writes itself, each
step checked against the GPU engine that never ran the dropped windows (<= 1e-4) and against the numpy engine
(the cross-engine bar of test_gpu_engine.py: relative 1e-3, same committed state)."""

from __future__ import annotations

import numpy as np
import pytest
from random_models import random_preset, write_random
from spec_windows import (assert_same_state, committed_state, draws_whole_and_cut, dropped_window_cases,
                          speculative_run)

from strata_cli.engine.reference import ReferenceEngine

pytestmark = pytest.mark.gpu

N_CTX = 96
CROSS = 1e-3    # GPU vs numpy, relative to the largest |value| (test_gpu_engine.py)
SAME = 1e-4     # GPU vs GPU: the contract's bound


def _gpu(model):
    from strata_cli.engine.gpu import GPUEngine

    return GPUEngine(model, n_ctx=N_CTX)


@pytest.fixture(scope="module", params=[(50, "F32"), (51, "F32"), (52, "BF16")], ids=lambda p: f"seed{p[0]}-{p[1]}")
def case(request, tmp_path_factory):
    seed, ggml_type = request.param
    rng = np.random.default_rng(seed)
    model = write_random(tmp_path_factory.mktemp("gpu-contract"), random_preset(rng), seed, ggml_type)
    tokens = rng.integers(0, model.geometry.n_vocab, 48)
    tokens[17] = model.geometry.eos_token_id
    return model, tokens, _gpu(model), _gpu(model)


def _feed(engine, tokens, start, stop):
    """Commit tokens[start:stop] in windows of at most max_t rows (the GPU engine takes up to 16)."""
    for lo in range(start, stop, engine.max_t):
        hi = min(lo + engine.max_t, stop)
        engine.run(tokens[lo:hi], lo)
        engine.commit(hi - lo)


def _fed(engine, tokens, prefix):
    engine.reset()
    _feed(engine, tokens, 0, prefix)
    return engine


def _close_to_numpy(got, want, what):
    err = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
    assert err <= CROSS, f"{what}: relative error {err:.2e} against the numpy engine"
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > CROSS * float(np.abs(want).max())   # no near-tie for the top id
    np.testing.assert_array_equal(got.argmax(1)[clear], want.argmax(1)[clear], err_msg=what)


def test_dropped_windows_leave_no_trace_on_gpu(case):
    model, tokens, clean, dirty = case
    rng = np.random.default_rng(int(tokens[0]))
    for prefix, dropped, T, keep in dropped_window_cases(model.geometry, tokens, rng):
        what = f"prefix {prefix}, dropped {[len(w) for w in dropped]}, T {T}, keep {keep}"
        ref = ReferenceEngine(model, n_ctx=N_CTX)
        if prefix:
            ref.run(tokens[:prefix], 0)
            ref.commit(prefix)
        _fed(clean, tokens, prefix)
        _fed(dirty, tokens, prefix)
        before = committed_state(dirty)
        for window in dropped:
            dirty.run(window, prefix)
            assert_same_state(committed_state(dirty), before, what=f"{what}: after a dropped run")
        window = tokens[prefix:prefix + T]
        a, b, r = clean.run(window, prefix), dirty.run(window, prefix), ref.run(window, prefix)
        assert np.abs(a.logits - b.logits).max() <= SAME, what
        np.testing.assert_array_equal(a.ids, b.ids, err_msg=what)
        _close_to_numpy(b.logits, r.logits, what)
        for engine in (clean, dirty, ref):
            engine.commit(keep)
        assert_same_state(committed_state(dirty), committed_state(clean), atol=SAME, what=what)
        assert_same_state(committed_state(dirty), committed_state(ref), rtol=CROSS, what=f"{what} vs numpy")
        pos = prefix + keep
        nxt = tokens[pos:pos + 9]
        a, b, r = clean.run(nxt, pos), dirty.run(nxt, pos), ref.run(nxt, pos)
        assert np.abs(a.logits - b.logits).max() <= SAME, what
        _close_to_numpy(b.logits, r.logits, f"{what}: next window")


def test_commit_zero_and_repeated_runs_on_gpu(case):
    """commit(0) restores nothing because nothing was written; the same window twice gives the same logits."""
    model, tokens, _, engine = case
    ratio = max(model.geometry.compress_ratios)
    prefix = 2 * ratio + 1
    _fed(engine, tokens, prefix)
    before = committed_state(engine)
    first = engine.run(tokens[prefix:prefix + 2 * ratio + 1], prefix)
    second = engine.run(tokens[prefix:prefix + 2 * ratio + 1], prefix)
    assert_same_state(committed_state(engine), before, what="after two runs")
    np.testing.assert_array_equal(first.logits, second.logits)
    engine.commit(0)
    assert_same_state(committed_state(engine), before, what="commit(0)")


def test_windows_and_prefixes_on_gpu_match_numpy(case):
    """Random windows and accepted prefixes (n_keep = 0 included) on the GPU against the numpy one-pass logits."""
    model, tokens, _, engine = case
    one_pass = ReferenceEngine(model, n_ctx=N_CTX).run(tokens, 0).logits
    got, ids = speculative_run(engine, tokens, np.random.default_rng(9), 16, allow_zero=True)
    _close_to_numpy(got, one_pass, "speculative windows")
    single, _ = speculative_run(engine, tokens, np.random.default_rng(9), 1)
    assert np.abs(got - single).max() <= SAME


def test_a_window_may_fill_the_context_exactly_on_gpu(case):
    """The last cell of the context (completing an indexer block) is inside it; one position more is not."""
    from strata_cli.errors import InputError

    model, tokens, _, _ = case
    ratio = max(model.geometry.compress_ratios)
    n_ctx = 6 * ratio
    full = ReferenceEngine(model, n_ctx=N_CTX).run(tokens[:n_ctx], 0).logits
    from strata_cli.engine.gpu import GPUEngine

    engine = GPUEngine(model, n_ctx=n_ctx)
    _feed(engine, tokens, 0, n_ctx - ratio - 1)
    last = engine.run(tokens[n_ctx - ratio - 1:n_ctx], n_ctx - ratio - 1)
    _close_to_numpy(last.logits, full[n_ctx - ratio - 1:], "window ending at the last cell")
    engine.commit(ratio + 1)
    assert engine.n_past == n_ctx
    with pytest.raises(InputError, match="past the context"):
        engine.run(tokens[n_ctx:n_ctx + 1], n_ctx)


@pytest.mark.parametrize("temperature, seed", [(0.7, 1), (1.5, 2 ** 40 + 3)])
def test_gpu_draws_are_keyed_by_position(case, temperature, seed):
    """GPU sampling of rows 6..17 equals the numpy draws on the same logits, and rows sampled from three shorter
    windows draw the same ids (where the Gumbel-max winner is not a near-tie between window sizes)."""
    from strata_cli.ops.sampling import gumbel

    model, tokens, _, engine = case
    _fed(engine, tokens, 6)
    whole, one, parts = draws_whole_and_cut(engine, tokens, temperature, seed)
    V = model.geometry.n_vocab
    for t in range(12):
        score = np.sort(whole.logits[t].astype(np.float64) / temperature + gumbel(seed, 6 + t, V))
        if score[-1] - score[-2] > 1e-3:
            assert parts[t] == one[t], t
