/* expert_pool_simd.h: the vector vocabulary of the pool's fused kernels (kernels/expert_pool.c's SIMD builds): the
 * build's ISA macros (STRATA_PERM, STRATA_VBMI), v16 (16 float32 lanes: one zmm in the AVX-512 build, two ymm in the
 * AVX2 build, so each decoder is written once for both), gguf's scale operations, the byte-level code extraction
 * (nibbles, crumbs, sign masks) and the block scales that more than one type's decoders share. No type's decoder
 * lives here: those are expert_pool_groups.h's and expert_pool_grids.h's, which include this file.
 */
#ifndef STRATA_EXPERT_POOL_SIMD_H
#define STRATA_EXPERT_POOL_SIMD_H
#include "expert_pool_base.h"
#ifdef STRATA_AVX2

#define AI static inline __attribute__((always_inline))

/* STRATA_PERM: the AVX-512 build's register-permute decoders (vpermps / vpermt2ps tables, the grid i-quants of
 * expert_pool_grids.h, unmasked nibble and crumb indexes) and lane-order kernels. (The AVX-512 lanes with the AVX2
 * decoders lost on the device for every type, 2026-12-02: 10-20 %, so that is no build variant any more.) */
#ifdef STRATA_AVX512
#define STRATA_PERM 1
#endif
/* STRATA_VBMI: the avx512vbmi build (strata_cli/tiers/native.py ISAS: + VBMI, BITALG, VNNI, DQ): byte permutes of 64 lanes
 * from 128-entry tables, multishift and vpshufbitqmb, for the grid i-quants' sign bytes (expert_pool_grids.h) and
 * their integer-product kernels at few token rows (expert_pool_limbs.h) */
#if defined(STRATA_AVX512) && defined(__AVX512VBMI__) && defined(__AVX512BITALG__) && defined(__AVX512VNNI__)
#define STRATA_VBMI 1
#endif

/* ---- v16: 16 float32 lanes */
#ifdef STRATA_AVX512
typedef __m512 v16;
#define PASS_M 8 /* token rows per pass over a weight row: 8 rows x 2 accumulators = 16 of 32 zmm */
AI v16 v16_zero(void) { return _mm512_setzero_ps(); }
AI v16 v16_set1(float a) { return _mm512_set1_ps(a); }
AI v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
AI v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
AI v16 v16_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
AI v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
AI v16 v16_ld(const float *p) { return _mm512_loadu_ps(p); }
AI void v16_st(float *p, v16 a) { _mm512_storeu_ps(p, a); }
AI v16 v16_i8(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
AI v16 v16_f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
AI v16 v16_bf16(const uint8_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
AI float v16_hsum(v16 a) { return _mm512_reduce_add_ps(a); }
#else
typedef struct { __m256 a, b; } v16;
#define PASS_M 4 /* 4 rows x one v16 accumulator = 8 of 16 ymm */
AI v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
AI v16 v16_set1(float a) { return (v16){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
AI v16 v16_mul(v16 x, v16 y) { return (v16){_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
AI v16 v16_add(v16 x, v16 y) { return (v16){_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
AI v16 v16_sub(v16 x, v16 y) { return (v16){_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
AI v16 v16_fma(v16 x, v16 y, v16 z) { return (v16){_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
AI v16 v16_ld(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AI void v16_st(float *p, v16 x) { _mm256_storeu_ps(p, x.a); _mm256_storeu_ps(p + 8, x.b); }
AI v16 v16_i8(__m128i q) {
    return (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))};
}
AI v16 v16_f16(const uint8_t *p) {
    return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
}
AI __m256 bf16x8(const uint8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
AI v16 v16_bf16(const uint8_t *p) { return (v16){bf16x8(p), bf16x8(p + 16)}; }
AI float v16_hsum(v16 x) {
    const __m256 v = _mm256_add_ps(x.a, x.b);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* d * (float)code, d * code + m: gguf's operations, in its order */
AI v16 scaled(__m128i q, float d) { return v16_mul(v16_set1(d), v16_i8(q)); }
AI v16 scaled_add(__m128i q, float d, float m) { return v16_add(v16_mul(v16_set1(d), v16_i8(q)), v16_set1(m)); }

/* d * (float)code for codes of few values: in the AVX-512 build the (at most 32) products d * value are computed
 * once (the same float products, so the same bits) and each weight is a register permute of them by its code
 * (vpermps / vpermt2ps on the low 4 / 5 bits), instead of a widen, a convert and a multiply per 16 weights.
 * small16: codes 0..15 (sgn 0) or -8..7 (sgn 1); small32: 0..31 or -16..15; *_add: + m after the product. */
#ifdef STRATA_PERM
AI v16 v16_iota(int from) { /* from, from + 1, ..., from + 15 */
    return _mm512_add_ps(_mm512_set1_ps((float)from), _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                                      14, 15));
}
AI v16 perm16(v16 t, __m128i idx) { return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(idx), t); }
AI v16 perm32(v16 lo, v16 hi, __m128i idx) { return _mm512_permutex2var_ps(lo, _mm512_cvtepu8_epi32(idx), hi); }
AI v16 v16_signed4(void) { /* 0..7, -8..-1: entry k = the int8 code whose low nibble is k */
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
}
AI v16 small16(__m128i q, int sgn, float d) { return perm16(v16_mul(v16_set1(d), sgn ? v16_signed4() : v16_iota(0)), q); }
AI v16 small16_add(__m128i q, float d, float m) {
    return perm16(v16_add(v16_mul(v16_set1(d), v16_iota(0)), v16_set1(m)), q);
}
AI v16 small32(__m128i q, int sgn, float d) {
    return perm32(v16_mul(v16_set1(d), v16_iota(0)), v16_mul(v16_set1(d), v16_iota(sgn ? -16 : 16)), q);
}
AI v16 small32_add(__m128i q, float d, float m) {
    return perm32(v16_add(v16_mul(v16_set1(d), v16_iota(0)), v16_set1(m)),
                  v16_add(v16_mul(v16_set1(d), v16_iota(16)), v16_set1(m)), q);
}
AI v16 lut_scaled(const int8_t *table, __m128i idx, float d) {
    return perm16(v16_mul(v16_set1(d), v16_i8(_mm_loadu_si128((const __m128i *)table))), idx);
}
#else
AI v16 small16(__m128i q, int sgn, float d) { (void)sgn; return scaled(q, d); }
AI v16 small16_add(__m128i q, float d, float m) { return scaled_add(q, d, m); }
AI v16 small32(__m128i q, int sgn, float d) { (void)sgn; return scaled(q, d); }
AI v16 small32_add(__m128i q, float d, float m) { return scaled_add(q, d, m); }
AI v16 lut_scaled(const int8_t *table, __m128i idx, float d) {
    return scaled(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)table), idx), d);
}
#endif

/* ---- 16 int8 codes with 128-bit integer ops */
AI __m128i ld16b(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
AI __m128i ld8(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }
AI __m128i nib(__m128i q, int hi) { /* low or high nibbles of 16 bytes */
    return _mm_and_si128(hi ? _mm_srli_epi16(q, 4) : q, _mm_set1_epi8(0x0F));
}
AI __m128i crumb(__m128i q, int s) { return _mm_and_si128(_mm_srli_epi16(q, 2 * s), _mm_set1_epi8(3)); }
AI __m128i bitmask16(uint32_t bits) { /* byte i = 0xFF where bit i of bits (0..15) is set */
#ifdef STRATA_AVX512
    return _mm_movm_epi8((__mmask16)bits);
#else
    const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits),
                                       _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    return _mm_cmpeq_epi8(_mm_and_si128(v, sel), sel);
#endif
}
/* q negated where bit i of bits (0..15) is set (grid values times gguf's +-1 signs; exact in int8) */
#ifdef STRATA_AVX512
AI __m128i signed16(__m128i q, uint32_t bits) { /* a masked 0 - q: no sign table loads */
    return _mm_mask_sub_epi8(q, (__mmask16)bits, _mm_setzero_si128(), q);
}
#else
/* sign_of[s][k] = -1 where bit k of the sign byte s is set, else +1 (one 8-byte load instead of expanding bits) */
#define SIGN1(s, k) (((s) >> (k)) & 1 ? -1 : 1)
#define SIGNS(s) {SIGN1(s, 0), SIGN1(s, 1), SIGN1(s, 2), SIGN1(s, 3), SIGN1(s, 4), SIGN1(s, 5), SIGN1(s, 6), SIGN1(s, 7)}
#define SIGNS4(s) SIGNS(s), SIGNS((s) + 1), SIGNS((s) + 2), SIGNS((s) + 3)
#define SIGNS16(s) SIGNS4(s), SIGNS4((s) + 4), SIGNS4((s) + 8), SIGNS4((s) + 12)
#define SIGNS64(s) SIGNS16(s), SIGNS16((s) + 16), SIGNS16((s) + 32), SIGNS16((s) + 48)
static const int8_t sign_of[256][8] = {SIGNS64(0), SIGNS64(64), SIGNS64(128), SIGNS64(192)};
AI __m128i signed16(__m128i q, uint32_t bits) {
    return _mm_sign_epi8(q, _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)sign_of[bits & 0xFF]),
                                               _mm_loadl_epi64((const __m128i *)sign_of[(bits >> 8) & 0xFF])));
}
#endif
AI __m128i two8(const void *a, const void *b) { return _mm_unpacklo_epi64(ld8(a), ld8(b)); }
AI __m128i four4(const void *a, const void *b, const void *c, const void *d) {
    return _mm_setr_epi32((int)rd32(a), (int)rd32(b), (int)rd32(c), (int)rd32(d));
}
/* the e8m0 scale of MXFP4 as gguf computes it */
AI float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    return d;
}
AI float ue4m3_half(uint8_t x) { /* NVFP4's scale, halved for the doubled e2m1 table */
    /* (1 + man / 8) * 2^(ex - 7) / 2 is exact: its bits directly (no float ops per group) */
    const uint32_t ex = (x >> 3) & 0xF, man = x & 7, bits = ((ex + 119) << 23) | (man << 20);
    float normal;
    memcpy(&normal, &bits, 4);
    return (x == 0 || x == 0x7F) ? 0.0f : ex == 0 ? (float)man * 0x1p-10f : normal;
}
/* ue4m3_half of every byte, filled once when the library loads: a pass reads one float per 16 weights where the
 * function's branches on a block's scale bytes (zero, NaN, subnormal: data-dependent) cost NVFP4 most of its time
 * (dev box, 1 thread, L2-hot: 2.7 GB/s, the 4 scales a block branchy scalar code; MXFP4's one branch-free 6.7) */
static float ue4m3_half_of[256];
__attribute__((constructor)) static void fill_ue4m3_half_of(void) {
    for (int x = 0; x < 256; x++) ue4m3_half_of[x] = ue4m3_half((uint8_t)x);
}
AI int k_scale6(const uint8_t *sc, int j) { /* Q3_K's 6-bit signed sub-block scale j (0..15) */
    const int lo = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4), hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (int8_t)(lo | (hi << 4)) - 32;
}
/* IQ2_XS / IQ2_S: the 16 scales d * (0.5 + s) * 0.25, s the nibbles of 8 bytes at `at`, low first */
AI v16 iq2_scales(const uint8_t *b, int at) {
    const __m128i q = ld8(b + at);
    const v16 s = v16_add(v16_set1(0.5f), v16_i8(_mm_unpacklo_epi8(nib(q, 0), nib(q, 1))));
    return v16_mul(v16_mul(v16_set1(rdh(b)), s), v16_set1(0.25f));
}
AI void prep_iq2_scales(const uint8_t *b, int at, float *ps) { v16_st(ps, iq2_scales(b, at)); }

#endif /* STRATA_AVX2 */
#endif /* STRATA_EXPERT_POOL_SIMD_H */
