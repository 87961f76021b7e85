"""Dequantization of the tensor types strata reads, bit-identical to gguf.quants.dequantize.

Raw tensors arrive as numpy arrays in numpy order: typed for F32/F16, uint8 byte rows for BF16/Q8_0.
"""

from __future__ import annotations

import numpy as np

# GGML type ids (gguf.GGMLQuantizationType values), kept here so the hot path needs no gguf import.
F32, F16, Q8_0, BF16 = 0, 1, 8, 30
TYPE_NAMES = {F32: "F32", F16: "F16", Q8_0: "Q8_0", BF16: "BF16"}
SUPPORTED = frozenset(TYPE_NAMES)
# (elements per block, bytes per block)
BLOCK = {F32: (1, 4), F16: (1, 2), Q8_0: (32, 34), BF16: (1, 2)}
QK8_0 = 32
Q8_0_BLOCK_BYTES = 34


def row_bytes(ggml_type: int, n: int) -> int:
    elems, size = BLOCK[ggml_type]
    return n // elems * size


def dequant_bf16(raw: np.ndarray) -> np.ndarray:
    """uint8 (..., 2n) -> float32 (..., n)."""
    bits = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    """uint8 (..., 34 * nblocks) -> float32 (..., 32 * nblocks); block = fp16 scale d, 32 int8 q; x = d * q."""
    raw = np.ascontiguousarray(raw)
    lead = raw.shape[:-1]
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (d * q).reshape(*lead, -1)


def dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    if ggml_type == F32:
        return np.asarray(raw, dtype=np.float32)
    if ggml_type == F16:
        return np.asarray(raw).astype(np.float32)
    if ggml_type == BF16:
        return dequant_bf16(raw)
    if ggml_type == Q8_0:
        return dequant_q8_0(raw)
    raise ValueError(f"unsupported GGML type {ggml_type}")


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 (..., n) -> uint8 (..., 34 * n/32), ggml's reference rounding (half away from zero)."""
    x = np.asarray(x, dtype=np.float32)
    lead = x.shape[:-1]
    blocks = x.reshape(-1, QK8_0)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = amax / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d > 0, 1.0 / d, 0.0)
    scaled = blocks * inv
    q = (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int8)
    out = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*lead, -1)


def quantize_bf16(x: np.ndarray) -> np.ndarray:
    """float32 (..., n) -> uint8 (..., 2n), round to nearest even (NaN kept quiet), as gguf/ggml do."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    out = np.where(nan, (bits >> 16) | 64, rounded).astype(np.uint16)
    return out.view(np.uint8).reshape(*x.shape[:-1], -1)


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """Encode float32 (numpy order) as the raw array a GGUF writer takes for this type."""
    if ggml_type == F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if ggml_type == F16:
        return np.ascontiguousarray(x, dtype=np.float16)
    if ggml_type == BF16:
        return quantize_bf16(x)
    if ggml_type == Q8_0:
        return quantize_q8_0(x)
    raise ValueError(f"unsupported GGML type {ggml_type}")
