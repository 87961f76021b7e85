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


@pytest.mark.parametrize("kind", KINDS)
def test_every_matrix_has_a_gpu_path(fixture_c_dir, kind):
    """Every GEMV matrix and gathered table of llama-quantize's files passes the launchers' checks (the same checks
    the GPU engine's launches make, here on the memory-mapped numpy arrays) with a kernel for its type."""
    from strata_cli.engine.gpu.weights import F32_MATRICES
    from strata_cli.gpu import launch_quant
    from strata_cli.gpu import launch_util as U
    from strata_cli.model.names import PLE_TABLE

    model = open_model(fixture_c_dir / f"model-{kind}.gguf")
    quantized = 0
    for name in list(model.specs) + [PLE_TABLE]:
        info = model.info(name)
        if len(info.shape) == 1 or name.endswith(F32_MATRICES) or name.endswith("ffn_gate_inp_shexp.weight"):
            continue  # uploaded as float32 vectors / taps
        raw = np.ascontiguousarray(info.raw)
        n_in = int(info.shape[0])
        if len(info.shape) == 3:
            E, rows, _ = U.expert_geometry(name, raw, info.ggml_type, n_in)
            assert (E, rows) == (info.shape[2], info.shape[1])
        else:
            assert U.weight_rows(name, raw, info.ggml_type, n_in) == info.shape[1]
        quantized += launch_quant.handles(info.ggml_type)
    assert quantized >= 20
