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
static inline u32 h2_pack(float lo, float hi) {  // cvt.rn.f16x2.f32
    _Float16 a = (_Float16)lo, b = (_Float16)hi;
    u16 x, y;
    std::memcpy(&x, &a, 2);
    std::memcpy(&y, &b, 2);
    return x | ((u32)y << 16);
}
static inline u32 h2_fma(u32 a, u32 b, u32 c) {  // fma.rn.f16x2: the exact a * b + c (in double), rounded once
    u32 r = 0;
    for (int h = 0; h < 2; ++h) {
        _Float16 x, y, z;
        const u16 xa = (u16)(a >> (16 * h)), xb = (u16)(b >> (16 * h)), xc = (u16)(c >> (16 * h));
        std::memcpy(&x, &xa, 2);
        std::memcpy(&y, &xb, 2);
        std::memcpy(&z, &xc, 2);
        _Float16 v = (_Float16)std::fma((double)x, (double)y, (double)z);
        u16 bits;
        std::memcpy(&bits, &v, 2);
        r |= (u32)bits << (16 * h);
    }
    return r;
}
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
extern "C" int tc_interleaved(void) { return QTcFrag<QTYPE>::interleaved; }
extern "C" int tc_split16(void) { return QTcFrag<QTYPE>::split16; }
extern "C" int tc_step_mins(void) { return QTcStepMins<QTYPE>::v; }
// lane t's A words of the step's mins MMA (mn of sub-blocks 2t, 2t+1 / 2t+8, 2t+9) and -dmin, of the block at blk
extern "C" void min_frag_words(const u8* blk, int t, u32* w, float* nd) {
    if constexpr (QTcStepMins<QTYPE>::v) qtc_min_frag<QTYPE>(blk, t, w[0], w[1], *nd);
}
extern "C" int tc_has_min(void) { return QHasMin<QTYPE>::v; }
extern "C" int tc_step_d(void) { return QTcStepD<QTYPE>::v; }
// qtc_step_d (the GEMV's span scale, loaded once a 256-element step) of each of n contiguous blocks
extern "C" void step_d_blocks(const u8* blocks, long n_blocks, float* d_out) {
    for (long b = 0; b < n_blocks; ++b) d_out[b] = qtc_step_d<QTYPE>(blocks + b * QBlock<QTYPE>::bytes);
}
// one lane's A words of group g of the block at blk (the tensor-core GEMV's qtc_frag)
extern "C" void frag_words(const u8* blk, int g, u32* A, u32* L, float* D, float* m) {
    u32 a[4], l[4] = {0, 0, 0, 0};
    *m = 0.0f;
    qtc_frag<QTYPE>(blk, g, a, l, *D, *m);
    for (int i = 0; i < 4; ++i) { A[i] = a[i]; L[i] = l[i]; }
}
// Q2_K's quad form (the GEMV's spans 4 at a time): lane t's A words of span sp (group 4 sp + t) of the block at blk,
// from the quad qtc_q2k_quad loads once for spans 4 (sp / 4) .. + 3; returns qalign_bad
extern "C" int q2k_quad_words(const u8* blk, int sp, int t, u32* A) {
    qalign_bad = 0;
    u32 a[4];
    const QTcQ2KQuad u = qtc_q2k_quad(blk, sp >> 2, t);
    qtc_q2k_quad_frag(u, sp & 3, a);
    for (int i = 0; i < 4; ++i) A[i] = a[i];
    return qalign_bad;
}
// qtc_frag's f16x2 words back in element order (hi + lo for QTcLo types), with D and m
extern "C" int decode_blocks_frag(const u8* blocks, long n_blocks, float* a_out, float* d_out, float* m_out) {
    typedef QBlock<QTYPE> QB;
    qalign_bad = 0;
    for (long b = 0; b < n_blocks; ++b)
        for (int g = 0; g < QB::qk / 8; ++g) {
            u32 A[4], L[4] = {0, 0, 0, 0};
            float D = 0.0f, m = 0.0f;
            qtc_frag<QTYPE>(blocks + b * QB::bytes, g, A, L, D, m);
            for (int k = 0; k < 8; ++k) {
                // word w, half h of element k: natural (k / 2, k % 2); interleaved (0,2) (1,3) (4,6) (5,7)
                const int w = QTcFrag<QTYPE>::interleaved ? (k & 4) / 2 + (k & 1) : k / 2;
                const int h = QTcFrag<QTYPE>::interleaved ? (k >> 1) & 1 : k & 1;
                const long i = b * QB::qk + qtc_elem<QTYPE>(g, k);  // (split16: 4g + k, then 16 + 4g + k - 4)
                a_out[i] = f16_bits_to_float((u16)(A[w] >> (16 * h))) + f16_bits_to_float((u16)(L[w] >> (16 * h)));
                d_out[i] = D;
                m_out[i] = m;
            }
        }
    return qalign_bad;
}
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
    lib.decode_blocks_tc.restype = lib.tc_needs_lo.restype = lib.decode_blocks_frag.restype = ctypes.c_int
    lib.decode_blocks_frag.argtypes = [ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 3
    lib.frag_words.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 4
    lib.tc_interleaved.restype = lib.tc_has_min.restype = lib.tc_split16.restype = ctypes.c_int
    lib.tc_step_mins.restype = lib.tc_step_d.restype = ctypes.c_int
    lib.step_d_blocks.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    lib.ggml_type = ggml_type
    lib.min_frag_words.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.q2k_quad_words.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.q2k_quad_words.restype = ctypes.c_int
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
    32-element span and m one per 16 elements, as the MMA's per-span scaling assumes; for the QTcStepD types (Q2_K)
    qtc_step_d, which the GEMV loads once a step, is that D for the whole block."""
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
        # qtc_frag (the MMA's A words, some types decoded straight to f16x2) holds qtc8's values, D and m
        fa, fd, fm = (np.empty(n_blocks * elems, np.float32) for _ in range(3))
        assert lib.decode_blocks_frag(blocks.ctypes.data, n_blocks, fa.ctypes.data, fd.ctypes.data,
                                      fm.ctypes.data) == 0, "qtc_frag assumed a wrong alignment"
        for what, x, y in (("a", fa, a), ("D", fd, d), ("m", fm, m)):
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            assert same.all(), f"{name}: qtc_frag's {what} differs from qtc8's at {np.flatnonzero(~same)[:5]}"
        if lib.tc_step_d():  # the GEMV's once-a-step D (QTcStepD) is qtc_frag's D of every group of the block
            assert elems == 256
            sd = np.empty(n_blocks, np.float32)
            lib.step_d_blocks(blocks.ctypes.data, n_blocks, sd.ctypes.data)
            per = np.repeat(sd, elems)
            same = (per == fd) | (np.isnan(per) & np.isnan(fd))
            assert same.all(), f"{name}: qtc_step_d differs from qtc_frag's D at {np.flatnonzero(~same)[:5]}"


def test_q2k_quad_words_are_qtc_frags(cxx, tmp_path):
    """Q2_K's quad form (quant_decode.cuh qtc_q2k_quad / qtc_q2k_quad_frag: the qs and scale bytes of a unit loaded
    once for four spans, as kernels/gemv_quant.cu's unrolled spans at T <= 2 decode) gives qtc_frag's A words bit for
    bit, for every span, lane and block, on real and raw (any bit pattern) blocks, at the 4-byte alignment of Q2_K
    blocks in the GEMV's stages."""
    _, _, lib = _decoder(cxx, tmp_path, Q.Q2_K)
    qk, size = Q.BLOCK[Q.Q2_K]
    rng = np.random.default_rng(93)
    n_blocks = 16
    real = random_tensor(rng, Q.Q2_K, (n_blocks * qk,), 0.05).reshape(n_blocks, size)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for name, blocks in (("real", real), ("raw", raw)):
        buf = _aligned_copy(np.concatenate([np.zeros((1, 4), np.uint8), blocks.reshape(1, -1)], axis=1))
        base = buf.ctypes.data + 4  # (every block of the copy 4 mod 16, 8 mod 16, ...: 84-byte blocks)
        for b in range(n_blocks):
            blk = base + b * size
            for sp in range(qk // 32):
                for t in range(4):
                    want, l = (ctypes.c_uint32 * 4)(), (ctypes.c_uint32 * 4)()
                    d, m = ctypes.c_float(), ctypes.c_float()
                    lib.frag_words(blk, 4 * sp + t, want, l, ctypes.byref(d), ctypes.byref(m))
                    got = (ctypes.c_uint32 * 4)()
                    assert lib.q2k_quad_words(blk, sp, t, got) == 0, "qtc_q2k_quad assumed a wrong alignment"
                    assert list(got) == list(want), f"{name}: block {b} span {sp} lane t {t}"


def _folded(lib, blocks: np.ndarray, n_elems: int):
    """qtc8's per-element (w, a, D, m) of contiguous raw blocks holding n_elems elements."""
    out = [np.empty(n_elems, np.float32) for _ in range(4)]
    n_blocks = n_elems // Q.BLOCK[lib.ggml_type][0]
    assert lib.decode_blocks_tc(blocks.ctypes.data, n_blocks, *(o.ctypes.data for o in out)) == 0
    return out


def _f16_words(lo, hi) -> int:
    return int(np.float16(lo).view(np.uint16)) | int(np.float16(hi).view(np.uint16)) << 16


def _halves(w: int) -> tuple[float, float]:
    return tuple(float(np.uint16(v).view(np.float16)) for v in (w & 0xFFFF, w >> 16))


def _mma(a_regs, b_regs):
    """mma.sync.m16n8k16.row.col f16 -> f32 from the 32 lanes' registers (PTX ISA fragment layouts; lane = 4g + t):
    A reg 0 = (row g, k 2t, 2t+1), 1 = (row g+8, same k), 2 = (row g, k 2t+8, 2t+9), 3 = (row g+8, same); B reg 0 =
    (k 2t, 2t+1; col g), 1 = (k 2t+8, 2t+9; col g). Returns C [16, 8] (float64: the products are exact)."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for r, (row, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[row, k:k + 2] = _halves(a_regs[lane][r])
        for r, k in enumerate((2 * t, 2 * t + 8)):
            B[k:k + 2, g] = _halves(b_regs[lane][r])
    return A @ B


@pytest.mark.parametrize("ggml_type", (Q.Q2_K, Q.Q4_0, Q.Q4_K, Q.Q6_K, Q.IQ2_XS, Q.NVFP4, Q.Q5_1, Q.IQ1_M),
                         ids=lambda t: Q.TYPE_NAMES[t])
def test_tensor_core_span_arithmetic(cxx, tmp_path, ggml_type):
    """One m tile x one 32-element span of kernels/gemv_quant.cu qtc_grouped, replayed lane by lane in numpy with the
    host-compiled qtc_frag and the PTX fragment layouts: the A words, the x pairs of B (hi + lo, interleaved for the
    straight-to-f16 decoders), the per-span D scaling, the mins' x sums of each half gathered by the kernel's
    shuffles, and C's entries per lane, against the dequantized dot product. Catches a layout mismatch the device
    would only show as wrong numbers."""
    _, _, lib = _decoder(cxx, tmp_path, ggml_type)
    qk, size = Q.BLOCK[ggml_type]
    rng = np.random.default_rng(70 + ggml_type)
    n_in = max(qk, 64)
    w = _aligned_copy(random_tensor(rng, ggml_type, (16, n_in), 0.05))
    want_w = Q.dequantize(w, ggml_type).reshape(16, n_in).astype(np.float64)
    inter, lo_parts, has_min = lib.tc_interleaved(), lib.tc_needs_lo(), lib.tc_has_min()
    split16, step_mins = lib.tc_split16(), lib.tc_step_mins()
    assert not (split16 and has_min), "split16 (a lane's group spans both halves of a span) has no mins' term"
    if step_mins:  # the mins are the step's MMA (test_tensor_core_step_mins): the spans sum D a x alone
        want_w = want_w - _folded(lib, w, 16 * n_in)[3].reshape(16, n_in)
        has_min = False
    for e0 in range(0, n_in, 32):  # every span of the row
        x = rng.standard_normal((8, n_in)).astype(np.float32)
        A, L, D, M = {}, {}, {}, {}
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            el = e0 + 8 * t
            for h in range(2):
                a, lo = (ctypes.c_uint32 * 4)(), (ctypes.c_uint32 * 4)()
                d, m = ctypes.c_float(), ctypes.c_float()
                blk = w.ctypes.data + (g + 8 * h) * w.shape[1] + (el // qk) * size
                lib.frag_words(blk, el % qk // 8, a, lo, ctypes.byref(d), ctypes.byref(m))
                A[lane, h], L[lane, h], D[lane, h], M[lane, h] = list(a), list(lo), d.value, m.value
        c = np.zeros((32, 4))
        for kt in range(2):
            a_regs = [(A[n, 0][2 * kt], A[n, 1][2 * kt], A[n, 0][2 * kt + 1], A[n, 1][2 * kt + 1]) for n in range(32)]
            l_regs = [(L[n, 0][2 * kt], L[n, 1][2 * kt], L[n, 0][2 * kt + 1], L[n, 1][2 * kt + 1]) for n in range(32)]
            bh, bl = [], []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                # the lane's x: elements 8t .. 8t+7 of the span, split16: 4t .. 4t+3 and 16+4t .. 16+4t+3
                xv = (np.concatenate([x[g, e0 + 4 * t:e0 + 4 * t + 4], x[g, e0 + 16 + 4 * t:e0 + 20 + 4 * t]])
                      if split16 else x[g, e0 + 8 * t:e0 + 8 * t + 8])
                hi_w, lo_w = [], []
                for p in range(2):
                    k0 = 4 * kt + p if inter else 4 * kt + 2 * p
                    pair = xv[[k0, k0 + (2 if inter else 1)]]
                    hi = pair.astype(np.float16).astype(np.float32)
                    hi_w.append(_f16_words(*hi))
                    lo_w.append(_f16_words(*(pair - hi)))
                bh.append(hi_w)
                bl.append(lo_w)
            C = _mma(a_regs, bl) + _mma(a_regs, bh) + (_mma(l_regs, bh) if lo_parts else 0)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                c[lane] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
        # the kernel's sx shuffles: s8 per lane, + lane ^ 1, then lane 4 (2t + c) + 2 hf
        s8 = [float(x[n >> 2, e0 + 8 * (n & 3):e0 + 8 * (n & 3) + 8].astype(np.float64).sum()) for n in range(32)]
        s8 = [s8[n] + s8[n ^ 1] for n in range(32)]
        got = np.zeros((16, 8))
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for k in range(4):
                h, col = k >> 1, k & 1
                v = D[lane, h] * c[lane, k]
                if has_min:
                    other = M[lane ^ 2, h]
                    m0, m1 = (M[lane, h], other) if t < 2 else (other, M[lane, h])
                    v += m0 * s8[4 * (2 * t + col)] + m1 * s8[4 * (2 * t + col) + 2]
                got[g + 8 * h, 2 * t + col] = v
        want = want_w[:, e0:e0 + 32] @ x[:, e0:e0 + 32].astype(np.float64).T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(),
                                   err_msg=f"{Q.TYPE_NAMES[ggml_type]} span at {e0}")


def test_tensor_core_step_mins(cxx, tmp_path):
    """Q2_K's mins in kernels/gemv_quant.cu qtc_grouped: once a step (a block), one MMA whose k is the 16 sub-blocks
    (A: quant_decode.cuh qtc_min_frag's 4-bit mins, B: the sub-block sums of x, hi + lo, as the kernel gathers
    them), times -dmin per row, replayed lane by lane against sum_k m_k x_k of qtc8's mins."""
    _, _, lib = _decoder(cxx, tmp_path, Q.Q2_K)
    assert lib.tc_step_mins()
    qk, size = Q.BLOCK[Q.Q2_K]
    rng = np.random.default_rng(91)
    w = _aligned_copy(random_tensor(rng, Q.Q2_K, (16, qk), 0.05))
    m = _folded(lib, w, 16 * qk)[3].reshape(16, qk).astype(np.float64)
    for scale in (1.0, 3e4, 1e9):  # sub-block sums past 2^15 (and past f16 x 2^16): the kernel's column scaling
        x = (rng.standard_normal((8, qk)) * scale).astype(np.float32)
        xsb = x.reshape(8, 16, 16).sum(axis=2, dtype=np.float32)  # [column, sub-block]
        a_regs, bh, bl, nd = [], [], [], {}
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            words = {}
            for h in range(2):
                wv, d = (ctypes.c_uint32 * 2)(), ctypes.c_float()
                lib.min_frag_words(w.ctypes.data + (g + 8 * h) * size, t, wv, ctypes.byref(d))
                words[h], nd[lane, h] = list(wv), d.value
            a_regs.append((words[0][0], words[1][0], words[0][1], words[1][1]))
            big = np.abs(xsb[g]).max() >= 32768
            hi_w, lo_w = [], []
            for k0 in (2 * t, 2 * t + 8):
                pair = xsb[g, [k0, k0 + 1]] * np.float32(2.0 ** -20 if big else 1.0)
                hi = pair.astype(np.float16).astype(np.float32)
                hi_w.append(_f16_words(*hi))
                lo_w.append(_f16_words(*(pair - hi)))
            bh.append(hi_w)
            bl.append(lo_w)
        C = _mma(a_regs, bl) + _mma(a_regs, bh)
        got = np.zeros((16, 8))
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for k in range(4):
                h, col = k >> 1, k & 1
                unscale = 2.0 ** 20 if np.abs(xsb[2 * t + col]).max() >= 32768 else 1.0
                got[g + 8 * h, 2 * t + col] = nd[lane, h] * unscale * C[g + 8 * h, 2 * t + col]
        want = m @ x.astype(np.float64).T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"scale {scale}")
