"""strata's own dequantizers and encoders are bit-identical to gguf-py's (the format reference)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader, quants as gq

from strata_cli.model import quants

TYPES = [(quants.F16, GT.F16), (quants.BF16, GT.BF16), (quants.Q8_0, GT.Q8_0)]


@pytest.mark.parametrize("ours,theirs", TYPES, ids=["F16", "BF16", "Q8_0"])
@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (3, 5, 160)])
def test_encode_and_decode_match_gguf(ours, theirs, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1, 300], size=shape)).astype(np.float32)
    x.reshape(-1)[:32] = 0  # an all-zero Q8_0 block (scale 0)
    raw = gq.quantize(x, theirs)
    if ours != quants.F16:
        np.testing.assert_array_equal(quants.quantize(x, ours), raw)
    np.testing.assert_array_equal(quants.dequantize(raw, ours), gq.dequantize(raw, theirs))


def test_fixture_tensors_dequantize_like_gguf(fixture_dir):
    for kind in ("bf16", "q8_0"):
        reader = GGUFReader(fixture_dir / f"model-{kind}.gguf")
        checked = 0
        for t in reader.tensors:
            if int(t.tensor_type) in (quants.F16, quants.BF16, quants.Q8_0):
                raw = np.asarray(t.data)
                np.testing.assert_array_equal(quants.dequantize(raw, int(t.tensor_type)),
                                              gq.dequantize(raw, t.tensor_type), err_msg=t.name)
                checked += 1
        assert checked > 100
