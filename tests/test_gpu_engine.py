"""The GPU verify engine against the numpy engine: logits, greedy ids, graph vs eager, window/commit, sampling."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_engines import gpu_engine, rel_err, synthetic_model
from spec_windows import speculative_run

from strata_cli.engine.reference import ReferenceEngine
from strata_cli.model.gguf_file import open_model
from strata_cli.ops.sampling import sample_rows

pytestmark = pytest.mark.gpu

N_TOKENS = 48


def _models(fixture_dir, tmp_path):
    yield "fixture-f32", open_model(fixture_dir / "model-f32.gguf")
    yield "fixture-bf16", open_model(fixture_dir / "model-bf16.gguf")
    yield "fixture-q8_0", open_model(fixture_dir / "model-q8_0.gguf")
    yield "tiny-q8_0", synthetic_model(tmp_path, "tiny", 3, "Q8_0")
    yield "tiny-f16-6layers", synthetic_model(tmp_path, "tiny", 4, "F16", layers=6, experts=12)
    yield "small-bf16-4layers", synthetic_model(tmp_path, "small", 5, "BF16", layers=4, vocab=4096)


def test_gpu_matches_numpy_engine(fixture_dir, tmp_path):
    rng = np.random.default_rng(0)
    for name, model in _models(fixture_dir, tmp_path):
        tokens = rng.integers(0, model.geometry.n_vocab, N_TOKENS)
        if model.geometry.eos_token_id is not None:
            tokens[N_TOKENS // 3] = model.geometry.eos_token_id
        ref = ReferenceEngine(model).run(tokens, 0)
        gpu, gpu_ids = speculative_run(gpu_engine(model), tokens, np.random.default_rng(1), 16)
        err = rel_err(gpu, ref.logits)
        assert err <= 1e-3, f"{name}: max relative error {err:.2e}"
        np.testing.assert_array_equal(gpu_ids, ref.ids, err_msg=name)


def test_graph_replay_equals_eager(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    eng = gpu_engine(model)
    runs = {}
    for eager in (True, False):
        eng.reset()
        rows = []
        for pos in range(0, 40, 8):
            rows.append(eng.run(tokens[pos:pos + 8], pos, eager=eager).logits)
            eng.commit(8, eager=eager)
        runs[eager] = np.concatenate(rows)
    np.testing.assert_array_equal(runs[True], runs[False])
    numpy_rows = ReferenceEngine(model).run(tokens[:40], 0).logits
    assert rel_err(runs[False], numpy_rows) <= 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_window_commit_property_on_gpu(fixture_dir, seed):
    model = open_model(fixture_dir / "model-f32.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    eng = gpu_engine(model)
    base, _ = speculative_run(eng, tokens, np.random.default_rng(100), 1)            # one token per window
    got, ids = speculative_run(eng, tokens, np.random.default_rng(seed), 16, allow_zero=True)
    assert np.abs(got - base).max() <= 1e-4
    numpy_got, numpy_ids = speculative_run(ReferenceEngine(model), tokens, np.random.default_rng(seed), 16,
                                           allow_zero=True)
    assert rel_err(got, numpy_got) <= 1e-3
    np.testing.assert_array_equal(ids, numpy_ids)


def test_fixture_transformers_logits_on_gpu(fixture_dir):
    ref = np.load(fixture_dir / "reference.npz")
    eng = gpu_engine(open_model(fixture_dir / "model-f32.gguf"))
    got, ids = speculative_run(eng, ref["tokens"], np.random.default_rng(7), 8)
    assert rel_err(got, ref["logits"]) <= 1e-3
    np.testing.assert_array_equal(ids, ref["logits"].argmax(1))


def test_sampling_matches_numpy_draws(fixture_dir):
    model = open_model(fixture_dir / "model-f32.gguf")
    eng = gpu_engine(model)
    tokens = np.arange(10, 22)
    eng.run(tokens[:6], 0)
    eng.commit(6)
    result = eng.run(tokens[6:], 6)
    for temperature, seed in [(0.7, 1), (1.5, 2**40 + 3), (0.0, 5)]:
        got = eng.sample(result, temperature, seed)
        want = sample_rows(result.logits, 6 + np.arange(6), temperature, seed)
        np.testing.assert_array_equal(got, want)


def test_graph_summaries(fixture_dir):
    eng = gpu_engine(open_model(fixture_dir / "model-q8_0.gguf"))
    one, four = eng.graph(1).summary(), eng.graph(4).summary()
    # one layer sequence at every T (launch_util.WINDOW_PATHS picks kernels, not launches): as many nodes
    assert one.nodes > 100 and four.nodes == one.nodes and one.edges > 0
    kinds = dict(four.kinds)
    # tokens, positions and ids staged (a window never writes the indexer's tail: no copy node to restore it)
    assert kinds["memcpy"] == 3
    # every Q8_0 GEMV matrix of the fixture repacked (dense, experts, and the HC reads' stacked down + inject, padded
    # to whole 32-row groups); the dense ones on the kernel the T = 4 window's path names (tensor cores from T = 4)
    assert not any(k.startswith("gemv_q8_0_") for k in kinds)
    from strata_cli.gpu.launch_util import window_path
    tc = "tc_" if window_path(4).gemv_tc else ""  # the grouped experts follow the dense GEMVs' path
    assert kinds.get(f"gemv_q8r_{tc}t4", 0) > 0 and kinds.get(f"gemv_expert_q8r_{tc}t4", 0) > 0
    commit = dict(eng.commit_graph().summary().kinds)
    assert commit["gdn_recurrence"] == commit["gdn_conv_commit"] == len(eng.g.gdn_layers)


def test_repacked_q8_0_matches_raw_q8_0(fixture_dir):
    """The engine repacks Q8_0 GEMV matrices by default; raw and repacked weights give the same windows."""
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    packed_eng, raw_eng = gpu_engine(model), gpu_engine(model, pack_q8=False)
    assert packed_eng.w.packed > 0 and raw_eng.w.packed == 0
    a, a_ids = speculative_run(packed_eng, tokens, np.random.default_rng(3), 8)
    b, b_ids = speculative_run(raw_eng, tokens, np.random.default_rng(3), 8)
    assert rel_err(a, b) <= 1e-4
    np.testing.assert_array_equal(a_ids, b_ids)
    numpy_logits = ReferenceEngine(model).run(tokens, 0).logits
    assert rel_err(a, numpy_logits) <= 1e-3
