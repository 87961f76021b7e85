"""Valid random tensors of every GGML type the CPU pool reads, as the GGUF stores them: random codes and finite
scales of both signs (some zero), for the pool's tests and bench/pool_bench.py."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as GT
from gguf import quants as gq

# byte offsets of each type's f16 scale fields in a block
SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
          "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,),
          "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
          "IQ1_M": (), "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": ()}
FLOATS = ("F32", "F16", "BF16")


def block_elems(type_name: str) -> int:
    """Weights per block (1 for the float types)."""
    return 1 if type_name in FLOATS else GGML_QUANT_SIZES[GT[type_name]][0]


def random_raw(type_name: str, rows: int, n: int, rng) -> np.ndarray:
    """[rows, row bytes | n] raw data of a valid tensor of `rows` rows of n weights."""
    if type_name == "F32":
        return rng.standard_normal((rows, n)).astype(np.float32) * 0.1
    if type_name == "F16":
        return (rng.standard_normal((rows, n)) * 0.1).astype(np.float16)
    if type_name == "BF16":
        return gq.quantize(rng.standard_normal((rows, n)).astype(np.float32) * 0.1, GT.BF16)
    block, size = GGML_QUANT_SIZES[GT[type_name]]
    raw = rng.integers(0, 256, size=(rows, n // block, size), dtype=np.uint8)
    for off in SCALES[type_name]:
        d = (rng.uniform(0.0002, 0.002, size=raw.shape[:2]) * rng.choice([-1, 1, 1, 1], size=raw.shape[:2]))
        d.reshape(-1)[::17] = 0.0
        raw[:, :, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    if type_name == "IQ1_M":  # the fp16 d lives in the top nibbles of the four u16 scale words at 48..55
        d = (rng.uniform(0.0002, 0.002, size=raw.shape[:2]) * rng.choice([-1, 1], size=raw.shape[:2]))
        bits = d.astype(np.float16).view(np.uint16)
        words = raw[:, :, 48:56].copy().view(np.uint16) & 0x0FFF
        for i in range(4):
            words[..., i] |= ((bits >> (4 * i)) & 0xF) << 12
        raw[:, :, 48:56] = words.view(np.uint8)
    if type_name == "MXFP4":  # e8m0 exponents near 2^-8 (0 and 1 decode to subnormal halves: kept in)
        raw[:, :, 0] = rng.choice(np.r_[0, 1, np.arange(110, 125)], size=raw.shape[:2])
    if type_name == "NVFP4":  # ue4m3 scales, small and subnormal ones, zero and 0x7F (both decode to 0)
        raw[:, :, 0:4] = rng.choice(np.r_[0, 1, 5, 0x7F, np.arange(0x20, 0x38)], size=(*raw.shape[:2], 4))
    return raw.reshape(rows, -1)


def dequant_ref(raw: np.ndarray, type_name: str) -> np.ndarray:
    """gguf's numpy dequantization (the format reference) of rows of raw data."""
    if type_name in ("F32", "F16"):
        return raw.astype(np.float32)
    return gq.dequantize(raw, GT[type_name])
