"""Verify semantics: any window sizes and any accepted prefixes give the one-pass logits."""

from __future__ import annotations

import numpy as np
import pytest
from spec_windows import assert_same_state, committed_state, speculative_run

from strata_cli.engine.reference import ReferenceEngine
from strata_cli.errors import InputError
from strata_cli.model.gguf_file import open_model


@pytest.fixture(scope="module")
def fixture_model(fixture_dir):
    return open_model(fixture_dir / "model-f32.gguf")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_windows_and_prefixes_give_one_pass_logits(fixture_model, fixture_dir, seed):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    one_pass = ReferenceEngine(fixture_model).run(tokens, 0).logits
    engine = ReferenceEngine(fixture_model)
    got, _ = speculative_run(engine, tokens, np.random.default_rng(seed), max_t=9, allow_zero=seed == 2)
    assert np.abs(got - one_pass).max() <= 1e-5


def test_rejected_rows_leave_no_trace(fixture_model, fixture_dir):
    """A window whose drafts are all rejected, then the true continuation: as if the bad window never ran."""
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:40]
    clean = ReferenceEngine(fixture_model)
    clean.run(tokens[:22], 0)
    clean.commit(22)
    dirty = ReferenceEngine(fixture_model)
    dirty.run(tokens[:22], 0)
    dirty.commit(22)
    rng = np.random.default_rng(5)
    for _ in range(3):  # rejected windows crossing indexer block boundaries and the PLE history
        dirty.run(rng.integers(0, 512, 7), 22)
        dirty.commit(0)
    a = clean.run(tokens[22:40], 22).logits
    b = dirty.run(tokens[22:40], 22).logits
    assert np.abs(a - b).max() <= 1e-5
    st_a, st_b = clean.state, dirty.state
    for layer in st_a.gdn_state:
        np.testing.assert_array_equal(st_a.gdn_state[layer], st_b.gdn_state[layer])
        np.testing.assert_array_equal(st_a.gdn_conv[layer], st_b.gdn_conv[layer])
    for layer in st_a.idx_tail:
        np.testing.assert_array_equal(st_a.idx_tail[layer], st_b.idx_tail[layer])
    np.testing.assert_array_equal(st_a.ple_history, st_b.ple_history)
    np.testing.assert_array_equal(st_a.ple_prev, st_b.ple_prev)


def test_run_does_not_mutate_recurrent_state(fixture_model, fixture_dir):
    """Two runs of a window that crosses an indexer block and wraps its tail (no commit between): every committed
    state part (GDN state and conv, KV cells, indexer tail and pooled blocks, PLE history and predecessors) is
    untouched and the second run repeats the first."""
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    engine = ReferenceEngine(fixture_model)
    engine.run(tokens[:22], 0)
    engine.commit(22)
    before = committed_state(engine)
    first = engine.run(tokens[22:33], 22)
    assert_same_state(committed_state(engine), before, what="after one run")
    second = engine.run(tokens[22:33], 22)
    assert_same_state(committed_state(engine), before, what="after two runs")
    np.testing.assert_array_equal(first.logits, second.logits)


def test_window_contract_errors(fixture_model):
    engine = ReferenceEngine(fixture_model, n_ctx=16)
    with pytest.raises(InputError, match="out of range"):
        engine.run([1, 512], 0)
    with pytest.raises(InputError, match="past the context"):
        engine.run(np.zeros(17, dtype=int), 0)
    with pytest.raises(InputError, match="starts at position 3"):
        engine.run([1, 2], 3)
    with pytest.raises(InputError, match="commit without a window"):
        engine.commit(1)
    engine.run([1, 2, 3], 0)
    with pytest.raises(InputError, match="n_keep 4 outside 0..3"):
        engine.commit(4)
    with pytest.raises(InputError, match="empty window"):
        engine.run([], 0)
