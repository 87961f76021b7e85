"""strata's own block encoders (synth/encode_k.py, synth/encode_iq.py): every type gguf.quants cannot quantize
round-trips through gguf.quants' dequantization within a stated error, blocks are independent (any number of them,
any chunking), and rows of zeros, huge and tiny values stay finite."""

from __future__ import annotations

import numpy as np
import pytest

from strata_cli.model import quants as Q
from strata_cli.synth import encode

# Relative RMS error bound (rms(dequantized - x) / rms(x)) on Gaussian weights, per type, with its bits per weight:
# about 10 % above what the encoders give (README's quantize table), so a regression in any of them shows.
BOUND = {Q.Q2_K: 0.31, Q.Q3_K: 0.165, Q.Q4_K: 0.083, Q.Q5_K: 0.041, Q.Q6_K: 0.020, Q.IQ4_NL: 0.086,
         Q.IQ4_XS: 0.086, Q.NVFP4: 0.105, Q.IQ2_XXS: 0.385, Q.IQ2_XS: 0.33, Q.IQ2_S: 0.28, Q.IQ3_XXS: 0.20,
         Q.IQ3_S: 0.148, Q.IQ1_S: 0.54, Q.IQ1_M: 0.49}
TYPES = [pytest.param(t, id=Q.TYPE_NAMES[t]) for t in BOUND]
# NVFP4's ue4m3 block scales hold block maxima of about 1e-2 .. 2.7e3 only (GGUF's NVFP4 has no tensor scale)
HUGE = {Q.NVFP4: 1e2}
TINY = {Q.NVFP4: 1e-2}


def _relative_error(x: np.ndarray, ggml_type: int) -> float:
    raw = encode.encode(x, ggml_type)
    assert raw.dtype == np.uint8 and raw.size == x.size // Q.BLOCK[ggml_type][0] * Q.BLOCK[ggml_type][1]
    y = Q.dequantize(raw, ggml_type)
    assert np.isfinite(y).all()
    return float(np.sqrt(np.mean((y.astype(np.float64) - x) ** 2) / np.mean(x.astype(np.float64) ** 2)))


def _gaussian(n_blocks: int, ggml_type: int, std: float = 0.02, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n_blocks * Q.BLOCK[ggml_type][0], dtype=np.float32) * np.float32(std)


def test_every_type_has_an_encoder():
    assert set(encode.BY_GGUF) | set(encode.BY_STRATA) == set(Q.QUANT_TYPES)
    assert not set(encode.BY_GGUF) & set(encode.BY_STRATA)


@pytest.mark.parametrize("ggml_type", TYPES)
def test_round_trip_error_is_within_the_types_bound(ggml_type):
    assert _relative_error(_gaussian(8 * 256 // Q.BLOCK[ggml_type][0] * 33, ggml_type), ggml_type) \
        <= BOUND[ggml_type]


def test_more_bits_give_less_error():
    """Within a family, the error falls as the bits per weight rise."""
    for family in ((Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K), (Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S,
                                                              Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_XS)):
        errors = [_relative_error(_gaussian(64, t, seed=1), t) for t in family]
        assert errors == sorted(errors, reverse=True), dict(zip((Q.TYPE_NAMES[t] for t in family), errors))


@pytest.mark.parametrize("ggml_type", TYPES)
def test_blocks_are_encoded_independently(ggml_type):
    """Odd numbers of blocks, and a block's bytes do not depend on its neighbours (so any chunking of a tensor gives
    the same file)."""
    x = _gaussian(7, ggml_type, seed=2)
    whole = encode.encode(x, ggml_type)
    elems = Q.BLOCK[ggml_type][0]
    parts = [encode.encode(x[:elems], ggml_type), encode.encode(x[elems:4 * elems], ggml_type),
             encode.encode(x[4 * elems:], ggml_type)]
    assert np.array_equal(whole, np.concatenate(parts))


@pytest.mark.parametrize("ggml_type", TYPES)
def test_zero_rows_decode_to_zero(ggml_type):
    x = _gaussian(3, ggml_type)
    x[Q.BLOCK[ggml_type][0]:2 * Q.BLOCK[ggml_type][0]] = 0.0  # the middle block all zeros
    y = Q.dequantize(encode.encode(x, ggml_type), ggml_type)
    assert np.isfinite(y).all()
    assert (y[Q.BLOCK[ggml_type][0]:2 * Q.BLOCK[ggml_type][0]] == 0).all()
    assert (Q.dequantize(encode.encode(np.zeros_like(x), ggml_type), ggml_type) == 0).all()


@pytest.mark.parametrize("ggml_type", TYPES)
def test_huge_and_tiny_values(ggml_type):
    """Block maxima near the top of fp16's range keep the type's error; small ones lose at most what fp16 block
    scales lose; values below any scale's reach decode to about zero, never to something larger."""
    x = _gaussian(8 * 256 // Q.BLOCK[ggml_type][0], ggml_type, std=1.0, seed=3)
    assert _relative_error(x * np.float32(HUGE.get(ggml_type, 1e4)), ggml_type) <= BOUND[ggml_type]
    assert _relative_error(x * np.float32(TINY.get(ggml_type, 1e-4)), ggml_type) <= 3 * BOUND[ggml_type]
    assert _relative_error(x * np.float32(1e-7), ggml_type) <= 1.0 + 1e-6


@pytest.mark.parametrize("ggml_type", [pytest.param(t, id=Q.TYPE_NAMES[t]) for t in encode.BY_GGUF
                                       if t not in (Q.F32, Q.F16)])
def test_gguf_types_in_wide_rows_equal_block_by_block(ggml_type):
    """The gguf.quants types go in rows of ~GGUF_ROW_ELEMENTS (rows of one block were ~180x slower for BF16): the
    bytes equal gguf.quants block by block, with a tail of blocks that fills no wide row."""
    import gguf
    from gguf import quants as gq

    elems = Q.BLOCK[ggml_type][0]
    n_blocks = 2 * max(1, encode.GGUF_ROW_ELEMENTS // elems) + 3
    x = _gaussian(n_blocks, ggml_type, seed=9)
    one_by_one = gq.quantize(x.reshape(-1, elems), gguf.GGMLQuantizationType(ggml_type)).view(np.uint8).reshape(-1)
    assert np.array_equal(encode.encode(x, ggml_type), one_by_one)
    assert np.array_equal(encode.encode(x[:elems], ggml_type), one_by_one[:Q.BLOCK[ggml_type][1]])
