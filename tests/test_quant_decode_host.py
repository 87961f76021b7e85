"""The device decoders of kernels/quant_decode.cuh, compiled for the CPU with the host C++ compiler (strict IEEE
float, no contraction), against gguf.quants.dequantize bit for bit on random blocks of every type: the decoders of
the GPU GEMVs checked in CI, where no GPU is (skipped without a C++ compiler)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from strata_cli.gpu import quant_source as S
from strata_cli.gpu.compile import kernels_dir
from strata_cli.model import quants as Q
from strata_cli.synth.blocks import random_tensor

# Stand-ins for the CUDA intrinsics quant_decode.cuh uses; f16 decoded in software.
SHIM = r"""
#include <cmath>
#include <cstddef>
#include <cstring>
#define QUANT_DECODE_HOST 1
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
struct uint2 { u32 x, y; };
static inline uint2 make_uint2(u32 x, u32 y) { uint2 v; v.x = x; v.y = y; return v; }
template <class T> static inline T __ldg(const T* p) { T v; std::memcpy(&v, p, sizeof v); return v; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline int __popc(u32 x) { return __builtin_popcount(x); }
static inline float __uint_as_float(u32 u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline u32 __byte_perm(u32 x, u32 y, u32 s) {  // PTX prmt, default mode (a selector's msb sign-extends)
    u8 in[8], out[4];
    std::memcpy(in, &x, 4);
    std::memcpy(in + 4, &y, 4);
    for (int n = 0; n < 4; ++n) {
        const u32 sel = (s >> (4 * n)) & 15u;
        out[n] = (sel & 8u) ? ((in[sel & 7u] & 0x80u) ? 0xffu : 0u) : in[sel & 7u];
    }
    u32 r;
    std::memcpy(&r, out, 4);
    return r;
}
static int qalign_bad = 0;  // set when a q-form decoder loads an address below the alignment it assumes
static inline float f16_bits_to_float(u16 h) {
    const u32 sign = (u32)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    u32 bits;
    if (e == 31) bits = sign | 0x7f800000u | (m << 13);
    else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) bits = sign;
    else { float f = std::ldexp((float)m, -24); std::memcpy(&bits, &f, 4); bits |= sign; }
    return __uint_as_float(bits);
}
"""
HARNESS = r"""
#include "quant_decode.cuh"
extern "C" void decode_blocks(const u8* blocks, long n_blocks, float* out) {
    typedef QBlock<QTYPE> QB;
    for (long b = 0; b < n_blocks; ++b)
        for (int g = 0; g < QB::qk / 8; ++g) {
            float w[8];
            decode8<QTYPE>(blocks + b * QB::bytes, g, w);
            for (int k = 0; k < 8; ++k) out[b * QB::qk + 8 * g + k] = w[k];
        }
}
// the staged GEMV's q-form: w_k = fl(fl(d * q_k) + m) (fl(d * q_k) without a min); returns qalign_bad
extern "C" int decode_blocks_q(const u8* blocks, long n_blocks, float* out) {
    typedef QBlock<QTYPE> QB;
    qalign_bad = 0;
    for (long b = 0; b < n_blocks; ++b)
        for (int g = 0; g < QB::qk / 8; ++g) {
            float q[8], d = 0.0f, m = 0.0f;
            qdec8<QTYPE>(blocks + b * QB::bytes, g, q, d, m);
            for (int k = 0; k < 8; ++k)
                out[b * QB::qk + 8 * g + k] = QHasMin<QTYPE>::v ? __fadd_rn(__fmul_rn(d, q[k]), m) : __fmul_rn(d, q[k]);
        }
    return qalign_bad;
}
// the tensor-core GEMV's folded q-form: w_k = fl(fl(D * a_k) + m); a, D and m per element for the span checks
extern "C" int decode_blocks_tc(const u8* blocks, long n_blocks, float* out, float* a_out, float* d_out,
                                float* m_out) {
    typedef QBlock<QTYPE> QB;
    qalign_bad = 0;
    for (long b = 0; b < n_blocks; ++b)
        for (int g = 0; g < QB::qk / 8; ++g) {
            float a[8], D = 0.0f, m = 0.0f;
            qtc8<QTYPE>(blocks + b * QB::bytes, g, a, D, m);
            for (int k = 0; k < 8; ++k) {
                const long i = b * QB::qk + 8 * g + k;
                out[i] = QHasMin<QTYPE>::v ? __fadd_rn(__fmul_rn(D, a[k]), m) : __fmul_rn(D, a[k]);
                a_out[i] = a[k];
                d_out[i] = D;
                m_out[i] = m;
            }
        }
    return qalign_bad;
}
extern "C" int tc_needs_lo(void) { return QTcLo<QTYPE>::v; }
"""


@pytest.fixture(scope="module")
def cxx():
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no C++ compiler")


def _decoder(cxx, tmp_path, ggml_type):
    src = tmp_path / f"decode_{S.variant(ggml_type)}.cpp"
    lib = src.with_suffix(".so")
    src.write_text(SHIM + S.prefix(S.variant(ggml_type)) + HARNESS)
    cmd = [cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing", "-shared", "-fPIC",
           f"-I{kernels_dir()}", "-o", str(lib), str(src)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lib = ctypes.CDLL(str(lib))
    fn, fn_q = lib.decode_blocks, lib.decode_blocks_q
    fn.argtypes = fn_q.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    fn_q.restype = ctypes.c_int
    lib.decode_blocks_tc.argtypes = [ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 4
    lib.decode_blocks_tc.restype = lib.tc_needs_lo.restype = ctypes.c_int
    return fn, fn_q, lib


def _aligned_copy(blocks: np.ndarray) -> np.ndarray:
    """blocks copied to a 16-byte aligned buffer (the GEMV stages blocks keeping their global address mod 16)."""
    buf = np.empty(blocks.nbytes + 16, np.uint8)
    start = -buf.ctypes.data % 16
    out = buf[start:start + blocks.nbytes].reshape(blocks.shape)
    out[...] = blocks
    return out


@pytest.mark.parametrize("ggml_type", S.TYPES, ids=[S.variant(t) for t in S.TYPES])
def test_device_decoder_is_bit_identical_to_gguf(cxx, tmp_path, ggml_type):
    """decode8 (the v1 GEMV and the gathers) and the q-form qdec8 (the staged v2 GEMV) both give gguf's floats."""
    decode, decode_q, _ = _decoder(cxx, tmp_path, ggml_type)
    elems, size = Q.BLOCK[ggml_type]
    rng = np.random.default_rng(ggml_type)
    n_blocks = 4096 // elems * 4
    real = random_tensor(rng, ggml_type, (n_blocks * elems,), 0.05).reshape(n_blocks, size)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)  # any bit pattern: NaN / inf scales too
    for blocks in (real, raw):
        blocks = _aligned_copy(blocks)
        with np.errstate(invalid="ignore", over="ignore"):
            want = gq.dequantize(blocks.reshape(-1), GT(ggml_type))
        got = np.empty(n_blocks * elems, np.float32)
        decode(blocks.ctypes.data, n_blocks, got.ctypes.data)
        got_q = np.empty(n_blocks * elems, np.float32)
        assert decode_q(blocks.ctypes.data, n_blocks, got_q.ctypes.data) == 0, "qdec8 assumed a wrong alignment"
        for name, values in (("decode8", got), ("qdec8", got_q)):
            np.testing.assert_array_equal(values.view(np.uint32)[~np.isnan(want)],
                                          want.view(np.uint32)[~np.isnan(want)], err_msg=name)
            np.testing.assert_array_equal(np.isnan(values), np.isnan(want), err_msg=name)


@pytest.mark.parametrize("ggml_type", S.TYPES, ids=[S.variant(t) for t in S.TYPES])
def test_tensor_core_folded_form_is_exact(cxx, tmp_path, ggml_type):
    """qtc8 (the tensor-core expert GEMVs' A operand): fl(fl(D a) + m) is gguf's float bit for bit; every a is exact
    in f16 (QTcLo types: an integer of at most 4096, split into two exact f16 by the GEMV); D is one value per
    32-element span and m one per 16 elements, as the MMA's per-span scaling assumes."""
    _, _, lib = _decoder(cxx, tmp_path, ggml_type)
    elems, size = Q.BLOCK[ggml_type]
    rng = np.random.default_rng(50 + ggml_type)
    n_blocks = 4096 // elems * 4
    real = random_tensor(rng, ggml_type, (n_blocks * elems,), 0.05).reshape(n_blocks, size)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for name, blocks in (("real", real), ("raw", raw)):
        blocks = _aligned_copy(blocks)
        with np.errstate(invalid="ignore", over="ignore"):
            want = gq.dequantize(blocks.reshape(-1), GT(ggml_type))
        got, a, d, m = (np.empty(n_blocks * elems, np.float32) for _ in range(4))
        assert lib.decode_blocks_tc(blocks.ctypes.data, n_blocks, got.ctypes.data, a.ctypes.data, d.ctypes.data,
                                    m.ctypes.data) == 0, "qtc8 assumed a wrong alignment"
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got.view(np.uint32)[ok], want.view(np.uint32)[ok], err_msg=name)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        if lib.tc_needs_lo():
            assert np.all(a == np.round(a)) and np.abs(a).max() <= 4096, name
            hi = a.astype(np.float16).astype(np.float32)
            assert np.all((a - hi).astype(np.float16).astype(np.float32) == a - hi), name
        else:
            np.testing.assert_array_equal(a.astype(np.float16).astype(np.float32), a, err_msg=f"{name}: a not f16")
        spans = d.reshape(-1, 32)
        same = (spans == spans[:, :1]) | (np.isnan(spans) & np.isnan(spans[:, :1]))
        assert same.all(), f"{name}: D changes inside a 32-element span"
        halves = m.reshape(-1, 16)
        assert ((halves == halves[:, :1]) | np.isnan(halves)).all(), f"{name}: m changes inside 16 elements"
