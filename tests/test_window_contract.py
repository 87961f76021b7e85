"""The window contract (engine/state.py) on random geometries the suite writes itself (no ../shared needed):
a run that is never committed leaves no trace, whatever comes next; commit(n_keep) for any n_keep, 0 included."""

from __future__ import annotations

import numpy as np
import pytest
from random_models import random_preset, write_random
from spec_windows import assert_same_state, committed_state, dropped_window_cases, speculative_run

from strata_cli.engine.reference import ReferenceEngine
from strata_cli.errors import InputError
from strata_cli.ops import qsa

N_CTX = 96


@pytest.fixture(scope="module", params=range(4), ids=lambda s: f"geometry{s}")
def case(request, tmp_path_factory):
    """(model, tokens): a random geometry with PLE and QSA, and tokens with an EOS in the middle."""
    seed = 40 + request.param
    rng = np.random.default_rng(seed)
    model = write_random(tmp_path_factory.mktemp("contract"), random_preset(rng), seed)
    tokens = rng.integers(0, model.geometry.n_vocab, 48)
    tokens[17] = model.geometry.eos_token_id
    return model, tokens


def _fed(model, tokens, prefix):
    engine = ReferenceEngine(model, n_ctx=N_CTX)
    if prefix:
        engine.run(tokens[:prefix], 0)
        engine.commit(prefix)
    return engine


def test_dropped_windows_leave_no_trace(case):
    """Commit a prefix; run windows that are never committed (wrapping the indexer tail over committed slots,
    completing blocks, crossing the PLE history and the conv rows); then the real next window, a commit of
    n_keep rows and one more window. Every step equals an engine that never ran the dropped windows, and the
    committed state right after each dropped run is exactly the state before it."""
    model, tokens = case
    rng = np.random.default_rng(int(tokens[0]))
    for prefix, dropped, T, keep in dropped_window_cases(model.geometry, tokens, rng):
        clean, dirty = _fed(model, tokens, prefix), _fed(model, tokens, prefix)
        before = committed_state(dirty)
        for window in dropped:
            dirty.run(window, prefix)
            assert_same_state(committed_state(dirty), before, what=f"prefix {prefix}, after a dropped run")
        a, b = clean.run(tokens[prefix:prefix + T], prefix), dirty.run(tokens[prefix:prefix + T], prefix)
        assert np.abs(a.logits - b.logits).max() <= 1e-5, (prefix, [len(w) for w in dropped], T)
        np.testing.assert_array_equal(a.ids, b.ids)
        clean.commit(keep)
        dirty.commit(keep)
        assert_same_state(committed_state(dirty), committed_state(clean), atol=1e-5, what=f"prefix {prefix}")
        pos = prefix + keep
        a, b = clean.run(tokens[pos:pos + 9], pos), dirty.run(tokens[pos:pos + 9], pos)
        assert np.abs(a.logits - b.logits).max() <= 1e-5, (prefix, keep)


def test_commit_zero_is_a_dropped_window(case):
    model, tokens = case
    ratio = max(model.geometry.compress_ratios)
    prefix = 2 * ratio + 1
    engine = _fed(model, tokens, prefix)
    before = committed_state(engine)
    engine.run(tokens[prefix:prefix + 2 * ratio + 1], prefix)
    engine.commit(0)
    assert_same_state(committed_state(engine), before, what="commit(0)")


def test_run_is_a_pure_function_of_the_committed_state(case):
    """The same window twice in a row (no commit between) gives the same logits and leaves every state part
    (GDN state and conv, KV cells, indexer tail and pooled blocks, PLE history and predecessors) alone."""
    model, tokens = case
    engine = _fed(model, tokens, 11)
    before = committed_state(engine)
    first = engine.run(tokens[11:24], 11)
    assert_same_state(committed_state(engine), before, what="after one run")
    second = engine.run(tokens[11:24], 11)
    assert_same_state(committed_state(engine), before, what="after two runs")
    np.testing.assert_array_equal(first.logits, second.logits)


@pytest.mark.parametrize("allow_zero", [False, True], ids=["keep>=1", "keep>=0"])
def test_any_windows_and_prefixes_give_one_pass_logits(case, allow_zero):
    model, tokens = case
    one_pass = ReferenceEngine(model, n_ctx=N_CTX).run(tokens, 0).logits
    got, ids = speculative_run(ReferenceEngine(model, n_ctx=N_CTX), tokens, np.random.default_rng(7), max_t=11,
                               allow_zero=allow_zero)
    assert np.abs(got - one_pass).max() <= 1e-5
    np.testing.assert_array_equal(ids, one_pass.argmax(1))


def test_rejected_rows_leave_no_trace(case):
    """Windows whose drafts are all rejected (commit 0) or partly rejected, then the true continuation."""
    model, tokens = case
    g = model.geometry
    ratio = max(g.compress_ratios)
    clean, dirty = _fed(model, tokens, 20), _fed(model, tokens, 20)
    rng = np.random.default_rng(5)
    for T in (ratio + 1, 2 * ratio + 3, 1):
        dirty.run(rng.integers(0, g.n_vocab, T), 20)
        dirty.commit(0)
    bad = tokens[20:20 + 2 * ratio + 2].copy()
    bad[3:] = (bad[3:] + 1) % g.n_vocab
    dirty.run(bad, 20)
    dirty.commit(3)
    clean.run(tokens[20:23], 20)
    clean.commit(3)
    assert_same_state(committed_state(dirty), committed_state(clean), atol=1e-5, what="after rejected rows")
    a, b = clean.run(tokens[23:40], 23), dirty.run(tokens[23:40], 23)
    assert np.abs(a.logits - b.logits).max() <= 1e-5


def test_a_window_may_fill_the_context_exactly(case):
    """Positions up to n_ctx - 1 are inside the context (the last cell completes an indexer block here: n_ctx is a
    multiple of the ratio); one more position is not, for a window or a fresh run alike."""
    model, tokens = case
    ratio = max(model.geometry.compress_ratios)
    n_ctx = 6 * ratio
    full = ReferenceEngine(model, n_ctx=N_CTX).run(tokens[:n_ctx], 0).logits
    engine = ReferenceEngine(model, n_ctx=n_ctx)
    engine.run(tokens[:n_ctx - ratio - 1], 0)
    engine.commit(n_ctx - ratio - 1)
    last = engine.run(tokens[n_ctx - ratio - 1:n_ctx], n_ctx - ratio - 1)
    assert np.abs(last.logits - full[n_ctx - ratio - 1:]).max() <= 1e-5
    engine.commit(ratio + 1)
    assert engine.n_past == n_ctx
    with pytest.raises(InputError, match="past the context"):
        engine.run(tokens[n_ctx:n_ctx + 1], n_ctx)
    with pytest.raises(InputError, match="past the context"):
        ReferenceEngine(model, n_ctx=n_ctx).run(tokens[:n_ctx + 1], 0)


def test_block_completed_at_the_querys_own_cell_is_scored():
    """Selection over n_cells = 3 * ratio visible cells: all three blocks are complete (the last one at the query's
    own cell) and compete; nothing is left over as unscored tail cells."""
    ratio, budget = 4, 4
    cells = qsa.select_cells(np.array([0.1, 0.2, 0.9], np.float32), 3 * ratio, ratio, budget)
    np.testing.assert_array_equal(cells, np.arange(2 * ratio, 3 * ratio))
    cells = qsa.select_cells(np.array([0.1, 0.9, 0.2], np.float32), 3 * ratio, ratio, budget)
    np.testing.assert_array_equal(cells, np.arange(ratio, 2 * ratio))
    # one cell more: the fourth block is the partial tail, always kept after the best complete block
    cells = qsa.select_cells(np.array([0.1, 0.9, 0.2], np.float32), 3 * ratio + 1, ratio, budget)
    np.testing.assert_array_equal(cells, np.r_[np.arange(ratio, 2 * ratio), 3 * ratio])
    # at or below the budget every cell is kept
    np.testing.assert_array_equal(qsa.select_cells(np.zeros(1, np.float32), ratio, ratio, budget), np.arange(ratio))
