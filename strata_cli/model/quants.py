"""GGUF tensor types strata reads: the one table of block layouts, and dequantization bit-identical to
gguf.quants.dequantize (the format reference, itself bit-identical to ggml's dequantization).

Raw tensors arrive as numpy arrays in numpy order: typed for F32/F16, uint8 byte rows for every other type
(row = n / block elements * block bytes). F32/F16/BF16/Q8_0 are decoded here (the hot path of the float files);
every other type is decoded by gguf.quants' own numpy code, imported on first use (tests/test_quants.py holds
the table and the decoders to gguf.quants on random blocks of every type). The device twins, one decoder per type,
are in kernels/quant_decode.cuh (tests/test_quant_decode_host.py compiles them for the CPU and holds them to
gguf.quants bit for bit).

Block layouts (offsets in bytes inside one block; "d" fp16 little endian unless said; QK_K = 256):
  Q4_0   32 / 18   d, qs[16]: element j<16 = low nibble of qs[j], j>=16 = high nibble of qs[j-16]; w = d*(q-8)
  Q4_1   32 / 20   d, m, qs[16] as Q4_0; w = d*q + m
  Q5_0   32 / 22   d, qh u32 (bit j = 5th bit of element j), qs[16] as Q4_0; w = d*(q-16)
  Q5_1   32 / 24   d, m, qh u32, qs[16]; w = d*q + m
  Q8_0   32 / 34   d, int8 q[32]; w = d*q
  Q2_K  256 / 84   scales[16] (lo nibble scale, hi nibble min, per 16), qs[64] (2-bit, 4 planes of 32 per 128),
                   d, dmin; w = d*sc*q - dmin*m
  Q3_K  256 / 110  hmask[32], qs[64] (2-bit as Q2_K), scales[12] (16 x 6-bit, -32), d; w = d*sc*(q - 4*!hbit)
  Q4_K  256 / 144  d, dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128] (per 64: 32 bytes, lo nibbles
                   = first 32, hi = next 32); w = d*sc*q - dmin*m
  Q5_K  256 / 176  d, dmin, scales[12], qh[32] (bit j of byte i = 5th bit of element 32j+i), qs[128] as Q4_K
  Q6_K  256 / 210  ql[128], qh[64], int8 scales[16], d; w = d*sc*(q-32)
  IQ2_XXS 256 / 66   d, per 32: u32 grid bytes (4 x 8-value grid ids), u32 (4 x 7-bit sign ids, 4-bit scale)
  IQ2_XS  256 / 74   d, qs u16[32] (9-bit grid id, 7-bit sign id), scales[8] (two 4-bit per 32)
  IQ2_S   256 / 82   d, qs[32] (grid id low 8 bits), signs[32] (bits), qh[8] (2 high bits per id), scales[8]
  IQ3_XXS 256 / 98   d, qs[64] (4-value grid ids), per 32: u32 (4 x 7-bit sign ids, 4-bit scale)
  IQ3_S   256 / 110  d, qs[64], qh[8] (9th id bit), signs[32], scales[4] (4-bit, w scale 1 + 2s)
  IQ1_S   256 / 50   d, qs[32] (grid id low 8 bits), qh u16[8] (3 high bits x4, 3-bit scale, delta sign)
  IQ1_M   256 / 56   qs[32], qh[16] (3 high id bits + delta sign per 8), scales u16[4] (3-bit scales; the fp16 d
                     is the top nibbles of the four u16)
  IQ4_NL  32 / 18    d, qs[16] nibbles as Q4_0 into the 16-entry non-linear table
  IQ4_XS 256 / 136   d, scales_h u16, scales_l[4], qs[128] (per 32: 16 bytes as IQ4_NL); w = d*(s-32)*table[q]
  TQ1_0  256 / 54    qs[48] (5 base-3 digits per byte), qh[4] (4 digits per byte), d; w = d*(digit-1)
  TQ2_0  256 / 66    qs[64] (2-bit, 4 planes of 32), d; w = d*(q-1)
  MXFP4   32 / 17    e8m0 exponent e, qs[16] nibbles as Q4_0 into the doubled e2m1 table; w = 2^(e-128) * k[q]
  NVFP4   64 / 36    4 ue4m3 scales (one per 16), qs[32] (per 16: 8 bytes, lo nibbles first 8, hi next 8)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# GGML type ids (gguf.GGMLQuantizationType values), kept here so the hot path needs no gguf import.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
IQ1_M, BF16, TQ1_0, TQ2_0, MXFP4, NVFP4 = 29, 30, 34, 35, 39, 40


@dataclass(frozen=True)
class QuantType:
    """One GGUF tensor type: `block` elements stored in `nbytes` bytes (layouts in the module docstring). `grid` /
    `values`: the gguf.quants type whose i-quant grid / 16 non-linear values the type's decoders look up (the
    kernels' copies are generated from it: model/quant_tables.py)."""

    id: int
    name: str
    block: int
    nbytes: int
    grid: str = ""
    values: str = ""

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.block


# Every type strata reads, in GGML id order: the one description of a type (the C/CUDA type ids, block sizes and
# tables are generated from it, model/quant_tables.py). The sizes are gguf.constants.GGML_QUANT_SIZES' (a test checks).
QUANT_TYPES: dict[int, QuantType] = {t.id: t for t in (
    QuantType(F32, "F32", 1, 4), QuantType(F16, "F16", 1, 2),
    QuantType(Q4_0, "Q4_0", 32, 18), QuantType(Q4_1, "Q4_1", 32, 20),
    QuantType(Q5_0, "Q5_0", 32, 22), QuantType(Q5_1, "Q5_1", 32, 24), QuantType(Q8_0, "Q8_0", 32, 34),
    QuantType(Q2_K, "Q2_K", 256, 84), QuantType(Q3_K, "Q3_K", 256, 110), QuantType(Q4_K, "Q4_K", 256, 144),
    QuantType(Q5_K, "Q5_K", 256, 176), QuantType(Q6_K, "Q6_K", 256, 210),
    QuantType(IQ2_XXS, "IQ2_XXS", 256, 66, grid="IQ2_XXS"), QuantType(IQ2_XS, "IQ2_XS", 256, 74, grid="IQ2_XS"),
    QuantType(IQ3_XXS, "IQ3_XXS", 256, 98, grid="IQ3_XXS"), QuantType(IQ1_S, "IQ1_S", 256, 50, grid="IQ1_S"),
    QuantType(IQ4_NL, "IQ4_NL", 32, 18, values="IQ4_NL"), QuantType(IQ3_S, "IQ3_S", 256, 110, grid="IQ3_S"),
    QuantType(IQ2_S, "IQ2_S", 256, 82, grid="IQ2_S"), QuantType(IQ4_XS, "IQ4_XS", 256, 136, values="IQ4_NL"),
    QuantType(IQ1_M, "IQ1_M", 256, 56, grid="IQ1_S"), QuantType(BF16, "BF16", 1, 2),
    QuantType(TQ1_0, "TQ1_0", 256, 54), QuantType(TQ2_0, "TQ2_0", 256, 66),
    QuantType(MXFP4, "MXFP4", 32, 17, values="MXFP4"), QuantType(NVFP4, "NVFP4", 64, 36, values="MXFP4"),
)}
TYPE_NAMES = {t.id: t.name for t in QUANT_TYPES.values()}
TYPE_IDS = {t.name: t.id for t in QUANT_TYPES.values()}
SUPPORTED = frozenset(QUANT_TYPES)
FLOAT_TYPES = frozenset((F32, F16, BF16))
# Block types (every type but the three float ones), the ones kernels/gemv_quant.cu reads.
BLOCK_TYPES = tuple(t for t in QUANT_TYPES if t not in FLOAT_TYPES)
# (elements per block, bytes per block)
BLOCK = {t.id: (t.block, t.nbytes) for t in QUANT_TYPES.values()}
QK_K = 256
QK8_0 = 32
Q8_0_BLOCK_BYTES = 34


def row_bytes(ggml_type: int, n: int) -> int:
    elems, size = BLOCK[ggml_type]
    return n // elems * size


def fits(ggml_type: int, n: int) -> bool:
    """Rows of n elements hold whole blocks of this type."""
    return n % BLOCK[ggml_type][0] == 0


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
    if ggml_type not in QUANT_TYPES:
        raise ValueError(f"unsupported GGML type {ggml_type}")
    return dequant_gguf(raw, ggml_type)


def dequant_gguf(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """uint8 (..., row bytes) -> float32 (..., n) through gguf.quants (the reference decoder of the type)."""
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.size == 0:
        elems, size = BLOCK[ggml_type]
        return np.zeros((*raw.shape[:-1], raw.shape[-1] // size * elems), np.float32)
    return gq.dequantize(raw, GGMLQuantizationType(ggml_type))


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
