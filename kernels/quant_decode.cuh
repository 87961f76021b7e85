// quant_decode.cuh: one device decoder per GGUF block type, bit-identical to gguf.quants.dequantize (the layouts are
// in strata_cli/model/quants.py). Compiled once per type: QTYPE, the type ids and the type's tables (i-quant grids,
// non-linear value tables) come from strata_cli/model/quant_tables.py, which emits them from the quant table and
// gguf.quants' own numpy tables.
//
//   decode8(blk, g, w): w[0..7] = values 8g .. 8g+7 of the block starting at blk (g < QK / 8).
//
// Every product and sum is written as gguf's numpy evaluates it (left to right, each rounded to float32: __fmul_rn /
// __fadd_rn keep NVRTC from contracting them into FMAs), so a decoded weight is the float gguf gives, bit for bit.
// Scales that decode to float32 subnormals (MXFP4 exponents 0 and 1) are flushed by -ftz=true; quantizers never
// write them. Block starts are only byte aligned in general (MXFP4 is 17 bytes): loads check alignment at run time.
#pragma once
#ifndef QUANT_DECODE_HOST  // tests/test_quant_decode_host.py compiles these decoders with the host C++ compiler
#include "common.cuh"
#endif

// ---- type ids T_* and block geometry: generated from strata_cli/model/quants.py (model/quant_tables.py's
// types_header, put before the includer's source with the type's tables by gpu/quant_source.py)
#ifndef STRATA_QUANT_TYPES_H
#error "quant_decode.cuh needs the generated type table first (strata_cli/model/quant_tables.py device_prefix)"
#endif
template <int TYPE> struct QBlock;
#define QBLOCK(TYPE, QK, BYTES) \
    template <> struct QBlock<TYPE> { static constexpr int qk = QK, bytes = BYTES; };
QUANT_TYPES(QBLOCK)

// ---- loads (read-only path; widest load the address allows)
__device__ __forceinline__ u32 ldb(const u8* p) { return __ldg(p); }
__device__ __forceinline__ u32 pb(const u8* p) { return *p; }  // a plain load (shared memory: v2's stages)
__device__ __forceinline__ u32 ld16(const u8* p) {
    if (!((size_t)p & 1)) return __ldg(reinterpret_cast<const u16*>(p));
    return ldb(p) | (ldb(p + 1) << 8);
}
__device__ __forceinline__ u32 ld32(const u8* p) {
    if (!((size_t)p & 3)) return __ldg(reinterpret_cast<const u32*>(p));
    return ld16(p) | (ld16(p + 2) << 16);
}
// 8 bytes as (lo, hi) words
__device__ __forceinline__ uint2 ld64(const u8* p) {
    if (!((size_t)p & 7)) return __ldg(reinterpret_cast<const uint2*>(p));
    return make_uint2(ld32(p), ld32(p + 4));
}
__device__ __forceinline__ u32 byte_of(uint2 v, int k) { return ((k < 4 ? v.x : v.y) >> (8 * (k & 3))) & 0xffu; }
__device__ __forceinline__ float f16_at(const u8* p) { return f16_bits_to_float((u16)ld16(p)); }
__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }
// ggml's ksigns table: 7 sign bits plus the 8th making the count even (gguf.quants.IQ2_XXS.ksigns, checked in tests)
__device__ __forceinline__ u32 ksign(u32 i) { return i | ((__popc(i) & 1u) << 7); }

// 4-bit codes of the 32-element types: element j < 16 is the low nibble of qs[j], j >= 16 the high one of qs[j-16]
__device__ __forceinline__ void nibbles8(const u8* qs, int g, u32 (&q)[8]) {
    const uint2 v = ld64(qs + (g & 1) * 8);
    const int shift = (g >> 1) * 4;
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = (byte_of(v, k) >> shift) & 0xfu;
}

template <int TYPE>
__device__ __forceinline__ void decode8(const u8* __restrict__ b, int g, float (&w)[8]);

template <> __device__ __forceinline__ void decode8<T_Q4_0>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    nibbles8(b + 2, g, q);
    const float d = f16_at(b);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(d, (float)((int)q[k] - 8));
}

template <> __device__ __forceinline__ void decode8<T_Q4_1>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    nibbles8(b + 4, g, q);
    const float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fadd(fmul(d, (float)q[k]), m);
}

template <> __device__ __forceinline__ void decode8<T_Q5_0>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    nibbles8(b + 6, g, q);
    const u32 qh = ld32(b + 2) >> (8 * g);
    const float d = f16_at(b);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(d, (float)((int)(q[k] | (((qh >> k) & 1u) << 4)) - 16));
}

template <> __device__ __forceinline__ void decode8<T_Q5_1>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    nibbles8(b + 8, g, q);
    const u32 qh = ld32(b + 4) >> (8 * g);
    const float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fadd(fmul(d, (float)(q[k] | (((qh >> k) & 1u) << 4))), m);
}

// 2-bit planes of the 256-element types (Q2_K, Q3_K, TQ2_0): element e = 128c + 32k + l is bits 2k of byte 32c + l
__device__ __forceinline__ void crumbs8(const u8* qs, int g, u32 (&q)[8]) {
    const int e = 8 * g, c = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const uint2 v = ld64(qs + 32 * c + l);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = (byte_of(v, j) >> (2 * k)) & 3u;
}

template <> __device__ __forceinline__ void decode8<T_Q2_K>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    crumbs8(b + 16, g, q);
    const u32 sc = ldb(b + g / 2);  // one scale byte per 16 elements
    const float dl = fmul(f16_at(b + 80), (float)(sc & 0xfu)), ml = fmul(f16_at(b + 82), (float)(sc >> 4));
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fsub(fmul(dl, (float)q[k]), ml);
}

template <> __device__ __forceinline__ void decode8<T_Q3_K>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    crumbs8(b + 32, g, q);
    const int e = 8 * g, s = e >> 4;  // 16 six-bit scales: low 4 bits in bytes 0..7 (two per byte), high 2 in 8..11
    const u32 lo = (ldb(b + 96 + (s & 7)) >> (4 * (s >> 3))) & 0xfu;
    const u32 hi = (ldb(b + 96 + 8 + (s & 3)) >> (2 * (s >> 2))) & 3u;
    const float dl = fmul(f16_at(b + 108), (float)((int)(lo | (hi << 4)) - 32));
    const uint2 hm = ld64(b + (e & 31));  // hmask: bit e / 32 of byte e % 32
    const int bit = e >> 5;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int h = (byte_of(hm, k) >> bit) & 1;
        w[k] = fmul(dl, (float)((int)q[k] - (h ? 0 : 4)));
    }
}

// Q4_K / Q5_K: 8 six-bit scales and mins of the 32-element sub-blocks, packed in 12 bytes. PLAIN: plain loads
// (pb: the v2 kernels' stages in shared memory), else the read-only path (ldb).
template <bool PLAIN = false>
__device__ __forceinline__ void k_scale_min(const u8* s12, int j, u32& sc, u32& m) {
    const auto b = [](const u8* p) -> u32 { return PLAIN ? pb(p) : ldb(p); };
    if (j < 4) {
        sc = b(s12 + j) & 63u;
        m = b(s12 + 4 + j) & 63u;
    } else {
        const u32 md = b(s12 + 8 + (j - 4));
        sc = (md & 0xfu) | ((b(s12 + j - 4) >> 2) & 0x30u);
        m = (md >> 4) | ((b(s12 + j) >> 2) & 0x30u);
    }
}

template <> __device__ __forceinline__ void decode8<T_Q4_K>(const u8* b, int g, float (&w)[8]) {
    const int e = 8 * g, j = e >> 5, l = e & 31;
    u32 sc, m;
    k_scale_min(b + 4, j, sc, m);
    const float dl = fmul(f16_at(b), (float)sc), ml = fmul(f16_at(b + 2), (float)m);
    const uint2 v = ld64(b + 16 + 32 * (j >> 1) + l);
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fsub(fmul(dl, (float)((byte_of(v, k) >> shift) & 0xfu)), ml);
}

template <> __device__ __forceinline__ void decode8<T_Q5_K>(const u8* b, int g, float (&w)[8]) {
    const int e = 8 * g, j = e >> 5, l = e & 31;
    u32 sc, m;
    k_scale_min(b + 4, j, sc, m);
    const float dl = fmul(f16_at(b), (float)sc), ml = fmul(f16_at(b + 2), (float)m);
    const uint2 v = ld64(b + 48 + 32 * (j >> 1) + l), h = ld64(b + 16 + l);
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const u32 q = ((byte_of(v, k) >> shift) & 0xfu) | (((byte_of(h, k) >> j) & 1u) << 4);
        w[k] = fsub(fmul(dl, (float)q), ml);
    }
}

template <> __device__ __forceinline__ void decode8<T_Q6_K>(const u8* b, int g, float (&w)[8]) {
    const int e = 8 * g, c = e >> 7, r = e & 127;  // ql: e = 128c + 64h + l64; qh: e = 128c + 32k + l
    const uint2 lo = ld64(b + 64 * c + (r & 63)), hi = ld64(b + 128 + 32 * c + (r & 31));
    const int lshift = 4 * (r >> 6), hshift = 2 * (r >> 5);
    const float dl = fmul(f16_at(b + 208), (float)(signed char)ldb(b + 192 + (e >> 4)));
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int q = (int)(((byte_of(lo, k) >> lshift) & 0xfu) | (((byte_of(hi, k) >> hshift) & 3u) << 4)) - 32;
        w[k] = fmul(dl, (float)q);
    }
}

// i-quants: grid entries and signs; w = (db * grid value) * sign, as gguf
__device__ __forceinline__ void grid8_signed(float db, unsigned long long entry, u32 signs, float (&w)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float v = fmul(db, (float)((entry >> (8 * k)) & 0xffu));
        w[k] = (signs >> k) & 1u ? -v : v;
    }
}

__device__ __forceinline__ void grid4x2_signed(float db, u32 e0, u32 e1, u32 signs, float (&w)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float v = fmul(db, (float)(((k < 4 ? e0 : e1) >> (8 * (k & 3))) & 0xffu));
        w[k] = (signs >> k) & 1u ? -v : v;
    }
}

// db = d * (0.5 + s) * 0.25 (IQ2_*) evaluated as gguf: (d * (0.5 + s)) * 0.25
__device__ __forceinline__ float iq2_db(float d, u32 s) { return fmul(fmul(d, 0.5f + (float)s), 0.25f); }

#if defined(QGRID_N)
template <> __device__ __forceinline__ void decode8<T_IQ2_XXS>(const u8* b, int g, float (&w)[8]) {
    const int ib = g >> 2, l = g & 3;
    const u32 aux0 = ld32(b + 2 + 8 * ib), aux1 = ld32(b + 2 + 8 * ib + 4);
    const float db = iq2_db(f16_at(b), aux1 >> 28);
    grid8_signed(db, __ldg(QGRID + ((aux0 >> (8 * l)) & 0xffu)), ksign((aux1 >> (7 * l)) & 127u), w);
}

template <> __device__ __forceinline__ void decode8<T_IQ2_XS>(const u8* b, int g, float (&w)[8]) {
    const u32 q = ld16(b + 2 + 2 * g);
    const float db = iq2_db(f16_at(b), (ldb(b + 66 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 0xfu);
    grid8_signed(db, __ldg(QGRID + (q & 511u)), ksign(q >> 9), w);
}

template <> __device__ __forceinline__ void decode8<T_IQ2_S>(const u8* b, int g, float (&w)[8]) {
    const u32 id = ldb(b + 2 + g) | (((ldb(b + 66 + (g >> 2)) >> (2 * (g & 3))) & 3u) << 8);
    const float db = iq2_db(f16_at(b), (ldb(b + 74 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 0xfu);
    grid8_signed(db, __ldg(QGRID + id), ldb(b + 34 + g), w);
}

template <> __device__ __forceinline__ void decode8<T_IQ3_XXS>(const u8* b, int g, float (&w)[8]) {
    const int ib = g >> 2, l = g & 3;
    const u32 aux = ld32(b + 66 + 4 * ib);
    const float db = fmul(fmul(f16_at(b), 0.5f + (float)(aux >> 28)), 0.5f);
    const u32 ids = ld16(b + 2 + 8 * ib + 2 * l);
    grid4x2_signed(db, __ldg(QGRID + (ids & 0xffu)), __ldg(QGRID + (ids >> 8)), ksign((aux >> (7 * l)) & 127u), w);
}

template <> __device__ __forceinline__ void decode8<T_IQ3_S>(const u8* b, int g, float (&w)[8]) {
    const u32 ids = ld16(b + 2 + 2 * g), qh = ldb(b + 66 + (g >> 2));
    const u32 id0 = (ids & 0xffu) | (((qh >> (2 * (g & 3))) & 1u) << 8);
    const u32 id1 = (ids >> 8) | (((qh >> (2 * (g & 3) + 1)) & 1u) << 8);
    const u32 s = (ldb(b + 106 + (g >> 3)) >> (4 * ((g >> 2) & 1))) & 0xfu;
    const float db = fmul(f16_at(b), (float)(1 + 2 * s));
    grid4x2_signed(db, __ldg(QGRID + id0), __ldg(QGRID + id1), ldb(b + 74 + g), w);
}

// IQ1: grid values -1, 0, 1 (int8 bytes), w = dl * (grid + delta)
__device__ __forceinline__ void grid8_delta(float dl, unsigned long long entry, float delta, float (&w)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(dl, fadd((float)(signed char)((entry >> (8 * k)) & 0xffu), delta));
}

template <> __device__ __forceinline__ void decode8<T_IQ1_S>(const u8* b, int g, float (&w)[8]) {
    const int ib = g >> 2, l = g & 3;
    const u32 qh = ld16(b + 34 + 2 * ib);
    const float dl = fmul(f16_at(b), (float)(2 * ((qh >> 12) & 7u) + 1));
    const float delta = (qh & 0x8000u) ? -0.125f : 0.125f;
    grid8_delta(dl, __ldg(QGRID + (ldb(b + 2 + g) | (((qh >> (3 * l)) & 7u) << 8))), delta, w);
}

template <> __device__ __forceinline__ void decode8<T_IQ1_M>(const u8* b, int g, float (&w)[8]) {
    const uint2 sc = ld64(b + 48);  // four u16 scale words; their top nibbles are the fp16 d
    const u32 w0 = sc.x & 0xffffu, w1 = sc.x >> 16, w2 = sc.y & 0xffffu, w3 = sc.y >> 16;
    const u32 dbits = (w0 >> 12) | ((w1 >> 12) << 4) | ((w2 >> 12) << 8) | ((w3 >> 12) << 12);
    const int si = g >> 1;  // one 3-bit scale per 16 elements: word si / 4, bits 3 * (si % 4)
    const u32 word = si < 8 ? (si < 4 ? w0 : w1) : (si < 12 ? w2 : w3);
    const float dl = fmul(f16_bits_to_float((u16)dbits), (float)(2 * ((word >> (3 * (si & 3))) & 7u) + 1));
    const u32 qh = (ldb(b + 32 + (g >> 1)) >> (4 * (g & 1))) & 0xfu;
    const float delta = (qh & 8u) ? -0.125f : 0.125f;
    grid8_delta(dl, __ldg(QGRID + (ldb(b + g) | ((qh & 7u) << 8))), delta, w);
}
#endif  // QGRID_N

#if defined(QKVALUES)
template <> __device__ __forceinline__ void decode8<T_IQ4_NL>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    nibbles8(b + 2, g, q);
    const float d = f16_at(b);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(d, (float)QKVALUES[q[k]]);
}

template <> __device__ __forceinline__ void decode8<T_IQ4_XS>(const u8* b, int g, float (&w)[8]) {
    const int ib = g >> 2, half = (g >> 1) & 1;  // sub-block of 32: 16 bytes, low nibbles then high nibbles
    const u32 ls = ((ldb(b + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 0xfu) | (((ld16(b + 2) >> (2 * ib)) & 3u) << 4);
    const float dl = fmul(f16_at(b), (float)((int)ls - 32));
    const uint2 v = ld64(b + 8 + 16 * ib + 8 * (g & 1));
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(dl, (float)QKVALUES[(byte_of(v, k) >> (4 * half)) & 0xfu]);
}

// MXFP4: e8m0 scale 2^(e - 128) (gguf's e8m0_to_fp32_half), doubled e2m1 values
template <> __device__ __forceinline__ void decode8<T_MXFP4>(const u8* b, int g, float (&w)[8]) {
    const u32 e = ldb(b);
    const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
    u32 q[8];
    nibbles8(b + 1, g, q);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(d, (float)QKVALUES[q[k]]);
}

// NVFP4: 4 sub-blocks of 16, each an unsigned e4m3 scale (halved: the doubled e2m1 table) and 8 bytes of nibbles
template <> __device__ __forceinline__ void decode8<T_NVFP4>(const u8* b, int g, float (&w)[8]) {
    const int s = g >> 1;
    const u32 x = ldb(b + s), ex = (x >> 3) & 0xfu, man = x & 7u;
    float d = ex == 0 ? fmul((float)man, 0.001953125f) : fmul(1.0f + (float)man / 8.0f, ldexpf(1.0f, (int)ex - 7));
    d = (x == 0 || x == 0x7f) ? 0.0f : fmul(d, 0.5f);
    const uint2 v = ld64(b + 4 + 8 * s);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(d, (float)QKVALUES[(byte_of(v, k) >> (4 * (g & 1))) & 0xfu]);
}
#endif  // QKVALUES

// TQ1_0: base-3 digits; byte v holds digit k as ((v * 3^k mod 256) * 3) >> 8
__device__ __forceinline__ int tq1_digit(u32 v, int k) {
    const u32 pow3[5] = {1, 3, 9, 27, 81};
    return (int)((((v * pow3[k]) & 0xffu) * 3u) >> 8) - 1;
}

template <> __device__ __forceinline__ void decode8<T_TQ1_0>(const u8* b, int g, float (&w)[8]) {
    const float d = f16_at(b + 52);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int e = 8 * g + j;
        int byte, k;
        if (e < 160) { byte = e & 31; k = e >> 5; }                      // qs[0..31], 5 digits each
        else if (e < 240) { byte = 32 + ((e - 160) & 15); k = (e - 160) >> 4; }  // qs[32..47]
        else { byte = 48 + ((e - 240) & 3); k = (e - 240) >> 2; }        // qh[0..3], 4 digits each
        w[j] = fmul(d, (float)tq1_digit(ldb(b + byte), k));
    }
}

template <> __device__ __forceinline__ void decode8<T_TQ2_0>(const u8* b, int g, float (&w)[8]) {
    u32 q[8];
    crumbs8(b, g, q);
    const float d = f16_at(b + 64);
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = fmul(d, (float)((int)q[k] - 1));
}

// =====================================================================================================================
// q-form decoders of the staged GEMV (every GEMV of gemv_quant.cu). The same 8 values of group g as decode8,
// written as w_k = d * q_k (+ m for the types with a min, QHasMin): q_k exact small integers or (signed) grid
// values as floats, d and m the floats gguf computes. For every type gguf's value is exactly fl(fl(d * q_k) + m)
// (or fl(d * q_k)): tests/test_quant_decode_host.py checks that bit for bit. The GEMV then adds d * sum_k q_k x_k
// (+ m * sum_k x_k) per group: the weights are unchanged, only the sum is reassociated.
//
//   qdec8<TYPE>(blk, g, q, d, m): blk is a block start in shared memory (or host memory in the test) whose address
//   has the block's natural alignment QAl<TYPE>::b (the largest power of two <= 16 dividing the block size; the
//   launcher passes only weights whose base has it, and the staging keeps every address mod 16). Loads are composed
//   from units of that alignment at compile time: no run-time alignment branches.
//
// Small integers become floats without I2F (quarter rate on sm_90): byte k of a word is spliced into the mantissa
// of 2^23 (PRMT) and 2^23 + bias subtracted, which is exact.
#ifdef QUANT_DECODE_HOST
#define QALIGN_CHECK(p, A) (qalign_bad |= ((size_t)(p) % (A)) != 0)
#else
#define QALIGN_CHECK(p, A) ((void)0)
#endif

__host__ __device__ constexpr int qblock_align(int bytes) {
    return (bytes & 15) == 0 ? 16 : (bytes & 7) == 0 ? 8 : (bytes & 3) == 0 ? 4 : (bytes & 1) == 0 ? 2 : 1;
}
template <int TYPE> struct QAl { static constexpr int b = qblock_align(QBlock<TYPE>::bytes); };
// alignment of blk + off where off is a multiple of n
#define QAL(TYPE, n) (QAl<TYPE>::b < (n) ? QAl<TYPE>::b : (n))

template <int TYPE> struct QHasMin { static constexpr bool v = false; };
template <> struct QHasMin<T_Q4_1> { static constexpr bool v = true; };
template <> struct QHasMin<T_Q5_1> { static constexpr bool v = true; };
template <> struct QHasMin<T_Q2_K> { static constexpr bool v = true; };
template <> struct QHasMin<T_Q4_K> { static constexpr bool v = true; };
template <> struct QHasMin<T_Q5_K> { static constexpr bool v = true; };

// plain loads of A-aligned addresses (shared memory on the device; pb is with the read-only loads above)
template <int A> __device__ __forceinline__ u32 pl16(const u8* p) {
    QALIGN_CHECK(p, A < 2 ? A : 2);
    if (A >= 2) return *reinterpret_cast<const u16*>(p);
    return pb(p) | (pb(p + 1) << 8);
}
template <int A> __device__ __forceinline__ u32 pl32(const u8* p) {
    QALIGN_CHECK(p, A < 4 ? A : 4);
    if (A >= 4) return *reinterpret_cast<const u32*>(p);
    return pl16<A>(p) | (pl16<A>(p + 2) << 16);
}
template <int A> __device__ __forceinline__ uint2 pl64(const u8* p) {
    QALIGN_CHECK(p, A < 8 ? A : 8);
    if (A >= 8) return *reinterpret_cast<const uint2*>(p);
    return make_uint2(pl32<A>(p), pl32<A>(p + 4));
}
template <int A> __device__ __forceinline__ float pf16(const u8* p) { return f16_bits_to_float((u16)pl16<A>(p)); }

// byte k of w (a value < 256) minus bias, exactly
__device__ __forceinline__ float byte_f(u32 w, int k, float bias) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + k)) - (8388608.0f + bias);
}
__device__ __forceinline__ void bytes8_f(u32 lo, u32 hi, float bias, float (&q)[8]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k] = byte_f(lo, k, bias);
        q[4 + k] = byte_f(hi, k, bias);
    }
}
// u (< 2^23) minus bias as an exact float, without I2F
__device__ __forceinline__ float small_f(u32 u, float bias) {
    return __uint_as_float(0x4B000000u | u) - (8388608.0f + bias);
}
// signed bytes (int8) of w as floats
__device__ __forceinline__ void sbytes8_f(u32 lo, u32 hi, float (&q)[8]) {
    bytes8_f(lo ^ 0x80808080u, hi ^ 0x80808080u, 128.0f, q);
}
// bit k (k < 4) of x -> bit 0 of byte k
__device__ __forceinline__ u32 spread4(u32 x) { return ((x & 0xfu) * 0x00204081u) & 0x01010101u; }
// q_k = -q_k where bit k of signs is set
__device__ __forceinline__ void apply_signs(u32 signs, float (&q)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = (signs >> k) & 1u ? -q[k] : q[k];
}

template <int TYPE>
__device__ __forceinline__ void qdec8(const u8* __restrict__ b, int g, float (&q)[8], float& d, float& m);

template <> __device__ __forceinline__ void qdec8<T_Q4_0>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const uint2 v = pl64<QAL(T_Q4_0, 2)>(b + 2 + (g & 1) * 8);
    const int sh = (g >> 1) * 4;
    bytes8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, 8.0f, q);
    d = pf16<QAl<T_Q4_0>::b>(b);
}

template <> __device__ __forceinline__ void qdec8<T_Q4_1>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const uint2 v = pl64<QAL(T_Q4_1, 4)>(b + 4 + (g & 1) * 8);
    const int sh = (g >> 1) * 4;
    bytes8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, 0.0f, q);
    const u32 dm = pl32<QAl<T_Q4_1>::b>(b);
    d = f16_bits_to_float((u16)(dm & 0xffffu));
    m = f16_bits_to_float((u16)(dm >> 16));
}

template <> __device__ __forceinline__ void qdec8<T_Q5_0>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const uint2 v = pl64<QAL(T_Q5_0, 2)>(b + 6 + (g & 1) * 8);
    const int sh = (g >> 1) * 4;
    const u32 hb = (pl32<QAL(T_Q5_0, 2)>(b + 2) >> (8 * g)) & 0xffu;
    bytes8_f(((v.x >> sh) & 0x0f0f0f0fu) | (spread4(hb) << 4), ((v.y >> sh) & 0x0f0f0f0fu) | (spread4(hb >> 4) << 4),
             16.0f, q);
    d = pf16<QAl<T_Q5_0>::b>(b);
}

template <> __device__ __forceinline__ void qdec8<T_Q5_1>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const uint2 v = pl64<QAL(T_Q5_1, 8)>(b + 8 + (g & 1) * 8);
    const int sh = (g >> 1) * 4;
    const u32 hb = (pl32<QAL(T_Q5_1, 4)>(b + 4) >> (8 * g)) & 0xffu;
    bytes8_f(((v.x >> sh) & 0x0f0f0f0fu) | (spread4(hb) << 4), ((v.y >> sh) & 0x0f0f0f0fu) | (spread4(hb >> 4) << 4),
             0.0f, q);
    const u32 dm = pl32<QAl<T_Q5_1>::b>(b);
    d = f16_bits_to_float((u16)(dm & 0xffffu));
    m = f16_bits_to_float((u16)(dm >> 16));
}

// Q2_K: w = dl * q - ml, as d = dl, m = -ml
template <> __device__ __forceinline__ void qdec8<T_Q2_K>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int e = 8 * g, c = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const uint2 v = pl64<QAL(T_Q2_K, 8)>(b + 16 + 32 * c + l);
    bytes8_f((v.x >> (2 * k)) & 0x03030303u, (v.y >> (2 * k)) & 0x03030303u, 0.0f, q);
    const u32 sc = pb(b + g / 2);
    const u32 dm = pl32<QAL(T_Q2_K, 16)>(b + 80);
    d = fmul(f16_bits_to_float((u16)(dm & 0xffffu)), small_f(sc & 0xfu, 0.0f));
    m = -fmul(f16_bits_to_float((u16)(dm >> 16)), small_f(sc >> 4, 0.0f));
}

// Q3_K: q = low 2 bits | hmask bit << 2, minus 4 (q - (h ? 0 : 4))
template <> __device__ __forceinline__ void qdec8<T_Q3_K>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int e = 8 * g, c = e >> 7, k = (e >> 5) & 3, l = e & 31, s = e >> 4, bit = e >> 5;
    const uint2 v = pl64<QAL(T_Q3_K, 8)>(b + 32 + 32 * c + l);
    const uint2 hm = pl64<QAL(T_Q3_K, 8)>(b + l);
    bytes8_f(((v.x >> (2 * k)) & 0x03030303u) | (((hm.x >> bit) & 0x01010101u) << 2),
             ((v.y >> (2 * k)) & 0x03030303u) | (((hm.y >> bit) & 0x01010101u) << 2), 4.0f, q);
    const u32 lo = (pb(b + 96 + (s & 7)) >> (4 * (s >> 3))) & 0xfu;
    const u32 hi = (pb(b + 96 + 8 + (s & 3)) >> (2 * (s >> 2))) & 3u;
    d = fmul(pf16<QAL(T_Q3_K, 4)>(b + 108), small_f(lo | (hi << 4), 32.0f));
}


// Q4_K / Q5_K (v2): the scale d = dm.d * sc and the min m = -dm.dmin * mn of sub-block j, as the q-form wants them
template <int QT>
__device__ __forceinline__ void k_dm8(const u8* b, int j, float& d, float& m) {
    u32 sc, mn;
    k_scale_min<true>(b + 4, j, sc, mn);
    const u32 dm = pl32<QAL(QT, 4)>(b);
    d = fmul(f16_bits_to_float((u16)(dm & 0xffffu)), small_f(sc, 0.0f));
    m = -fmul(f16_bits_to_float((u16)(dm >> 16)), small_f(mn, 0.0f));
}

template <> __device__ __forceinline__ void qdec8<T_Q4_K>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int e = 8 * g, j = e >> 5, l = e & 31, sh = 4 * (j & 1);
    const uint2 v = pl64<QAL(T_Q4_K, 8)>(b + 16 + 32 * (j >> 1) + l);
    bytes8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, 0.0f, q);
    k_dm8<T_Q4_K>(b, j, d, m);
}

template <> __device__ __forceinline__ void qdec8<T_Q5_K>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int e = 8 * g, j = e >> 5, l = e & 31, sh = 4 * (j & 1);
    const uint2 v = pl64<QAL(T_Q5_K, 8)>(b + 48 + 32 * (j >> 1) + l), h = pl64<QAL(T_Q5_K, 8)>(b + 16 + l);
    bytes8_f(((v.x >> sh) & 0x0f0f0f0fu) | (((h.x >> j) & 0x01010101u) << 4),
             ((v.y >> sh) & 0x0f0f0f0fu) | (((h.y >> j) & 0x01010101u) << 4), 0.0f, q);
    k_dm8<T_Q5_K>(b, j, d, m);
}

template <> __device__ __forceinline__ void qdec8<T_Q6_K>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int e = 8 * g, c = e >> 7, r = e & 127, lsh = 4 * (r >> 6), hsh = 2 * (r >> 5);
    const uint2 lo = pl64<QAL(T_Q6_K, 8)>(b + 64 * c + (r & 63));
    const uint2 hi = pl64<QAL(T_Q6_K, 8)>(b + 128 + 32 * c + (r & 31));
    bytes8_f(((lo.x >> lsh) & 0x0f0f0f0fu) | (((hi.x >> hsh) & 0x03030303u) << 4),
             ((lo.y >> lsh) & 0x0f0f0f0fu) | (((hi.y >> hsh) & 0x03030303u) << 4), 32.0f, q);
    d = fmul(pf16<QAL(T_Q6_K, 16)>(b + 208), small_f(pb(b + 192 + (e >> 4)) ^ 0x80u, 128.0f));  // int8 scale
}

#if defined(QGRID_N)
// iq2_db without I2F
__device__ __forceinline__ float iq2_db_q(float d, u32 s) { return fmul(fmul(d, 0.5f + small_f(s, 0.0f)), 0.25f); }

// 8-value grid entry with signs: q = +-grid, d = db (gguf: (db * grid) * sign, the same float)
__device__ __forceinline__ void grid8_q(unsigned long long entry, u32 signs, float (&q)[8]) {
    bytes8_f((u32)entry, (u32)(entry >> 32), 0.0f, q);
    apply_signs(signs, q);
}

template <> __device__ __forceinline__ void qdec8<T_IQ2_XXS>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int ib = g >> 2, l = g & 3;
    const u32 aux0 = pl32<QAL(T_IQ2_XXS, 2)>(b + 2 + 8 * ib), aux1 = pl32<QAL(T_IQ2_XXS, 2)>(b + 2 + 8 * ib + 4);
    d = iq2_db_q(pf16<QAl<T_IQ2_XXS>::b>(b), aux1 >> 28);
    grid8_q(__ldg(QGRID + ((aux0 >> (8 * l)) & 0xffu)), ksign((aux1 >> (7 * l)) & 127u), q);
}

template <> __device__ __forceinline__ void qdec8<T_IQ2_XS>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const u32 v = pl16<QAL(T_IQ2_XS, 2)>(b + 2 + 2 * g);
    d = iq2_db_q(pf16<QAl<T_IQ2_XS>::b>(b), (pb(b + 66 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 0xfu);
    grid8_q(__ldg(QGRID + (v & 511u)), ksign(v >> 9), q);
}

template <> __device__ __forceinline__ void qdec8<T_IQ2_S>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const u32 id = pb(b + 2 + g) | (((pb(b + 66 + (g >> 2)) >> (2 * (g & 3))) & 3u) << 8);
    d = iq2_db_q(pf16<QAl<T_IQ2_S>::b>(b), (pb(b + 74 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 0xfu);
    grid8_q(__ldg(QGRID + id), pb(b + 34 + g), q);
}

template <> __device__ __forceinline__ void qdec8<T_IQ3_XXS>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int ib = g >> 2, l = g & 3;
    const u32 aux = pl32<QAL(T_IQ3_XXS, 2)>(b + 66 + 4 * ib);
    d = fmul(fmul(pf16<QAl<T_IQ3_XXS>::b>(b), 0.5f + small_f(aux >> 28, 0.0f)), 0.5f);
    const u32 ids = pl16<QAL(T_IQ3_XXS, 2)>(b + 2 + 8 * ib + 2 * l);
    bytes8_f(__ldg(QGRID + (ids & 0xffu)), __ldg(QGRID + (ids >> 8)), 0.0f, q);
    apply_signs(ksign((aux >> (7 * l)) & 127u), q);
}

template <> __device__ __forceinline__ void qdec8<T_IQ3_S>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const u32 ids = pl16<QAL(T_IQ3_S, 2)>(b + 2 + 2 * g), qh = pb(b + 66 + (g >> 2));
    const u32 id0 = (ids & 0xffu) | (((qh >> (2 * (g & 3))) & 1u) << 8);
    const u32 id1 = (ids >> 8) | (((qh >> (2 * (g & 3) + 1)) & 1u) << 8);
    const u32 s = (pb(b + 106 + (g >> 3)) >> (4 * ((g >> 2) & 1))) & 0xfu;
    d = fmul(pf16<QAl<T_IQ3_S>::b>(b), small_f(1 + 2 * s, 0.0f));
    bytes8_f(__ldg(QGRID + id0), __ldg(QGRID + id1), 0.0f, q);
    apply_signs(pb(b + 74 + g), q);
}

// IQ1: q = grid (-1, 0, 1) + delta, exact; d = dl (gguf: dl * (grid + delta))
__device__ __forceinline__ void grid8_delta_q(unsigned long long entry, float delta, float (&q)[8]) {
    sbytes8_f((u32)entry, (u32)(entry >> 32), q);
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = fadd(q[k], delta);
}

template <> __device__ __forceinline__ void qdec8<T_IQ1_S>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int ib = g >> 2, l = g & 3;
    const u32 qh = pl16<QAL(T_IQ1_S, 2)>(b + 34 + 2 * ib);
    d = fmul(pf16<QAl<T_IQ1_S>::b>(b), small_f(2 * ((qh >> 12) & 7u) + 1, 0.0f));
    grid8_delta_q(__ldg(QGRID + (pb(b + 2 + g) | (((qh >> (3 * l)) & 7u) << 8))),
                  (qh & 0x8000u) ? -0.125f : 0.125f, q);
}

template <> __device__ __forceinline__ void qdec8<T_IQ1_M>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const uint2 sc = pl64<QAL(T_IQ1_M, 8)>(b + 48);
    const u32 w0 = sc.x & 0xffffu, w1 = sc.x >> 16, w2 = sc.y & 0xffffu, w3 = sc.y >> 16;
    const u32 dbits = (w0 >> 12) | ((w1 >> 12) << 4) | ((w2 >> 12) << 8) | ((w3 >> 12) << 12);
    const int si = g >> 1;
    const u32 word = si < 8 ? (si < 4 ? w0 : w1) : (si < 12 ? w2 : w3);
    d = fmul(f16_bits_to_float((u16)dbits), small_f(2 * ((word >> (3 * (si & 3))) & 7u) + 1, 0.0f));
    const u32 qh = (pb(b + 32 + (g >> 1)) >> (4 * (g & 1))) & 0xfu;
    grid8_delta_q(__ldg(QGRID + (pb(b + g) | ((qh & 7u) << 8))), (qh & 8u) ? -0.125f : 0.125f, q);
}
#endif  // QGRID_N

#if defined(QKVALUES)
// 4 bytes, each a 4-bit index -> the 4 signed bytes QKVALUES[index] (QKV_W0..3: the table as words, quant_source.py).
// PRMT picks bytes by the low 3 bits of each selector nibble; the index's bit 3 picks the table half.
__device__ __forceinline__ u32 kvalues4(u32 t) {
    const u32 u = t | (t >> 4);                    // byte 0: i0 | i1 << 4, byte 2: i2 | i3 << 4
    const u32 sel = __byte_perm(u, 0u, 0x4420u);   // i0 i1 i2 i3 as the low 16 bits' nibbles
    const u32 lo3 = sel & 0x7777u;                 // (a selector's msb would sign-extend)
    const u32 low = __byte_perm(QKV_W0, QKV_W1, lo3), high = __byte_perm(QKV_W2, QKV_W3, lo3);
    return __byte_perm(low, high, 0x3210u | ((sel & 0x8888u) >> 1));
}
__device__ __forceinline__ void kvalues8_f(u32 lo, u32 hi, float (&q)[8]) { sbytes8_f(kvalues4(lo), kvalues4(hi), q); }

template <> __device__ __forceinline__ void qdec8<T_IQ4_NL>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const uint2 v = pl64<QAL(T_IQ4_NL, 2)>(b + 2 + (g & 1) * 8);
    const int sh = (g >> 1) * 4;
    kvalues8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, q);
    d = pf16<QAl<T_IQ4_NL>::b>(b);
}

template <> __device__ __forceinline__ void qdec8<T_IQ4_XS>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int ib = g >> 2, sh = 4 * ((g >> 1) & 1);
    const u32 ls = ((pb(b + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 0xfu) |
                   (((pl16<QAL(T_IQ4_XS, 2)>(b + 2) >> (2 * ib)) & 3u) << 4);
    d = fmul(pf16<QAl<T_IQ4_XS>::b>(b), small_f(ls, 32.0f));
    const uint2 v = pl64<QAL(T_IQ4_XS, 8)>(b + 8 + 16 * ib + 8 * (g & 1));
    kvalues8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, q);
}

template <> __device__ __forceinline__ void qdec8<T_MXFP4>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const u32 e = pb(b);
    d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
    const uint2 v = pl64<QAL(T_MXFP4, 1)>(b + 1 + (g & 1) * 8);
    const int sh = (g >> 1) * 4;
    kvalues8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, q);
}

template <> __device__ __forceinline__ void qdec8<T_NVFP4>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int s = g >> 1, sh = 4 * (g & 1);
    const u32 x = pb(b + s), ex = (x >> 3) & 0xfu, man = x & 7u;
    float dd = ex == 0 ? fmul((float)man, 0.001953125f) : fmul(1.0f + (float)man / 8.0f, ldexpf(1.0f, (int)ex - 7));
    d = (x == 0 || x == 0x7f) ? 0.0f : fmul(dd, 0.5f);
    const uint2 v = pl64<QAL(T_NVFP4, 4)>(b + 4 + 8 * s);
    kvalues8_f((v.x >> sh) & 0x0f0f0f0fu, (v.y >> sh) & 0x0f0f0f0fu, q);
}
#endif  // QKVALUES

template <> __device__ __forceinline__ void qdec8<T_TQ1_0>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    d = pf16<QAL(T_TQ1_0, 4)>(b + 52);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int e = 8 * g + j;
        int byte, k;
        if (e < 160) { byte = e & 31; k = e >> 5; }
        else if (e < 240) { byte = 32 + ((e - 160) & 15); k = (e - 160) >> 4; }
        else { byte = 48 + ((e - 240) & 3); k = (e - 240) >> 2; }
        q[j] = (float)tq1_digit(pb(b + byte), k);
    }
}

template <> __device__ __forceinline__ void qdec8<T_TQ2_0>(const u8* b, int g, float (&q)[8], float& d, float& m) {
    const int e = 8 * g, c = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const uint2 v = pl64<QAL(T_TQ2_0, 8)>(b + 32 * c + l);
    bytes8_f((v.x >> (2 * k)) & 0x03030303u, (v.y >> (2 * k)) & 0x03030303u, 1.0f, q);
    d = pf16<QAL(T_TQ2_0, 64)>(b + 64);
}

// =====================================================================================================================
// Folded q-form of the tensor-core expert GEMVs (gemv_quant.cu qtc_*): the same 8 values of group g as qdec8,
// written as w_k = D * a_k (+ m), where
//   a_k  = s * q_k: q_k times the group's small integer (or dyadic) sub-block factor s, exact in float32 and
//        exact in f16 (|a| <= 2048, a value with <= 11 significant bits) except for QTcLo types, whose a_k are
//        integers up to 4096 that the GEMV splits into two exact f16 (hi + lo);
//   D    one float for the whole 32-element span 32j .. 32j+31 of a block (the four groups 4j .. 4j+3): the MMA of
//        gemv_quant.cu sums a span's 32 products before it scales them, so D may not change inside a span;
//   m    qdec8's min (types with QHasMin), constant over 16 elements (two groups; Q2_K's mins are per 16).
// For a type whose qdec8 scale d is already one float per 32 elements, s = 1 and D = d (the primary template). The
// per-16 types fold their sub-block scale into a: Q2_K (4-bit scale), Q3_K (6-bit), Q6_K (int8: the QTcLo type),
// IQ2_XS / IQ2_S (2 s + 1, the super-block's d / 8), IQ1_M (2 s + 1), NVFP4 (the e4m3 scale itself, D = 1). As
// reals D * a_k = d * q_k exactly, so gguf's weight fl(fl(d q_k) + m) is fl(fl(D a_k) + m):
// tests/test_quant_decode_host.py checks that bit for bit, a's f16 exactness and D's constancy over each span.
template <int TYPE> struct QTcLo { static constexpr bool v = false; };
template <> struct QTcLo<T_Q6_K> { static constexpr bool v = true; };

template <int TYPE>
__device__ __forceinline__ void qtc8(const u8* __restrict__ b, int g, float (&a)[8], float& D, float& m) {
    qdec8<TYPE>(b, g, a, D, m);
}

__device__ __forceinline__ void qtc_fold(float s, float (&a)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = fmul(a[k], s);
}

template <> __device__ __forceinline__ void qtc8<T_Q2_K>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_Q2_K>(b, g, a, d, m);
    qtc_fold(small_f(pb(b + g / 2) & 0xfu, 0.0f), a);  // q <= 3 times a 4-bit scale: <= 45
    D = pf16<QAL(T_Q2_K, 16)>(b + 80);
}

template <> __device__ __forceinline__ void qtc8<T_Q3_K>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_Q3_K>(b, g, a, d, m);
    const int s = g >> 1;
    const u32 lo = (pb(b + 96 + (s & 7)) >> (4 * (s >> 3))) & 0xfu;
    const u32 hi = (pb(b + 96 + 8 + (s & 3)) >> (2 * (s >> 2))) & 3u;
    qtc_fold(small_f(lo | (hi << 4), 32.0f), a);  // |q| <= 4 times a 6-bit signed scale: <= 128
    D = pf16<QAL(T_Q3_K, 4)>(b + 108);
}

template <> __device__ __forceinline__ void qtc8<T_Q6_K>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_Q6_K>(b, g, a, d, m);
    qtc_fold(small_f(pb(b + 192 + g / 2) ^ 0x80u, 128.0f), a);  // |q| <= 32 times an int8 scale: <= 4096 (QTcLo)
    D = pf16<QAL(T_Q6_K, 16)>(b + 208);
}

#if defined(QGRID_N)
template <> __device__ __forceinline__ void qtc8<T_IQ2_XS>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_IQ2_XS>(b, g, a, d, m);
    const u32 s = (pb(b + 66 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 0xfu;
    qtc_fold(small_f(2 * s + 1, 0.0f), a);  // d (0.5 + s) 0.25 = (d / 8) (2 s + 1); grid <= 43: <= 1333
    D = fmul(pf16<QAl<T_IQ2_XS>::b>(b), 0.125f);
}

template <> __device__ __forceinline__ void qtc8<T_IQ2_S>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_IQ2_S>(b, g, a, d, m);
    const u32 s = (pb(b + 74 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 0xfu;
    qtc_fold(small_f(2 * s + 1, 0.0f), a);
    D = fmul(pf16<QAl<T_IQ2_S>::b>(b), 0.125f);
}

template <> __device__ __forceinline__ void qtc8<T_IQ1_M>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_IQ1_M>(b, g, a, d, m);
    const uint2 sc = pl64<QAL(T_IQ1_M, 8)>(b + 48);
    const u32 w0 = sc.x & 0xffffu, w1 = sc.x >> 16, w2 = sc.y & 0xffffu, w3 = sc.y >> 16;
    const int si = g >> 1;
    const u32 word = si < 8 ? (si < 4 ? w0 : w1) : (si < 12 ? w2 : w3);
    qtc_fold(small_f(2 * ((word >> (3 * (si & 3))) & 7u) + 1, 0.0f), a);  // (grid +- 1/8) times <= 15
    D = f16_bits_to_float((u16)((w0 >> 12) | ((w1 >> 12) << 4) | ((w2 >> 12) << 8) | ((w3 >> 12) << 12)));
}
#endif  // QGRID_N

#if defined(QKVALUES)
// NVFP4: the e4m3 sub-block scale (4 significant bits, 2^-10 .. 224) times a doubled e2m1 value (<= 12) is exact
// in f16, so the whole weight is a and D = 1.
template <> __device__ __forceinline__ void qtc8<T_NVFP4>(const u8* b, int g, float (&a)[8], float& D, float& m) {
    float d;
    qdec8<T_NVFP4>(b, g, a, d, m);
    qtc_fold(d, a);
    D = 1.0f;
}
#endif  // QKVALUES

// ---- A fragments of the tensor-core GEMVs: qtc_frag<TYPE>(blk, g, A, L, D, m) gives group g's 8 values of qtc8 as
// four f16x2 words (L: the lo parts of the QTcLo types). The generic form packs qtc8's floats (4 cvt); the types
// of the benchmark file decode their bits straight into f16x2 with the exponent trick: a field f of bits 0..9 of
// a half ORed into 0x6400 is the f16 1024 + f (a field at bit p: 1024 + f 2^p), and one fused f16x2 fma
// (1024 + f 2^p) S + B with S = s 2^-p, B = -1024 s 2^-p leaves the exact s f (a product of <= 11 significant bits,
// one rounding of an exact value). A field pair sits in bytes 0 and 2 of a word (the halves' low bytes), so those
// types' words hold elements (0, 2), (1, 3), (4, 6), (5, 7) (QTcFrag::interleaved); the GEMV pairs x the same way.
// QTcFrag::split16 (Q4_0): group g of a 32-element block is not elements 8g .. 8g+7 but the two nibbles of qs bytes
// 4g .. 4g+3, elements 4g .. 4g+3 then 16+4g .. 16+4g+3 (one 32-bit word of codes, the nibble masks and S, B
// compile-time constants); the GEMV reads its x as the two float4 at 4g and 16+4g (a permutation of the MMA's k).
template <int TYPE> struct QTcFrag {
    static constexpr bool interleaved = false;
    static constexpr bool split16 = false;
};
template <> struct QTcFrag<T_Q4_0> {
    static constexpr bool interleaved = true;
    static constexpr bool split16 = true;
};
template <> struct QTcFrag<T_Q2_K> {
    static constexpr bool interleaved = true;
    static constexpr bool split16 = false;
};
// element k (0..7) of qtc_frag's group g as an offset in the block (the order of qtc8's a for every type)
template <int TYPE> __host__ __device__ constexpr int qtc_elem(int g, int k) {
    return QTcFrag<TYPE>::split16 ? (k < 4 ? 4 * g + k : 16 + 4 * g + k - 4) : 8 * g + k;
}

#ifndef QUANT_DECODE_HOST  // (tests/test_quant_decode_host.py's shim emulates these two in software)
__device__ __forceinline__ u32 h2_pack(float lo, float hi) {  // (f16(lo), f16(hi)), lo in the low half
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
#endif

template <int TYPE>
__device__ __forceinline__ void qtc_frag(const u8* __restrict__ b, int g, u32 (&A)[4], u32 (&L)[4], float& D,
                                         float& m) {
    float a[8];
    qtc8<TYPE>(b, g, a, D, m);
#pragma unroll
    for (int i = 0; i < 4; ++i) A[i] = h2_pack(a[2 * i], a[2 * i + 1]);
    if (QTcLo<TYPE>::v) {  // a - f16(a): exact, |lo| <= 1
#pragma unroll
        for (int i = 0; i < 4; ++i)
            L[i] = h2_pack(a[2 * i] - f16_bits_to_float((u16)(A[i] & 0xffffu)),
                           a[2 * i + 1] - f16_bits_to_float((u16)(A[i] >> 16)));
    }
}

// The field masks of the straight-to-f16x2 decoders in constant memory: LOP3 takes one of them as a constant-bank
// operand and the 0x6400 exponent as its immediate, one instruction a field (f & mask) | 0x6400. Two immediates do
// not fit one LOP3: Q2_K's crumb masks as literals made ptxas rematerialize the mask into a register for every field
// (one IMAD.MOV more each); Q4_0's nibble masks as literals split every field into two LOP3 (16 more a span of
// 4 units: SASS of qtc_expert_t1, NVCC 13.0 sm_90).
#ifndef QUANT_DECODE_HOST
__constant__ u32 qtc_crumb_masks[4] = {0x00030003u, 0x000c000cu, 0x00300030u, 0x00c000c0u};
__constant__ u32 qtc_nib_masks[2] = {0x000f000fu, 0x00f000f0u};
#else
static const u32 qtc_crumb_masks[4] = {0x00030003u, 0x000c000cu, 0x00300030u, 0x00c000c0u};
static const u32 qtc_nib_masks[2] = {0x000f000fu, 0x00f000f0u};
#endif

// the four interleaved words of fields (w >> 0, 8) & mask of two words (lo, hi), scaled by S, B
__device__ __forceinline__ void qtc_fields(u32 lo, u32 hi, u32 mask, u32 S, u32 B, u32 (&A)[4]) {
    A[0] = h2_fma((lo & mask) | 0x64006400u, S, B);         // elements 0, 2
    A[1] = h2_fma(((lo >> 8) & mask) | 0x64006400u, S, B);  // 1, 3
    A[2] = h2_fma((hi & mask) | 0x64006400u, S, B);         // 4, 6
    A[3] = h2_fma(((hi >> 8) & mask) | 0x64006400u, S, B);  // 5, 7
}

// Q4_0 (split16): qs bytes 4g .. 4g+3 as one word w; the low nibble q at bit 0 (S = 1, B = -1032: q - 8) gives
// elements 4g + (0, 2) from w and 4g + (1, 3) from w >> 8, the high nibble at bit 4 (S = 1/16, B = -72) the same of
// 16 + 4g: two 16-bit loads, one PRMT, one shift, 4 LOP3 + 4 HFMA2 for 8 weights (the masks from constant memory)
template <> __device__ __forceinline__ void qtc_frag<T_Q4_0>(const u8* b, int g, u32 (&A)[4], u32 (&L)[4], float& D,
                                                            float& m) {
    const u32 w = pl32<QAL(T_Q4_0, 2)>(b + 2 + 4 * g), w8 = w >> 8;
    const u32 lo = qtc_nib_masks[0], hi = qtc_nib_masks[1];  // (constant-bank operands: one LOP3 a field)
    A[0] = h2_fma((w & lo) | 0x64006400u, 0x3c003c00u, 0xe408e408u);   // elements 4g, 4g+2
    A[1] = h2_fma((w8 & lo) | 0x64006400u, 0x3c003c00u, 0xe408e408u);  // 4g+1, 4g+3
    A[2] = h2_fma((w & hi) | 0x64006400u, 0x2c002c00u, 0xd480d480u);   // 16+4g, 16+4g+2
    A[3] = h2_fma((w8 & hi) | 0x64006400u, 0x2c002c00u, 0xd480d480u);  // 16+4g+1, 16+4g+3
    D = pf16<QAl<T_Q4_0>::b>(b);
}

// ---- The mins of the per-16 min type by one MMA a step (QTcStepMins: Q2_K, whose 256-element block is the GEMV's
// step and whose 16 sub-blocks are exactly the k = 16 of one m16n8k16): sum_k m(k) x_k over a block is
// -dmin sum_sb mn_sb X_sb, X_sb the sum of x over sub-block sb, so the A operand is the 4-bit mins mn[row][sb]
// (exact in f16) and B the 16 sub-block sums of each x row (hi + lo), once per step instead of per span FMAs.
// qtc_min_frag(blk, t, lo, hi, nd): lane (g, t)'s A words (mn of sub-blocks 2t, 2t+1 and 2t+8, 2t+9, as the
// m16n8k16 A fragment's k pairs) of the block at blk and nd = -dmin.
template <int TYPE> struct QTcStepMins { static constexpr bool v = false; };
template <> struct QTcStepMins<T_Q2_K> { static constexpr bool v = true; };

template <int TYPE>
__device__ __forceinline__ void qtc_min_frag(const u8* __restrict__ b, int t, u32& lo, u32& hi, float& nd);
// scale bytes (b0, b1) at b + 2t -> bytes 0 and 2 (PRMT), high nibbles 16 mn at bit 4 of each half's 1024:
// (1024 + 16 mn) / 16 - 64 = mn exactly
template <> __device__ __forceinline__ void qtc_min_frag<T_Q2_K>(const u8* b, int t, u32& lo, u32& hi, float& nd) {
    const u32 w0 = __byte_perm(pl16<QAL(T_Q2_K, 2)>(b + 2 * t), 0u, 0x4140u);
    const u32 w1 = __byte_perm(pl16<QAL(T_Q2_K, 2)>(b + 8 + 2 * t), 0u, 0x4140u);
    lo = h2_fma((w0 & 0x00f000f0u) | 0x64006400u, 0x2c002c00u, 0xd400d400u);
    hi = h2_fma((w1 & 0x00f000f0u) | 0x64006400u, 0x2c002c00u, 0xd400d400u);
    nd = -f16_bits_to_float((u16)pl16<QAL(T_Q2_K, 2)>(b + 82));
}

// ---- The span scale D of the types whose D is one per 256-element block (QTcStepD): the GEMV loads it once a step
// (qtc_step_d(blk)) instead of taking qtc_frag's D every span; the same value qtc_frag gives.
template <int TYPE> struct QTcStepD { static constexpr bool v = false; };
template <> struct QTcStepD<T_Q2_K> { static constexpr bool v = true; };
template <int TYPE> __device__ __forceinline__ float qtc_step_d(const u8* __restrict__ b) { return 0.0f; }
template <> __device__ __forceinline__ float qtc_step_d<T_Q2_K>(const u8* b) { return pf16<QAL(T_Q2_K, 16)>(b + 80); }

// Q2_K: crumb q at bit 2k of its byte, times the 4-bit sub-block scale sc (qtc8's a = sc q); D = d, m = -dmin mn
template <> __device__ __forceinline__ void qtc_frag<T_Q2_K>(const u8* b, int g, u32 (&A)[4], u32 (&L)[4], float& D,
                                                            float& m) {
    const int e = 8 * g, c = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const uint2 v = pl64<QAL(T_Q2_K, 8)>(b + 16 + 32 * c + l);
    const u32 sc = pb(b + g / 2);
    // S = sc 4^-k and B = -1024 S built in f16x2: the scale nibble spliced into both halves of 1024 (one IMAD), one
    // fma (1024 + sc) 4^-k - 1024 4^-k, one fma S (-1024) - 0 (both exact: sc 4^-k has 4 significant bits), instead
    // of a float scale rounded into two packed words (6 instructions); 4^-k and -1024 4^-k are per span (k = sp % 4)
    const u32 P = (u32)(15 - 2 * k) << 10, N = 0x8000u | ((u32)(25 - 2 * k) << 10);
    const u32 S = h2_fma((sc & 0xfu) * 0x00010001u + 0x64006400u, P * 0x00010001u, N * 0x00010001u);
    qtc_fields(v.x, v.y, qtc_crumb_masks[k], S, h2_fma(S, 0xe400e400u, 0x80008000u), A);
    const u32 dm = pl32<QAL(T_Q2_K, 16)>(b + 80);
    D = f16_bits_to_float((u16)(dm & 0xffffu));
    // m = -dmin mn with the sign in the exact (2^23 - (2^23 + mn)): a free operand negation, no FADD for -product
    m = fmul(f16_bits_to_float((u16)(dm >> 16)), 8388608.0f - __uint_as_float(0x4B000000u | (sc >> 4)));
}

// ---- Q2_K's qtc_frag for four consecutive spans at once (the GEMV's unrolled spans sp = 4 q + k, k = 0..3: gemv_quant.cu
// qtc_grouped). Lane t's group of span sp is crumb plane k of qs bytes 32 q + 8 t .. + 7 (the same 8 bytes for the
// four spans) and scale byte 2 sp + t / 2 = 8 q + 2 k + t / 2 (one of every other byte of 8 q .. 8 q + 7), so the
// unit's bytes are loaded once a quad (qtc_q2k_quad: two 32-bit words of codes, two of scales, one PRMT picking the
// lane's four scale bytes and one LOP3 keeping their low nibbles) instead of once a span (a 64-bit load and a byte
// load each span), and a span's scale splice is one PRMT against 0x64 bytes (byte k of sc into the low byte of each
// half, 0x64 above it: the f16 1024 + sc) instead of a byte load, a LOP3 and an IMAD. Same words as qtc_frag's
// (tests/test_quant_decode_host.py checks every span and lane).
struct QTcQ2KQuad {
    uint2 qs;  // qs bytes 32 q + 8 t .. + 7
    u32 sc;    // byte k: the low nibble of scale byte 8 q + 2 k + t / 2 (its sub-block scale)
};
// quad q (0, 1: elements 128 q ..) of the block at b for lane t (0..3)
__device__ __forceinline__ QTcQ2KQuad qtc_q2k_quad(const u8* __restrict__ b, int q, int t) {
    QTcQ2KQuad u;
    u.qs = pl64<QAL(T_Q2_K, 8)>(b + 16 + 32 * q + 8 * t);
    const u32 s0 = pl32<QAL(T_Q2_K, 4)>(b + 8 * q), s1 = pl32<QAL(T_Q2_K, 4)>(b + 8 * q + 4);
    // result byte k = input byte 2 k + t / 2 of (s0, s1): selector nibbles 0, 2, 4, 6 plus t / 2
    u.sc = __byte_perm(s0, s1, 0x6420u + 0x1111u * (u32)(t >> 1)) & 0x0f0f0f0fu;
    return u;
}
// lane t's A words of span 4 q + k from its quad (k compile-time in the unrolled GEMV: the PRMT selector and the
// scale constants fold into immediates)
__device__ __forceinline__ void qtc_q2k_quad_frag(const QTcQ2KQuad& u, int k, u32 (&A)[4]) {
    const u32 P = (u32)(15 - 2 * k) << 10, N = 0x8000u | ((u32)(25 - 2 * k) << 10);
    // bytes (sc_k, 0x64, sc_k, 0x64): selector nibbles k, 4, k, 4 (byte 4 = the low byte of 0x64646464)
    const u32 Z = __byte_perm(u.sc, 0x64646464u, 0x4040u + 0x0101u * (u32)k);
    const u32 S = h2_fma(Z, P * 0x00010001u, N * 0x00010001u);
    qtc_fields(u.qs.x, u.qs.y, qtc_crumb_masks[k], S, h2_fma(S, 0xe400e400u, 0x80008000u), A);
}
