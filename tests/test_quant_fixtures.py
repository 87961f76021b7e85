"""llama-quantize's real K-quant / i-quant files (qwen4exp-tiny-c) on the numpy engine: the truth for a quantized
file is the same model with every tensor replaced by its dequantized values (written here by gguf-py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader
from gguf import quants as gq

from gguf_edit import rewrite_gguf
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.model.gguf_file import open_model
from strata_cli.ops.basic import log_softmax64

KINDS = ["q4_k_m", "q3_k_m", "iq3_s", "iq2_xs"]


def dequantized_copy(src, dst):
    """Every non-F32 tensor of src replaced by gguf.quants.dequantize of its bytes, as F32 (same names, keys)."""
    reader = GGUFReader(str(src))
    replace = {t.name: (gq.dequantize(np.asarray(t.data), t.tensor_type), GT.F32)
               for t in reader.tensors if t.tensor_type != GT.F32}
    return rewrite_gguf(src, dst, replace_tensors=replace)


def target_logprobs(path, tokens):
    logits = ReferenceEngine(open_model(path)).run(tokens, 0).logits
    lp = log_softmax64(logits)
    rows = np.arange(len(tokens) - 1)
    return lp[rows, tokens[1:]], np.argmax(lp, axis=1)


@pytest.mark.parametrize("kind", KINDS)
def test_quantized_file_matches_its_dequantized_copy(fixture_c_dir, tmp_path, kind):
    src = fixture_c_dir / f"model-{kind}.gguf"
    types = {GT(int(t.tensor_type)).name for t in GGUFReader(str(src)).tensors}
    assert types - {"F32", "F16", "Q8_0"}, f"{src.name} holds no K-quant or i-quant tensor"
    tokens = np.load(fixture_c_dir / "reference.npz")["tokens"]
    got, got_top = target_logprobs(src, tokens)
    want, want_top = target_logprobs(dequantized_copy(src, tmp_path / "dequantized.gguf"), tokens)
    delta = np.abs(got - want)
    assert delta.max() <= 1e-4, f"{kind}: max |dlogprob(target)| {delta.max():.2e} at position {delta.argmax()}"
    np.testing.assert_array_equal(got_top, want_top)
