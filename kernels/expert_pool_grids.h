/* expert_pool_grids.h: the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) of the AVX-512
 * build, included by expert_pool_groups.h in place of their AVX2 decoders.
 *
 * Why: the AVX2 decoders extract each grid id, sign id and scale with scalar shifts per 16 weights and turn the
 * int8 grid values into floats with a widen, a convert and a multiply; that is 15-20 instructions per 16 weights
 * and the i-quants ran at half the rate of the 4-bit types. Here, once per block (prep, vector ops):
 *   S->h[OFF + i]  byte offset of grid row i in its table (i < 32 rows of 8 values, or < 64 rows of 4)
 *   S->h[MSK + j]  the 16 sign (IQ1: negative delta) bits of group j, bit k = weight k
 *   S->f[j] / S->f[j / 2]  the group's / sub-block's scale (gguf's float operations)
 * and per group of 16 weights: the grid rows loaded into one xmm, the masked lanes' bytes moved to the "negative"
 * indices (one masked byte subtract), and one vpermps of a 16-float table scale * values by each lane's low nibble.
 * The table products (scale * grid value, scale * (grid + delta)) are the float products gguf rounds, and the sign
 * is exact, so each weight is gguf's bit for bit (tests/test_tiers_pool.py checks the row decoder that shares these).
 *
 * Index bytes (the low nibble of each grid byte, after the per-type fix-up) and what the tables hold at them:
 *   IQ2: grid 8, 25, 43, 63 -> 8, 9, 11, 15; negative: minus 8 -> 0, 1, 3, 7
 *   IQ3_XXS: grid 4, 12, .., 52, 62 >> 2 -> 1, 3, .., 13, 15; negative: minus 1 -> 0, 2, .., 14
 *   IQ3_S: grid 1, 3, .., 15 as is; negative: minus 1
 *   IQ1: grid -1, 0, 1 -> 15, 0, 1 (value + 1/8); negative delta: minus 4 -> 11, 12, 13 (value - 1/8)
 */
#ifndef STRATA_EXPERT_POOL_GRIDS_H
#define STRATA_EXPERT_POOL_GRIDS_H
#include "expert_pool_simd.h"

typedef union {
    float f[80];
    uint16_t h[160];
} scratch; /* the per-block scratch of the fused passes (FUSED_PASS's ps points at f) */
#define OFF 64  /* h[64 .. 127]: grid row offsets (bytes 128 .. 255) */
#define MSK 128 /* h[128 .. 143]: sign masks per group (bytes 256 .. 287) */

static const float tab_iq2[16] __attribute__((aligned(64))) = {-8, -25, 0, -43, 0, 0, 0, -63,
                                                                8,  25,  0, 43,  0, 0, 0, 63};
static const float tab_iq3xxs[16] __attribute__((aligned(64))) = {-4,  4,  -12, 12, -20, 20, -28, 28,
                                                                   -36, 36, -44, 44, -52, 52, -62, 62};
static const float tab_iq3s[16] __attribute__((aligned(64))) = {-1, 1,  -3,  3,  -5,  5,  -7,  7,
                                                                 -9, 9, -11, 11, -13, 13, -15, 15};
static const float tab_iq1[16] __attribute__((aligned(64))) = {0.125f, 1.125f, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                -1.125f, -0.125f, 0.875f, 0, -0.875f};

/* one group: index bytes q, lanes of `neg` moved down by `flip`, looked up in scale * table */
AI v16 grid_group(__m128i q, uint32_t neg, int flip, float scale, const float *table) {
    const __m128i idx = _mm_mask_sub_epi8(q, (__mmask16)neg, q, _mm_set1_epi8((char)flip));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(idx), _mm512_mul_ps(_mm512_set1_ps(scale), v16_ld(table)));
}
/* grid rows i, i + 1 of 8 bytes / i .. i + 3 of 4 bytes at the prepared offsets, as one xmm. The offsets are read
 * 2 or 4 at a time and split with integer shifts: a group is load-bound (offsets, rows, x, mask, scale), the
 * integer units are not */
AI __m128i rows8x2(const void *grid, const scratch *S, int i) {
    const uint8_t *g = (const uint8_t *)grid;
    uint32_t o;
    memcpy(&o, S->h + OFF + i, 4);
    return _mm_unpacklo_epi64(ld8(g + (o & 0xFFFF)), ld8(g + (o >> 16)));
}
AI __m128i rows4x4(const void *grid, const scratch *S, int i) {
    const uint8_t *g = (const uint8_t *)grid;
    uint64_t o;
    memcpy(&o, S->h + OFF + i, 8);
    __m128i q = _mm_cvtsi32_si128((int)rd32(g + (o & 0xFFFF)));
    q = _mm_insert_epi32(q, (int)rd32(g + ((o >> 16) & 0xFFFF)), 1);
    q = _mm_insert_epi32(q, (int)rd32(g + ((o >> 32) & 0xFFFF)), 2);
    return _mm_insert_epi32(q, (int)rd32(g + (o >> 48)), 3);
}

#ifdef STRATA_VBMI
/* the sign bytes by table (VBMI): 128 entries of a byte table at t by the low 7 bits of each byte of idx */
AI __m512i lut128(const uint8_t *t, __m512i idx) {
    return _mm512_permutex2var_epi8(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 64));
}
/* IQ2_XXS / IQ3_XXS's 32 sign bytes (one per 8 weights, element order) from the 8 sub-block words a (4 sign ids of
 * 7 bits at 7 l): the ids into bytes by one multishift (bit 7 the next id's, which the lookup ignores), then
 * ksigns_iq2xs by one 128-entry lookup: 2 instructions where the bit arithmetic below takes ~17 */
AI __m256i xxs_signs_vbmi(__m256i a) {
    const __m256i t = _mm256_multishift_epi64_epi8(_mm256_set1_epi64x(0x352E2720150E0700LL), a);
    return _mm512_castsi512_si256(lut128(ksigns_iq2xs, _mm512_castsi256_si512(t)));
}
#endif
/* IQ2_XXS / IQ3_XXS: the 16 groups' sign masks from the 8 sub-block words a[g] (4 sign ids of 7 bits at 7 l, the
 * scale in bits 28..31): group j holds ids 2 (j & 1) and 2 (j & 1) + 1 of a[j / 2], each expanded as ksigns_iq2xs
 * does (the 7 bits, their parity as bit 7) */
AI void xxs_signs(__m256i a, scratch *S) {
#ifdef STRATA_VBMI
    _mm256_store_si256((__m256i *)(S->h + MSK), xxs_signs_vbmi(a));
#else
    __m512i w = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                         _mm512_castsi256_si512(a));
    w = _mm512_srlv_epi32(w, _mm512_setr_epi32(0, 14, 0, 14, 0, 14, 0, 14, 0, 14, 0, 14, 0, 14, 0, 14));
    const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi32(127));
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(w, 7), _mm512_set1_epi32(127));
    __m512i p = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)); /* both ids' parities at once: bits 0 and 16 */
    p = _mm512_xor_si512(p, _mm512_srli_epi32(p, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi32(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi32(p, 1));
    /* mask bits 0..6 / 8..14: the ids; bit 7 / 15: their parities (bits 0 / 16 of p) */
    const __m512i m = _mm512_or_si512(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 8)),
                                      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(p, _mm512_set1_epi32(1)), 7),
                                                      _mm512_srli_epi32(_mm512_and_si512(p, _mm512_set1_epi32(0x10000)), 1)));
    _mm256_store_si256((__m256i *)(S->h + MSK), _mm512_cvtepi32_epi16(m));
#endif
}
/* d * (0.5 + (a >> 28)) * k for the 8 sub-block words a: IQ2_XXS (k = 0.25), IQ3_XXS (k = 0.5) */
AI __m256 xxs_scale8(float d, __m256i a, float k) {
    const __m256 s = _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 28)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), s), _mm256_set1_ps(k));
}
AI void xxs_scales(float d, __m256i a, float k, scratch *S) { _mm256_store_ps(S->f, xxs_scale8(d, a, k)); }

/* IQ2_XXS: d, then per 32 weights u32 (4 grid ids), u32 (4 sign ids, scale) */
AI void prep_iq2_xxs(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    const __m512i v = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
                                               _mm512_loadu_si512(b + 2));
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)), 3));
    const __m256i a = _mm512_extracti64x4_epi64(v, 1);
    xxs_scales(rdh(b), a, 0.25f, S);
    xxs_signs(a, S);
}
AI v16 g_iq2_xxs(const uint8_t *b, int j, const float *ps) {
    (void)b;
    const scratch *S = (const scratch *)ps;
    return grid_group(rows8x2(grid_iq2xxs, S, 2 * j), S->h[MSK + j], 8, S->f[j / 2], tab_iq2);
}
/* IQ2_XS: d, qs u16[32] (9-bit grid id, 7-bit sign id), scales (prep_iq2_scales: S->f[j]) */
AI void prep_iq2_xs(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    prep_iq2_scales(b, 66, ps);
    const __m512i q = _mm512_loadu_si512(b + 2);
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_and_si512(q, _mm512_set1_epi16(511)), 3));
    const __m512i s = _mm512_srli_epi16(q, 9);
#ifdef STRATA_VBMI /* ksigns_iq2xs of each word's id (its low byte), the 32 low bytes packed */
    _mm256_store_si256((__m256i *)(S->h + MSK), _mm512_castsi512_si256(_mm512_permutexvar_epi8(
        _mm512_setr_epi64(0x0E0C0A0806040200LL, 0x1E1C1A1816141210LL, 0x2E2C2A2826242220LL, 0x3E3C3A3836343230LL,
                          0, 0, 0, 0), lut128(ksigns_iq2xs, s))));
#else
    __m512i p = _mm512_xor_si512(s, _mm512_srli_epi16(s, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 1));
    const __m512i k = _mm512_or_si512(s, _mm512_slli_epi16(_mm512_and_si512(p, _mm512_set1_epi16(1)), 7));
    _mm256_store_si256((__m256i *)(S->h + MSK), _mm512_cvtepi16_epi8(k)); /* group j: bytes 2j, 2j + 1 */
#endif
}
AI v16 g_iq2_xs(const uint8_t *b, int j, const float *ps) {
    (void)b;
    const scratch *S = (const scratch *)ps;
    return grid_group(rows8x2(grid_iq2xs, S, 2 * j), S->h[MSK + j], 8, S->f[j], tab_iq2);
}
/* IQ2_S: d, qs[32] (id low bits), signs[32], qh[8] (2 high id bits per id), scales[8] */
AI void prep_iq2_s(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    prep_iq2_scales(b, 74, ps);
    const __m512i lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 2)));
    __m512i hi = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(ld8(b + 66)));
    hi = _mm512_permutexvar_epi16(_mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19,
                                                                      18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                                      5, 4, 3, 2, 1, 0), 2), hi);
    hi = _mm512_srlv_epi16(hi, _mm512_set_epi16(6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0,
                                                6, 4, 2, 0, 6, 4, 2, 0));
    hi = _mm512_slli_epi16(_mm512_and_si512(hi, _mm512_set1_epi16(3)), 8);
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_or_si512(lo, hi), 3));
}
AI v16 g_iq2_s(const uint8_t *b, int j, const float *ps) {
    const scratch *S = (const scratch *)ps;
    return grid_group(rows8x2(grid_iq2s, S, 2 * j), rd16(b + 34 + 2 * j), 8, S->f[j], tab_iq2);
}
/* IQ3_XXS: d, qs[64] (grid ids of 4 values), per 32 weights u32 (4 sign ids of 8 weights, scale) */
AI void prep_iq3_xxs(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 2))), 2));
    _mm512_store_si512(S->h + OFF + 32,
                       _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 34))), 2));
    const __m256i a = _mm256_loadu_si256((const __m256i *)(b + 66));
    xxs_scales(rdh(b), a, 0.5f, S);
    xxs_signs(a, S);
}
AI v16 g_iq3_xxs(const uint8_t *b, int j, const float *ps) {
    (void)b;
    const scratch *S = (const scratch *)ps;
    /* >> 2 in 16-bit lanes: each byte's bits 2..5 land in its low nibble (the neighbour's bits only reach 6, 7) */
    return grid_group(_mm_srli_epi16(rows4x4(grid_iq3xxs, S, 4 * j), 2), S->h[MSK + j], 1, S->f[j / 2], tab_iq3xxs);
}
/* IQ3_S's 8 scales d * (1 + 2 s), s the nibbles of the 4 bytes at 106, low first */
AI __m256 iq3s_scale8d(const uint8_t *b, float d) { /* d: the block's d as a float (rdh(b)) */
    const __m128i sc = _mm_cvtsi32_si128((int)rd32(b + 106));
    const __m256i s = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(sc, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3,
                                                                                                  0, 0, 0, 0, 0, 0, 0, 0))),
                                        _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    const __m256i odd = _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(s, _mm256_set1_epi32(15)), 1),
                                         _mm256_set1_epi32(1));
    return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(odd));
}
AI __m256 iq3s_scale8(const uint8_t *b) { return iq3s_scale8d(b, rdh(b)); }
/* IQ3_S: d, qs[64] (id low bits), qh[8] (9th id bit, bit i of the 64), signs[32], scales[4] (1 + 2 s per 32) */
AI void prep_iq3_s(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    uint64_t qh;
    memcpy(&qh, b + 66, 8);
    const __m512i bit8 = _mm512_set1_epi16(0x100);
    const __m512i lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 2)));
    const __m512i hi = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 34)));
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_mask_add_epi16(lo, (__mmask32)qh, lo, bit8), 2));
    _mm512_store_si512(S->h + OFF + 32, _mm512_slli_epi16(_mm512_mask_add_epi16(hi, (__mmask32)(qh >> 32), hi, bit8), 2));
    _mm256_store_ps(S->f, iq3s_scale8(b));
}
AI v16 g_iq3_s(const uint8_t *b, int j, const float *ps) {
    const scratch *S = (const scratch *)ps;
    return grid_group(rows4x4(grid_iq3s, S, 4 * j), rd16(b + 74 + 2 * j), 1, S->f[j / 2], tab_iq3s);
}
/* IQ1_S: d, qs[32] (id low bits), qh u16[8] (3 high bits per id, 3-bit scale, delta sign) per 32 weights */
AI void prep_iq1_s(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    const __m128i qh = _mm_loadu_si128((const __m128i *)(b + 34));
    const __m512i lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 2)));
    __m512i hi = _mm512_permutexvar_epi16(_mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4, 3, 3, 3, 3,
                                                           2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                          _mm512_castsi128_si512(qh));
    hi = _mm512_srlv_epi16(hi, _mm512_set_epi16(9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0,
                                                9, 6, 3, 0, 9, 6, 3, 0));
    hi = _mm512_slli_epi16(_mm512_and_si512(hi, _mm512_set1_epi16(7)), 8);
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_or_si512(lo, hi), 3));
    /* group j: all 16 lanes negative where the delta bit (15) of qh[j / 2] is set */
    const __m256i h16 = _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                                 _mm256_castsi128_si256(qh));
    _mm256_store_si256((__m256i *)(S->h + MSK), _mm256_srai_epi16(h16, 15));
    const __m256i s = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(qh), 12), _mm256_set1_epi32(7));
    const __m256i odd = _mm256_add_epi32(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1));
    _mm256_store_ps(S->f, _mm256_mul_ps(_mm256_set1_ps(rdh(b)), _mm256_cvtepi32_ps(odd)));
}
AI v16 g_iq1_s(const uint8_t *b, int j, const float *ps) {
    (void)b;
    const scratch *S = (const scratch *)ps;
    return grid_group(rows8x2(grid_iq1s, S, 2 * j), S->h[MSK + j], 4, S->f[j / 2], tab_iq1);
}
/* IQ1_M: qs[32] (id low bits), qh[16] (per id: 3 high bits, delta sign), scales u16[4] (3 bits per 16 weights, the
 * fp16 d in their top nibbles) */
AI void prep_iq1_m(const uint8_t *b, float *ps) {
    scratch *S = (scratch *)ps;
    const __m256i qh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 32)));
    const __m512i lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b));
    __m512i hi = _mm512_permutexvar_epi16(_mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8,
                                                           7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                          _mm512_castsi256_si512(qh));
    hi = _mm512_srlv_epi16(hi, _mm512_set_epi16(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0,
                                                4, 0, 4, 0, 4, 0, 4, 0));
    hi = _mm512_slli_epi16(_mm512_and_si512(hi, _mm512_set1_epi16(7)), 8);
    _mm512_store_si512(S->h + OFF, _mm512_slli_epi16(_mm512_or_si512(lo, hi), 3));
    /* group j = ids 2j (delta bit 3 of qh[j]: lanes 0..7) and 2j + 1 (bit 7: lanes 8..15) */
    const __m256i m = _mm256_or_si256(_mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(qh, 12), 15),
                                                       _mm256_set1_epi16(0x00FF)),
                                      _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(qh, 8), 15),
                                                       _mm256_set1_epi16((short)0xFF00)));
    _mm256_store_si256((__m256i *)(S->h + MSK), m);
    const uint16_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
    const float d = f16_to_f32((uint16_t)(((s0 & 0xF000) >> 12) | ((s1 & 0xF000) >> 8) | ((s2 & 0xF000) >> 4) |
                                          (s3 & 0xF000)));
    __m256i s = _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                         _mm256_castsi128_si256(ld8(b + 48)));
    s = _mm256_and_si256(_mm256_srlv_epi16(s, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
                         _mm256_set1_epi16(7));
    const __m512i odd = _mm512_add_epi32(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s), 1), _mm512_set1_epi32(1));
    _mm512_store_ps(S->f, _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(odd)));
}
AI v16 g_iq1_m(const uint8_t *b, int j, const float *ps) {
    (void)b;
    const scratch *S = (const scratch *)ps;
    return grid_group(rows8x2(grid_iq1s, S, 2 * j), S->h[MSK + j], 4, S->f[j], tab_iq1);
}

#endif /* STRATA_EXPERT_POOL_GRIDS_H */
