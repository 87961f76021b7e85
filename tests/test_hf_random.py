"""Randomly drawn Qwen4-Exp geometries: transformers' logits vs the numpy engine on our converter-mimic GGUF."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers.models.qwen4_exp")

import hf_oracle as H  # noqa: E402

from strata_cli.engine.reference import ReferenceEngine  # noqa: E402
from strata_cli.model.gguf_file import open_model  # noqa: E402
from strata_cli.ops.basic import log_softmax64  # noqa: E402

N_TOKENS = 40


def _case(seed, tmp_path, outtype="f32"):
    rng = np.random.default_rng(seed)
    config = H.random_config(rng)
    model = H.build_model(config, seed)
    tokens = H.random_tokens(rng, config, N_TOKENS, eos_at=N_TOKENS // 2)
    path = tmp_path / f"random-{seed}-{outtype}.gguf"
    H.write_gguf(model, path, outtype)
    return open_model(path), tokens, H.reference_logits(model, tokens)


@pytest.mark.parametrize("seed", range(6))
def test_random_geometry_matches_transformers(seed, tmp_path):
    m, tokens, ref = _case(seed, tmp_path)
    got = ReferenceEngine(m).run(tokens, 0).logits
    rows = np.arange(N_TOKENS - 1)
    delta = np.abs(log_softmax64(got)[rows, tokens[1:]] - log_softmax64(ref)[rows, tokens[1:]])
    assert delta.max() <= 2e-3, f"seed {seed}: max |dlogprob| {delta.max():.2e} at {delta.argmax()}"
    assert np.mean(got.argmax(1) == ref.argmax(1)) == 1.0


@pytest.mark.parametrize("seed", [10, 11])
def test_random_geometry_windows_and_commits(seed, tmp_path):
    m, tokens, ref = _case(seed, tmp_path)
    one_pass = ReferenceEngine(m).run(tokens, 0).logits
    engine = ReferenceEngine(m)
    rng = np.random.default_rng(seed)
    got = np.zeros_like(one_pass)
    while engine.n_past < N_TOKENS:
        pos = engine.n_past
        T = int(rng.integers(1, min(6, N_TOKENS - pos) + 1))
        keep = int(rng.integers(1, T + 1))
        window = tokens[pos:pos + T].copy()
        window[keep:] = (window[keep:] + 1) % m.geometry.n_vocab
        got[pos:pos + keep] = engine.run(window, pos).logits[:keep]
        engine.commit(keep)
    assert np.abs(got - one_pass).max() <= 1e-5
    assert np.abs(one_pass - ref).max() < 1e-3


@pytest.mark.parametrize("outtype", ["bf16", "q8_0"])
def test_random_geometry_quantized_top1(outtype, tmp_path):
    m, tokens, ref = _case(20, tmp_path, outtype)
    got = ReferenceEngine(m).run(tokens, 0).logits
    assert np.mean(got.argmax(1) == ref.argmax(1)) >= 0.8
