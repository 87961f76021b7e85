"""Valid quantized blocks of every block type, written directly (no float tensor, no quantizer): random codes plus
scale fields chosen so that the dequantized values have a target standard deviation.

What for: kernel and decoder tests and benches (tests/test_quants.py, test_gpu_quant.py, bench/*) that want every
code field of a type exercised, cheaply and independently of any encoder; make-model does not use them (it
quantizes the F32 model's values, synth/encode.py). A random block is as valid as a quantizer's: every code field
decodes (grid ids, sign ids, 6-bit scales are all in range by construction).

How the scales are set, per type (layouts in strata_cli/model/quants.py):
  * every code byte is uniform random (sub-block scales and mins too), except where a quantizer never writes a
    value: Q8_0 codes -128 become -127, TQ1_0 bytes are packs of 5 base-3 digits (0..242 scaled by 256/243), TQ2_0
    2-bit codes are 0..2;
  * the block scale (fp16 d; the e8m0 exponent of MXFP4; the four ue4m3 scales of NVFP4; IQ1_M's d spread over the
    top nibbles of its four scale words) is std / rms(type) times a per-block factor uniform in [0.5, 1.5), where
    rms(type) is the root mean square of the values that blocks with d = 1 decode to (measured once per type
    with gguf.quants.dequantize);
  * the types with a min (Q4_1, Q5_1: m; Q2_K, Q4_K, Q5_K: dmin) get the one that makes a block's expected value 0:
    m = -d * mean(q), dmin = d * mean(q) (sub-block scales and mins are identically distributed).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..model import quants as Q

# byte offset of the fp16 block scale d, and of the fp16 min (m or dmin; None: the type has none)
_D_AT = {Q.Q4_0: 0, Q.Q4_1: 0, Q.Q5_0: 0, Q.Q5_1: 0, Q.Q8_0: 0, Q.Q2_K: 80, Q.Q3_K: 108, Q.Q4_K: 0, Q.Q5_K: 0,
         Q.Q6_K: 208, Q.IQ2_XXS: 0, Q.IQ2_XS: 0, Q.IQ2_S: 0, Q.IQ3_XXS: 0, Q.IQ3_S: 0, Q.IQ1_S: 0, Q.IQ4_NL: 0,
         Q.IQ4_XS: 0, Q.TQ1_0: 52, Q.TQ2_0: 64}
# (byte offset of the min, the min in units of d: mean code value times the sign the format applies)
_MIN_AT = {Q.Q4_1: (2, -7.5), Q.Q5_1: (2, -15.5), Q.Q2_K: (82, 1.5), Q.Q4_K: (2, 7.5), Q.Q5_K: (2, 15.5)}


def _random_bytes(rng: np.random.Generator, n_blocks: int, nbytes: int) -> np.ndarray:
    words = -(-n_blocks * nbytes // 8)
    return rng.bit_generator.random_raw(words).view(np.uint8)[:n_blocks * nbytes].reshape(n_blocks, nbytes)


def _put_f16(blocks: np.ndarray, at: int, values: np.ndarray) -> None:
    blocks[:, at:at + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _fix_codes(blocks: np.ndarray, ggml_type: int, rng: np.random.Generator) -> None:
    """Code values a quantizer never writes, mapped into its range."""
    if ggml_type == Q.Q8_0:
        codes = blocks[:, 2:].view(np.int8)
        np.maximum(codes, -127, out=codes)
    elif ggml_type == Q.TQ1_0:
        digits = rng.integers(0, 243, size=(blocks.shape[0], 52), dtype=np.uint16)
        blocks[:, :52] = ((digits * 256 + 242) // 243).astype(np.uint8)
    elif ggml_type == Q.TQ2_0:  # 2-bit codes 0..2 (value code - 1): code 3 never occurs
        codes = rng.integers(0, 3, size=(blocks.shape[0], 64, 4), dtype=np.uint8)
        blocks[:, :64] = codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)


def _set_scales(blocks: np.ndarray, ggml_type: int, d: np.ndarray) -> None:
    """Write per-block scale d (float32 [n_blocks]) into the type's scale fields (and the matching min)."""
    if ggml_type == Q.MXFP4:  # e8m0: value 2^(e - 128) (gguf's e8m0_to_fp32_half), e >= 2
        e = np.clip(np.rint(np.log2(np.maximum(d, 1e-30))) + 128, 2, 254)
        blocks[:, 0] = e.astype(np.uint8)
    elif ggml_type == Q.NVFP4:  # four ue4m3 scales (value u / 2 with the doubled e2m1 table)
        from gguf.quants import NVFP4

        for j in range(4):
            blocks[:, j] = NVFP4.fp32_to_ue4m3(2.0 * d * (0.75 + 0.5 * (j % 2))).astype(np.uint8)
    elif ggml_type == Q.IQ1_M:  # d = the top nibbles of the four u16 scale words (IQ1_M's split fp16)
        bits = d.astype(np.float16).view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16)
        for j in range(4):
            words[:, j] = (words[:, j] & 0x0FFF) | (((bits >> (4 * j)) & 0xF) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
    else:
        _put_f16(blocks, _D_AT[ggml_type], d)
        if ggml_type in _MIN_AT:
            at, ratio = _MIN_AT[ggml_type]
            _put_f16(blocks, at, d * np.float32(ratio))


def _blocks(rng: np.random.Generator, ggml_type: int, n_blocks: int, d: np.ndarray) -> np.ndarray:
    blocks = _random_bytes(rng, n_blocks, Q.BLOCK[ggml_type][1])
    _fix_codes(blocks, ggml_type, rng)
    _set_scales(blocks, ggml_type, d)
    return blocks


@lru_cache(maxsize=None)
def unit_rms(ggml_type: int) -> float:
    """Root mean square of the values random blocks with scale 1 decode to (seeded: the same in every run)."""
    rng = np.random.Generator(np.random.SFC64(ggml_type))
    n = 4096 // Q.BLOCK[ggml_type][0] * 8
    blocks = _blocks(rng, ggml_type, n, np.ones(n, np.float32))
    values = Q.dequantize(blocks.reshape(-1), ggml_type).astype(np.float64)
    return float(np.sqrt(np.mean(values * values)))


def random_blocks(rng: np.random.Generator, ggml_type: int, n_blocks: int, std: float) -> np.ndarray:
    """uint8 [n_blocks, block bytes]: valid blocks whose values have about `std` as their standard deviation."""
    if ggml_type not in Q.BLOCK_TYPES:
        raise ValueError(f"{Q.TYPE_NAMES.get(ggml_type, ggml_type)} is not a block-quantized type")
    spread = rng.random(n_blocks, dtype=np.float32) + np.float32(0.5)
    d = spread * np.float32(std / unit_rms(ggml_type))
    return _blocks(rng, ggml_type, n_blocks, d)


def random_tensor(rng: np.random.Generator, ggml_type: int, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Raw uint8 array in numpy order (..., row bytes) of a tensor of numpy shape (..., n): rows of whole blocks."""
    *lead, n = shape
    elems, _ = Q.BLOCK[ggml_type]
    if n % elems:
        raise ValueError(f"rows of {n} do not hold whole {Q.TYPE_NAMES[ggml_type]} blocks of {elems}")
    blocks = random_blocks(rng, ggml_type, math.prod(lead) * (n // elems), std)
    return blocks.reshape(*lead, -1)
