/* expert_pool_groups.h: the fused kernels of kernels/expert_pool.c (included by expert_pool_decode.h after the
 * block table): every weight type decoded into registers, 16 weights at a time, and multiplied with up to PASS_M
 * token rows while the weights are in registers: no float scratch row, one pass over the quantized bytes.
 *
 * A "group" is 16 consecutive weights of a block. g_TYPE(block, j) returns group j as 16 float32 values equal bit
 * for bit to gguf.quants.dequantize (the same float operations in the same order: codes as int8 -> float, then the
 * group's scale and min; the file is compiled with -ffp-contract=off, the dots use explicit FMAs). The codes are
 * extracted with 128-bit integer ops (SSSE3 and up, in both builds); a v16 is one zmm register in the AVX-512 build
 * and two ymm registers in the AVX2 build, so each decoder is written once for both.
 *
 * Why the weights and not "q·x per sub-block, scale once": with the exact weights in registers every extra token
 * row costs one FMA per 16 weights; a per-sub-block scale costs one more FMA per row and sub-block (per 16 weights
 * for the K-quants' 16-weight sub-blocks), so it only ties at one row and loses at several.
 */
#ifndef STRATA_EXPERT_POOL_GROUPS_H
#define STRATA_EXPERT_POOL_GROUPS_H
#include "expert_pool_simd.h"
#ifdef STRATA_AVX2

/* ---- group j of one block of each type (the layouts: the scalar decoders in expert_pool_decode.h) */
#ifdef STRATA_PERM
/* the 4-bit types in the AVX-512 build: the permutes read only the low nibble of each index byte, so the high
 * nibble is shifted down and neither half masked (nibx), and Q4_0's - 8 lives in its table d * (k - 8) */
AI __m128i nibx(__m128i q, int hi) { return hi ? _mm_srli_epi16(q, 4) : q; }
AI v16 g_q4_0(const uint8_t *b, int j, const float *ps) {
    (void)ps;
    return perm16(v16_mul(v16_set1(rdh(b)), v16_iota(-8)), nibx(ld16b(b + 2), j));
}
#else
#define nibx nib
AI v16 g_q4_0(const uint8_t *b, int j, const float *ps) {
    return small16(_mm_sub_epi8(nib(ld16b(b + 2), j), _mm_set1_epi8(8)), 1, rdh(b));
}
#endif
AI v16 g_q4_1(const uint8_t *b, int j, const float *ps) { return small16_add(nibx(ld16b(b + 4), j), rdh(b), rdh(b + 2)); }
AI __m128i q5_codes(const uint8_t *b, int j, int qh_at, int qs_at) {
    const uint32_t qh = rd32(b + qh_at) >> (16 * j);
    return _mm_or_si128(nib(ld16b(b + qs_at), j), _mm_and_si128(bitmask16(qh & 0xFFFF), _mm_set1_epi8(0x10)));
}
AI v16 g_q5_0(const uint8_t *b, int j, const float *ps) {
    return small32(_mm_sub_epi8(q5_codes(b, j, 2, 6), _mm_set1_epi8(16)), 1, rdh(b));
}
AI v16 g_q5_1(const uint8_t *b, int j, const float *ps) { return small32_add(q5_codes(b, j, 4, 8), rdh(b), rdh(b + 2)); }
AI v16 g_q8_0(const uint8_t *b, int j, const float *ps) {
    return v16_mul(v16_i8(ld16b(b + 2 + 16 * j)), v16_set1(rdh(b)));
}
AI v16 g_iq4_nl(const uint8_t *b, int j, const float *ps) {
    return lut_scaled(kvalues_iq4nl, nibx(ld16b(b + 2), j), rdh(b));
}
AI v16 g_mxfp4(const uint8_t *b, int j, const float *ps) {
    return lut_scaled(kvalues_fp4, nibx(ld16b(b + 1), j), e8m0_half(b[0]));
}
#ifdef STRATA_PERM
/* the 8 bytes in both halves, the upper half's 16-bit lanes shifted by 4 (its low nibbles are then the high
 * nibbles); the group's scale one load from ue4m3_half_of */
AI v16 g_nvfp4(const uint8_t *b, int j, const float *ps) {
    (void)ps;
    const __m128i q = _mm_srlv_epi16(_mm_set1_epi64x((long long)rd64(b + 4 + 8 * j)), _mm_setr_epi16(0, 0, 0, 0, 4, 4, 4, 4));
    return lut_scaled(kvalues_fp4, q, ue4m3_half_of[b[j]]);
}
#else
AI v16 g_nvfp4(const uint8_t *b, int j, const float *ps) {
    (void)ps;
    const __m128i q = ld8(b + 4 + 8 * j);
    return lut_scaled(kvalues_fp4, _mm_unpacklo_epi64(nib(q, 0), nib(q, 1)), ue4m3_half_of[b[j]]);
}
#endif
AI v16 g_iq4_xs(const uint8_t *b, int j, const float *ps) {
    const int s = j / 2, lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0xF, hi = (rd16(b + 2) >> (2 * s)) & 3;
    const float dl = rdh(b) * (float)((int8_t)(lo | (hi << 4)) - 32);
    return lut_scaled(kvalues_iq4nl, nibx(ld16b(b + 8 + 16 * s), j & 1), dl);
}
/* the types with a min (Q2_K, Q4_K, Q5_K): prep writes the 16 groups' scales to ps[0..15] and mins to ps[16..31];
 * the decoder returns scale * code, the weight is that minus the min (gguf's d * q - m, in that order) */
AI void prep_q45_k(const uint8_t *b, float *ps) {
    const float d = rdh(b), dmin = rdh(b + 2);
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        get_scale_min_k4(b + 4, s, &sc, &m);
        ps[2 * s] = ps[2 * s + 1] = d * (float)sc;
        ps[16 + 2 * s] = ps[17 + 2 * s] = dmin * (float)m;
    }
}
AI v16 g_q45_k(const uint8_t *b, int j, int five, const float *ps) {
    const int s = j / 2, l0 = 16 * (j & 1);
    __m128i q = nib(ld16b(b + (five ? 48 : 16) + (s / 2) * 32 + l0), s % 2);
    if (five)
        q = _mm_or_si128(q, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(ld16b(b + 16 + l0), s), _mm_set1_epi8(1)), 4));
    return five ? small32(q, 0, ps[j]) : small16(q, 0, ps[j]);
}
AI v16 g_q4_k(const uint8_t *b, int j, const float *ps) { return g_q45_k(b, j, 0, ps); }
AI v16 g_q5_k(const uint8_t *b, int j, const float *ps) { return g_q45_k(b, j, 1, ps); }
AI v16 g_q6_k(const uint8_t *b, int j, const float *ps) {
    const int c = j / 2, l0 = 16 * (j & 1), h = c / 4, s = (c % 4) / 2;
    const __m128i lo = nib(ld16b(b + h * 64 + (c % 2) * 32 + l0), s);
    const __m128i hi = crumb(ld16b(b + 128 + h * 32 + l0), c % 4);
    const __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    return v16_mul(v16_set1(ps[j]), v16_i8(q));
}
AI void prep_q6_k(const uint8_t *b, float *ps) { v16_st(ps, v16_mul(v16_set1(rdh(b + 208)), v16_i8(ld16b(b + 192)))); }
/* the 2-bit planes of Q2_K / Q3_K / TQ2_0: group j = plane (j % 8) / 2 of bytes 32 (j / 8) + 16 (j & 1) */
AI __m128i plane2(const uint8_t *qs, int j) { return crumb(ld16b(qs + 32 * (j / 8) + 16 * (j & 1)), (j % 8) / 2); }
AI void prep_q2_k(const uint8_t *b, float *ps) { /* the 16 sub-block scales d * sc, then the mins dmin * m */
    const __m128i sc = ld16b(b);
    v16_st(ps, v16_mul(v16_set1(rdh(b + 80)), v16_i8(nib(sc, 0))));
    v16_st(ps + 16, v16_mul(v16_set1(rdh(b + 82)), v16_i8(nib(sc, 1))));
}
#ifdef STRATA_PERM
/* the 2-bit planes unmasked: the permute reads the low nibble, whose upper two bits (the next plane) the tables
 * ignore by repeating every 4 entries */
AI __m128i plane2x(const uint8_t *qs, int j) {
    return _mm_srli_epi16(ld16b(qs + 32 * (j / 8) + 16 * (j & 1)), 2 * ((j % 8) / 2));
}
AI v16 v16_cyc4(int from) { return _mm512_add_ps(_mm512_set1_ps((float)from), _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3)); }
AI v16 v16_rep4(void) { return _mm512_setr_ps(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); } /* index bits 2, 3 */
/* Q2_K: the 16 code bytes of group j widened to dwords once for the 4 planes that share them (groups j % 8 / 2 =
 * 0..3 of one (j / 8, j & 1); the pass's unrolled groups reuse the widen), planes 0, 1 in index bits 0..3 and planes
 * 2, 3 after one shift by 4, looked up in d * sc times 0..3 by bits 0, 1 (cyc4) or 2, 3 (rep4): per 16 weights a
 * multiply and a permute and half a shift, instead of a multiply, a permute, a shift and a widen (same products) */
AI v16 g_q2_k(const uint8_t *b, int j, const float *ps) {
    const __m512i e = _mm512_cvtepu8_epi32(ld16b(b + 16 + 32 * (j / 8) + 16 * (j & 1)));
    const int s = (j % 8) / 2;
    return _mm512_permutexvar_ps(s >= 2 ? _mm512_srli_epi32(e, 4) : e,
                                 v16_mul(v16_set1(ps[j]), s & 1 ? v16_rep4() : v16_cyc4(0)));
}
AI v16 g_tq2_0(const uint8_t *b, int j, const float *ps) {
    (void)ps;
    return perm16(v16_mul(v16_set1(rdh(b + 64)), v16_cyc4(-1)), plane2x(b, j));
}
#else
/* Q2_K (AVX2): the 4 weights a group's codes can take, dl * k - ml for k = 0..3 (gguf's two float operations in
 * its order, so the same bits), once per 16 weights in both 128-bit halves, and each weight a vpermilps of them by
 * its code: the instruction reads the low 2 bits of each dword, so the bytes widened to dwords once serve all 4
 * planes (a shift each; the pass's unrolled groups reuse the widen) and the other planes above are ignored. Per 16
 * weights: 2 multiply/subtract, 2 shifts and 2 permutes and half of 2 widens, where the convert path took a mask
 * and shift, 3 widens, 2 converts, 2 multiplies and 2 subtracts (the min: the decoder's, Q2K_MINS 0) */
AI v16 g_q2_k(const uint8_t *b, int j, const float *ps) {
    const uint8_t *q = b + 16 + 32 * (j / 8) + 16 * (j & 1);
    const int s = (j % 8) / 2;
    const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(ps[j]), _mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3)),
                                   _mm256_set1_ps(ps[16 + j]));
    const __m256i e0 = _mm256_cvtepu8_epi32(ld8(q)), e1 = _mm256_cvtepu8_epi32(ld8(q + 8));
    return (v16){_mm256_permutevar_ps(t, s ? _mm256_srli_epi32(e0, 2 * s) : e0),
                 _mm256_permutevar_ps(t, s ? _mm256_srli_epi32(e1, 2 * s) : e1)};
}
/* TQ2_0 (AVX2): as Q2_K's, the 4 weights d * (k - 1) a code can take (gguf's product, so the same bits) in both
 * 128-bit halves, each weight a vpermilps of them by its code, the bytes widened to dwords once for the 4 planes that
 * share them; per 16 weights 2 permutes, 1.5 shifts and half of 2 widens, where the convert path took a mask and
 * shift, a subtract, 2 widens, 2 converts and 2 multiplies */
AI v16 g_tq2_0(const uint8_t *b, int j, const float *ps) {
    (void)ps;
    const uint8_t *q = b + 32 * (j / 8) + 16 * (j & 1);
    const int s = (j % 8) / 2;
    const __m256 t = _mm256_mul_ps(_mm256_set1_ps(rdh(b + 64)), _mm256_setr_ps(-1, 0, 1, 2, -1, 0, 1, 2));
    const __m256i e0 = _mm256_cvtepu8_epi32(ld8(q)), e1 = _mm256_cvtepu8_epi32(ld8(q + 8));
    return (v16){_mm256_permutevar_ps(t, s ? _mm256_srli_epi32(e0, 2 * s) : e0),
                 _mm256_permutevar_ps(t, s ? _mm256_srli_epi32(e1, 2 * s) : e1)};
}
#endif
AI void prep_q3_k(const uint8_t *b, float *ps) { /* the 16 scales d * s, converted and multiplied as one vector */
    int8_t sc[16];
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)k_scale6(b + 96, j);
    v16_st(ps, v16_mul(v16_set1(rdh(b + 108)), v16_i8(ld16b((const uint8_t *)sc))));
}
AI v16 g_q3_k(const uint8_t *b, int j, const float *ps) {
    const __m128i hb = _mm_and_si128(_mm_srli_epi16(ld16b(b + 16 * (j & 1)), j / 2), _mm_set1_epi8(1));
    const __m128i q = _mm_sub_epi8(plane2(b + 32, j), _mm_slli_epi16(_mm_xor_si128(hb, _mm_set1_epi8(1)), 2));
    return small16(q, 1, ps[j]);
}
AI v16 g_tq1_0(const uint8_t *b, int j, const float *ps) {
    /* base-3 digits: element e of the group is byte V[e] times 3^P[e] (mod 256), the digit ((v * 3) >> 8) - 1,
     * in 16-bit lanes: groups 0..9 read bytes 16 (j % 2) with power j / 2, 10..14 bytes 32 with power j - 10, and
     * group 15 the 4 bytes at 48, each with the powers 1, 3, 9, 27 */
    static const int16_t pow3[5] = {1, 3, 9, 27, 81};
    __m128i v;
    __m256i p;
    if (j < 15) {
        v = ld16b(b + (j < 10 ? 16 * (j & 1) : 32));
        p = _mm256_set1_epi16((int16_t)(pow3[j < 10 ? j / 2 : j - 10] << 8));
    } else {
        v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)rd32(b + 48)),
                             _mm_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3));
        p = _mm256_setr_epi16(1 << 8, 1 << 8, 1 << 8, 1 << 8, 3 << 8, 3 << 8, 3 << 8, 3 << 8, 9 << 8, 9 << 8, 9 << 8,
                              9 << 8, 27 << 8, 27 << 8, 27 << 8, 27 << 8);
    }
    /* v * (3^P << 8) mod 2^16 is (v * 3^P mod 256) << 8, and its high half times 3 the digit: two multiplies */
    const __m256i w = _mm256_mulhi_epu16(_mm256_mullo_epi16(_mm256_cvtepu8_epi16(v), p), _mm256_set1_epi16(3));
#ifdef STRATA_PERM /* the digits 0, 1, 2 index d * (digit - 1) straight from their 16-bit lanes */
    return _mm512_permutexvar_ps(_mm512_cvtepu16_epi32(w), v16_mul(v16_set1(rdh(b + 52)), v16_iota(-1)));
#else /* the digits 0, 1, 2 as dwords index d * (digit - 1) by vpermilps (its low 2 bits) */
    const __m256 t = _mm256_mul_ps(_mm256_set1_ps(rdh(b + 52)), _mm256_setr_ps(-1, 0, 1, 0, -1, 0, 1, 0));
    return (v16){_mm256_permutevar_ps(t, _mm256_cvtepu16_epi32(_mm256_castsi256_si128(w))),
                 _mm256_permutevar_ps(t, _mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1)))};
#endif
}
#ifndef STRATA_PERM
/* i-quants (AVX2 build): (db * grid) * sign = db * (sign * grid) exactly */
AI v16 g_iq2_xxs(const uint8_t *b, int j, const float *ps) {
    const int g = j / 2, l = 2 * (j & 1);
    const uint32_t a0 = rd32(b + 2 + 8 * g), a1 = rd32(b + 6 + 8 * g);
    const __m128i q = two8(grid_iq2xxs[(a0 >> (8 * l)) & 0xFF], grid_iq2xxs[(a0 >> (8 * l + 8)) & 0xFF]);
    const uint32_t sg = ksigns_iq2xs[(a1 >> (7 * l)) & 127] | (uint32_t)ksigns_iq2xs[(a1 >> (7 * l + 7)) & 127] << 8;
    return scaled(signed16(q, sg), rdh(b) * (0.5f + (float)(a1 >> 28)) * 0.25f);
}
AI void prep_iq2_xs(const uint8_t *b, float *ps) { prep_iq2_scales(b, 66, ps); }
AI void prep_iq2_s(const uint8_t *b, float *ps) { prep_iq2_scales(b, 74, ps); }
AI v16 g_iq2_xs(const uint8_t *b, int j, const float *ps) {
    const uint16_t q0 = rd16(b + 4 * j + 2), q1 = rd16(b + 4 * j + 4);
    const uint32_t sg = ksigns_iq2xs[q0 >> 9] | (uint32_t)ksigns_iq2xs[q1 >> 9] << 8;
    return scaled(signed16(two8(grid_iq2xs[q0 & 511], grid_iq2xs[q1 & 511]), sg), ps[j]);
}
AI v16 g_iq2_s(const uint8_t *b, int j, const float *ps) {
    const int i = 2 * j, hi = b[66 + i / 4] >> (2 * (i % 4));
    const int id0 = b[2 + i] | ((hi & 3) << 8), id1 = b[3 + i] | (((hi >> 2) & 3) << 8);
    return scaled(signed16(two8(grid_iq2s[id0], grid_iq2s[id1]), rd16(b + 34 + i)), ps[j]);
}
AI v16 g_iq3_xxs(const uint8_t *b, int j, const float *ps) {
    const int g = j / 2, l = 2 * (j & 1);
    const uint32_t sc = rd32(b + 66 + 4 * g);
    const uint8_t *ids = b + 2 + 8 * g + 2 * l;
    const __m128i q = four4(grid_iq3xxs[ids[0]], grid_iq3xxs[ids[1]], grid_iq3xxs[ids[2]], grid_iq3xxs[ids[3]]);
    const uint32_t sg = ksigns_iq2xs[(sc >> (7 * l)) & 127] | (uint32_t)ksigns_iq2xs[(sc >> (7 * l + 7)) & 127] << 8;
    return scaled(signed16(q, sg), rdh(b) * (0.5f + (float)(sc >> 28)) * 0.5f);
}
AI v16 g_iq3_s(const uint8_t *b, int j, const float *ps) {
    const int g = j / 2, i = 4 * j, hb = b[66 + i / 8] >> (i % 8);
    const __m128i q = four4(grid_iq3s[b[2 + i] | ((hb & 1) << 8)], grid_iq3s[b[3 + i] | ((hb & 2) << 7)],
                            grid_iq3s[b[4 + i] | ((hb & 4) << 6)], grid_iq3s[b[5 + i] | ((hb & 8) << 5)]);
    const float db = rdh(b) * (float)(1 + 2 * ((b[106 + g / 2] >> (4 * (g % 2))) & 0xF));
    return scaled(signed16(q, rd16(b + 74 + 2 * j)), db);
}
/* IQ1: dl * (grid + delta) with delta = +-1/8: grid + delta is exact, so the lanes add it in float */
AI v16 iq1_value(__m128i grid, uint32_t neg, float dl) {
#ifdef STRATA_PERM /* the 6 values dl * (grid + delta) once, then a permute by grid (low nibble) and delta (bit 4) */
    const __m128i idx = _mm_or_si128(_mm_and_si128(grid, _mm_set1_epi8(15)),
                                     _mm_and_si128(bitmask16(neg), _mm_set1_epi8(16)));
    return perm32(v16_mul(v16_set1(dl), v16_add(v16_signed4(), v16_set1(0.125f))),
                  v16_mul(v16_set1(dl), v16_add(v16_signed4(), v16_set1(-0.125f))), idx);
#else
    const __m128i delta8 = _mm_or_si128(bitmask16(neg), _mm_set1_epi8(1)); /* -1 or +1 per byte */
    return v16_mul(v16_set1(dl), v16_add(v16_i8(grid), v16_mul(v16_i8(delta8), v16_set1(0.125f))));
#endif
}
AI v16 g_iq1_s(const uint8_t *b, int j, const float *ps) {
    const int g = j / 2, l = 2 * (j & 1);
    const uint16_t h = rd16(b + 34 + 2 * g);
    const __m128i q = two8(grid_iq1s[b[2 + 4 * g + l] | (((h >> (3 * l)) & 7) << 8)],
                           grid_iq1s[b[3 + 4 * g + l] | (((h >> (3 * l + 3)) & 7) << 8)]);
    return iq1_value(q, (h & 0x8000) ? 0xFFFF : 0, rdh(b) * (float)(2 * ((h >> 12) & 7) + 1));
}
AI v16 g_iq1_m(const uint8_t *b, int j, const float *ps) {
    const uint16_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
    const float d = f16_to_f32((uint16_t)(((s0 & 0xF000) >> 12) | ((s1 & 0xF000) >> 8) | ((s2 & 0xF000) >> 4) |
                                          (s3 & 0xF000)));
    const uint16_t sw = rd16(b + 48 + 2 * (j / 4));
    const int h = b[32 + j];
    const __m128i q = two8(grid_iq1s[b[2 * j] | ((h & 7) << 8)], grid_iq1s[b[2 * j + 1] | (((h >> 4) & 7) << 8)]);
    const float dl = d * (float)(2 * ((sw >> (3 * (j % 4))) & 7) + 1);
    return iq1_value(q, ((h & 8) ? 0xFF : 0) | ((h & 0x80) ? 0xFF00 : 0), dl);
}
#define prep_iq2_xxs prep_none
#define prep_iq3_xxs prep_none
#define prep_iq3_s prep_none
#define prep_iq1_s prep_none
#define prep_iq1_m prep_none
#else
#include "expert_pool_grids.h"
#endif
/* float rows: a "block" of 16 values */
AI v16 g_f32(const uint8_t *b, int j, const float *ps) { (void)j; (void)ps; return v16_ld((const float *)b); }
AI v16 g_f16(const uint8_t *b, int j, const float *ps) { (void)j; (void)ps; return v16_f16(b); }
AI v16 g_bf16(const uint8_t *b, int j, const float *ps) { (void)j; (void)ps; return v16_bf16(b); }

AI void prep_none(const uint8_t *b, float *ps) { (void)b; (void)ps; }

/* every type: (id, decoder, groups per block, block bytes, per-block prep of the scales the decoder reads from ps:
 * vector ops once per block instead of scalar ones per group, MINS: the weight is the decoder's value minus the
 * group's min ps[16 + j], and GPB is 16) */
#define FUSED_TYPES(X) \
    X(T_F32, g_f32, 1, 64, prep_none, 0) X(T_F16, g_f16, 1, 32, prep_none, 0) \
    X(T_BF16, g_bf16, 1, 32, prep_none, 0) X(T_Q4_0, g_q4_0, 2, 18, prep_none, 0) \
    X(T_Q4_1, g_q4_1, 2, 20, prep_none, 0) X(T_Q5_0, g_q5_0, 2, 22, prep_none, 0) \
    X(T_Q5_1, g_q5_1, 2, 24, prep_none, 0) X(T_Q8_0, g_q8_0, 2, 34, prep_none, 0) \
    X(T_IQ4_NL, g_iq4_nl, 2, 18, prep_none, 0) X(T_MXFP4, g_mxfp4, 2, 17, prep_none, 0) \
    X(T_NVFP4, g_nvfp4, 4, 36, prep_none, 0) X(T_Q2_K, g_q2_k, 16, 84, prep_q2_k, Q2K_MINS) \
    X(T_Q3_K, g_q3_k, 16, 110, prep_q3_k, 0) X(T_Q4_K, g_q4_k, 16, 144, prep_q45_k, 1) \
    X(T_Q5_K, g_q5_k, 16, 176, prep_q45_k, 1) X(T_Q6_K, g_q6_k, 16, 210, prep_q6_k, 0) \
    X(T_IQ4_XS, g_iq4_xs, 16, 136, prep_none, 0) X(T_IQ2_XXS, g_iq2_xxs, 16, 66, prep_iq2_xxs, 0) \
    X(T_IQ2_XS, g_iq2_xs, 16, 74, prep_iq2_xs, 0) X(T_IQ2_S, g_iq2_s, 16, 82, prep_iq2_s, 0) \
    X(T_IQ3_XXS, g_iq3_xxs, 16, 98, prep_iq3_xxs, 0) X(T_IQ3_S, g_iq3_s, 16, 110, prep_iq3_s, 0) \
    X(T_IQ1_S, g_iq1_s, 16, 50, prep_iq1_s, 0) X(T_IQ1_M, g_iq1_m, 16, 56, prep_iq1_m, 0) \
    X(T_TQ1_0, g_tq1_0, 16, 54, prep_none, 0) X(T_TQ2_0, g_tq2_0, 16, 66, prep_none, 0)

/* the per-block scratch of the passes: ps[0..31] scales and mins; the AVX-512 grid decoders' offsets and masks
 * behind them (expert_pool_grids.h). The passes keep two and prepare block b + 1 before decoding block b: the
 * decoders read back the prep's vector stores with scalar loads, which would wait for them if read at once. */
#ifdef STRATA_PERM
#define PS_SCRATCH scratch sc_ __attribute__((aligned(64))); float *const ps = sc_.f
#define PS_SCRATCH2 scratch sc2_[2] __attribute__((aligned(64)))
#define PS_OF(b) (sc2_[(b) & 1].f)
#else
#define PS_SCRATCH float ps[32] __attribute__((aligned(64)))
#define PS_SCRATCH2 float ps2_[2][32] __attribute__((aligned(64)))
#define PS_OF(b) (ps2_[(b) & 1])
#endif

/* which preps run a block ahead (PIPE_ 1): those whose scalar read-backs of vector stores would wait; Q4_K/Q5_K's
 * scalar prep measured slower ahead (its stored scales are then reloaded instead of kept in registers) */
enum {
    PIPE_prep_none = 0, PIPE_prep_q2_k = 1, PIPE_prep_q3_k = 1, PIPE_prep_q45_k = 0, PIPE_prep_q6_k = 1,
    PIPE_prep_iq2_xs = 1, PIPE_prep_iq2_s = 1, PIPE_prep_iq2_xxs = 1, PIPE_prep_iq3_xxs = 1, PIPE_prep_iq3_s = 1,
    PIPE_prep_iq1_s = 1, PIPE_prep_iq1_m = 1
};

#define PREFETCH_AHEAD 2048 /* bytes ahead of the block being read */
/* The software prefetch of the passes (prefetcht0, PREFETCH_AHEAD ahead; the device's sweep of 2026-12-02 measured
 * 4096 ahead and prefetcht1 no better):
 *   by blocks (PF_BLOCK, most types): per block, one prefetch per 64 bytes of the block: 3.6 prefetches per cache
 *     line for the 17-18-byte blocks, all but one to a line already on its way; a work item's first PREFETCH_AHEAD
 *     bytes are demand misses until the hardware prefetcher catches on.
 *   by lines (PF_LINES, pf_lines_of: Q4_0 in lane order): each 64-byte line once, when the pass over a
 *     row starts: the row's bytes PREFETCH_AHEAD ahead (rows are contiguous, so consecutive rows prefetch
 *     consecutive spans), never past the work item's end, and the item's first PREFETCH_AHEAD bytes prefetched when
 *     it starts (prefetch_span in expert_pool.c). Measured on the device at 16 threads: Q2_K+Q4_0 +12 / +9 / 0 % (4 KB
 *     / 2 MB / file pages), Q4_0 +1 / 0 / +9 %, MXFP4 0 / +1 / -1 %, Q8_0 -1 / -8 / -3 % (its 42-line bursts per row
 *     fill the miss buffers at once), with the weight-table kernels. With the lane-order kernels on the dev box
 *     (1 thread, L3-hot): Q4_0 by lines as fast as by blocks, Q2_K by lines 30 % slower (4.8 against 6.8 GB/s of
 *     gate/up), so Q4_0 only; whether Q2_K gains by lines from DRAM is the device's to measure. */
AI void prefetch_lines(const uint8_t *from, int64_t n, const uint8_t *end) {
    const uint8_t *to = from + n < end ? from + n : end;
    for (const uint8_t *p = (const uint8_t *)((uintptr_t)from & ~(uintptr_t)63); p < to; p += 64)
        __builtin_prefetch(p, 0, 3);
}
#define PF_LINES(row, bytes, end) prefetch_lines((row) + PREFETCH_AHEAD, (bytes), (end))
#define PF_BLOCK(blk, bpb)                                                                                          \
    do {                                                                                                            \
        for (int p_ = 0; p_ < (bpb); p_ += 64) __builtin_prefetch((blk) + PREFETCH_AHEAD + p_, 0, 3);               \
    } while (0)

/* The min term: in the AVX-512 build the MINS types FMA scale * code with x and subtract sum_g min_g * xsum_g once
 * per block (xsum: the sums of x over its 16-element groups, computed once per token row and work item), one float
 * operation fewer per 16 weights and row; the AVX2 build (16 ymm registers) subtracts the min from each weight. */
#ifdef STRATA_AVX512
#define MIN_TERM 1
#else
#define MIN_TERM 0
#endif
/* Q2_K's min: the AVX-512 build's min term (its decoder returns d * sc * code); the AVX2 decoder looks up the whole
 * weight d * sc * code - dmin * m (g_q2_k), so to the passes and the row decoder it is a type without one */
#define Q2K_MINS MIN_TERM

/* one pass: a weight row of nb blocks against M token rows (M a constant after inlining); 2 accumulators per row
 * so that consecutive groups' FMAs do not wait on each other */
#define FUSED_PASS(ID, DEC, GPB, BPB, PREP, MINS)                                                                  \
    AI void pass_##DEC(const uint8_t *row, int nb, const float *const *xs, const float *const *xsum, float *out,   \
                       const int M, const uint8_t *pf_end) {                                                       \
        v16 acc[PASS_M][2], macc[PASS_M];                                                                           \
        PS_SCRATCH2;                                                                                                \
        (void)pf_end;                                                                                               \
        for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = macc[r] = v16_zero();                                   \
        if (PIPE_##PREP && nb > 0) PREP(row, PS_OF(0));                                                             \
        for (int b = 0; b < nb; b++) {                                                                              \
            const uint8_t *blk = row + (int64_t)BPB * b;                                                            \
            PF_BLOCK(blk, BPB);                                                                                     \
            float *const ps = PS_OF(PIPE_##PREP ? b : 0);                                                           \
            if (!PIPE_##PREP) PREP(blk, ps);                                                                        \
            else if (b + 1 < nb) PREP(blk + BPB, PS_OF(b + 1));                                                     \
            if (MINS && MIN_TERM)                                                                                   \
                for (int r = 0; r < M; r++) macc[r] = v16_fma(v16_ld(ps + 16), v16_ld(xsum[r] + 16 * b), macc[r]); \
            _Pragma("GCC unroll 16") for (int j = 0; j < GPB; j++) {                                                \
                v16 w = DEC(blk, j, ps);                                                                            \
                if (MINS && !MIN_TERM) w = v16_sub(w, v16_set1(ps[16 + j]));                                        \
                const int64_t off = 16 * ((int64_t)GPB * b + j);                                                    \
                for (int r = 0; r < M; r++) acc[r][j & 1] = v16_fma(w, v16_ld(xs[r] + off), acc[r][j & 1]);         \
            }                                                                                                       \
        }                                                                                                           \
        for (int r = 0; r < M; r++)                                                                                 \
            out[r] = v16_hsum(v16_add(acc[r][0], acc[r][1])) - (MINS && MIN_TERM ? v16_hsum(macc[r]) : 0.0f);      \
    }                                                                                                               \
    static void dots_##DEC(const uint8_t *row, int n, const float *const *xs, const float *const *xsum, int m,     \
                           float *out, const uint8_t *pf_end) {                                                     \
        const int nb = n / (16 * GPB);                                                                              \
        for (int r0 = 0; r0 < m;) {                                                                                 \
            const int left = m - r0, M = PASS_M >= 8 && left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;         \
            if (M == 8) pass_##DEC(row, nb, xs + r0, xsum + r0, out + r0, PASS_M >= 8 ? 8 : 1, pf_end);             \
            else if (M == 4) pass_##DEC(row, nb, xs + r0, xsum + r0, out + r0, 4, pf_end);                          \
            else if (M == 2) pass_##DEC(row, nb, xs + r0, xsum + r0, out + r0, 2, pf_end);                          \
            else pass_##DEC(row, nb, xs + r0, xsum + r0, out + r0, 1, pf_end);                                      \
            r0 += M;                                                                                                \
        }                                                                                                           \
    }                                                                                                               \
    static void rowdeq_##DEC(const uint8_t *src, int64_t n, float *y) {                                            \
        PS_SCRATCH;                                                                  \
        for (int64_t b = 0; b < n / (16 * GPB); b++) {                                                              \
            PREP(src + (int64_t)BPB * b, ps);                                                                       \
            _Pragma("GCC unroll 16") for (int j = 0; j < GPB; j++) {                                                \
                v16 w = DEC(src + (int64_t)BPB * b, j, ps);                                                         \
                if (MINS) w = v16_sub(w, v16_set1(ps[16 + j]));                                                     \
                v16_st(y + 16 * (GPB * b + j), w);                                                                  \
            }                                                                                                       \
        }                                                                                                           \
    }
FUSED_TYPES(FUSED_PASS)

#ifdef STRATA_PERM
/* Q2_K in lane order (the AVX-512 build's gate/up rows): x permuted once per call (xperm_q2_k) so that the 64
 * code bytes of a block, read as 16 dwords in one zmm, decode with one shift and one permute per 16 weights, and
 * the sub-block scales are applied once per 4 groups: group (s, k) (s the 2-bit plane, k the byte in the dword)
 * holds in lane i the weight of byte 4 i + k, plane s:
 *   e(s, k, i) = 128 (i / 8) + 32 s + (4 i + k) % 32,  sub-block 8 (i / 8) + 2 s + (i / 4) % 2 (the same for all k)
 * so per plane s: a = sum_k q(s, k) * xp(s, k) (q the codes 0..3 as floats: exact), then acc += S_s * a, S_s the
 * 16 lanes' sub-block scales d * sc (one permute of the block's 16 scales); the min term as in FUSED_PASS.
 * Why: the weight-table decoder (g_q2_k) pays per 16 weights a scale x table multiply, a byte widen and a permute
 * beside the FMA; here under half a shift (7 a block), a permute (of a constant table) and 1.25 FMAs. Float32 math on the exact codes and
 * scales, summed in another order than the weight-table kernel (within the tests' 1e-4 of float64, not its bits). */
AI int q2x_src(int g, int i) { /* the in-block element that lane i of lane-order group g = 4 s + k holds */
    const int s = g / 4, k = g % 4;
    return 128 * (i / 8) + 32 * s + (4 * i + k) % 32;
}
static void xperm_q2_k(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++)
        for (int g = 0; g < 16; g++)
            for (int i = 0; i < 16; i++) xp[256 * b + 16 * g + i] = x[256 * b + q2x_src(g, i)];
}
/* Q3_K's 16 scales d * (6-bit scale - 32) (k_scale6) in vector ops: bytes j < 8 the low nibbles of sc[0..7], j >= 8
 * their high nibbles; the top 2 bits of byte j = 4 q + m from sc[8 + m] >> 2 q */
AI v16 q3k_scales(const uint8_t *b) {
    const __m128i x = ld8(b + 96);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(x, _mm_set1_epi8(15)),
                                          _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(15)));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)rd32(b + 104)), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    const __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    return v16_mul(v16_set1(rdh(b + 108)), v16_i8(q));
}
AI void pass_q2_kx(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                   float *out, const int M, const uint8_t *pf_end) {
    const int nb = n / 256, Q3 = type == T_Q3_K, BPB = Q3 ? 110 : 84;
    v16 acc[PASS_M][2];
    /* Q2_K: the codes 0..3 of plane 2 p (index bits 0, 1: cyc4) or 2 p + 1 (bits 2, 3: rep4) of one index register
     * (the planes below); Q3_K: index bit 2 its hmask bit, the value crumb - 4 + 4 hbit = index - 4 (bit 3 ignored) */
    const v16 table = Q3 ? _mm512_setr_ps(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3) : v16_cyc4(0);
    const v16 rep4 = _mm512_setr_ps(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int NA = M <= 2 ? 2 : 1; /* independent sums per row where few rows give few chains */
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = v16_zero();
    (void)pf_end;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + BPB * (int64_t)b;
        PF_BLOCK(blk, BPB);
        v16 sc;
        __m512i hm = _mm512_setzero_si512(), q = _mm512_setzero_si512(), qk[4], qh[4];
        if (Q3) {
            sc = q3k_scales(blk);
            /* hmask[l] bit 4 h + s for the element of half h = i / 8, plane s, byte l = 4 (i % 8) + k: hmask's 8
             * dwords in both halves, the upper lanes shifted by 4: bit s of byte k */
            hm = _mm512_srlv_epi32(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk)),
                                   _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4));
            q = _mm512_loadu_si512(blk + 32);
        } else {
            /* Q2_K's scales and mins: the 16 scale bytes as dwords once, their nibbles as floats by permutes of
             * 0..15 (vpermps reads the low 4 bits: no mask, no convert), times d / dmin from one f16 pair load
             * (the same products d * (float)sc as gguf's, so the same bits) */
            const __m512i e = _mm512_cvtepu8_epi32(ld16b(blk));
            const v16 dd = _mm512_cvtph_ps(_mm256_set1_epi32((int)rd32(blk + 80))); /* d, dmin, d, dmin, .. */
            sc = v16_mul(_mm512_moveldup_ps(dd), _mm512_permutexvar_ps(e, v16_iota(0)));
            const v16 mn = v16_mul(_mm512_movehdup_ps(dd), _mm512_permutexvar_ps(_mm512_srli_epi32(e, 4), v16_iota(0)));
            for (int r = 0; r < M; r++) acc[r][0] = _mm512_fnmadd_ps(mn, v16_ld(xsum[r] + 16 * b), acc[r][0]);
            /* the planes: one index register per byte k of the dwords (dword i's low byte = byte 4 i + k) holds
             * planes 0, 1 of that byte in its bits 0..3, and shifted by 4 planes 2, 3: 7 shifts a block instead of
             * 15 (reading the codes at byte offsets 1..3 instead measured slower: 4 loads that split cache lines).
             * The empty asm keeps q in a register: GCC otherwise re-reads it as the shifts' memory operand (6 split
             * loads a block, -17 % on the dev box) */
            q = _mm512_loadu_si512(blk + 16);
            __asm__("" : "+v"(q));
            for (int k = 0; k < 4; k++) {
                qk[k] = k ? _mm512_srli_epi32(q, 8 * k) : q;
                qh[k] = _mm512_srli_epi32(qk[k], 4);
            }
        }
        _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++) {
            /* Q3_K: plane s in bits 0..1 of each byte, its hmask bit in bit 2 (one bit select per 4 groups) */
            const __m512i qs = !Q3 || !s ? q : _mm512_srli_epi32(q, 2 * s);
            const __m512i hb = s < 2 ? _mm512_slli_epi32(hm, 2 - s) : s == 3 ? _mm512_srli_epi32(hm, 1) : hm;
            const __m512i q3 = Q3 ? _mm512_ternarylogic_epi32(qs, hb, _mm512_set1_epi8(4), 0xD8) : qs; /* c ? b : a */
            const v16 S = _mm512_permutexvar_ps(
                _mm512_setr_epi32(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1, 8 + 2 * s,
                                  8 + 2 * s, 8 + 2 * s, 8 + 2 * s, 9 + 2 * s, 9 + 2 * s, 9 + 2 * s, 9 + 2 * s), sc);
            v16 a[PASS_M];
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const v16 w = Q3 ? _mm512_permutexvar_ps(k ? _mm512_srli_epi32(q3, 8 * k) : q3, table)
                                 : _mm512_permutexvar_ps(s < 2 ? qk[k] : qh[k], s % 2 ? rep4 : table);
                const int64_t off = 256 * (int64_t)b + 16 * (4 * s + k);
                for (int r = 0; r < M; r++)
                    a[r] = k ? v16_fma(w, v16_ld(xs[r] + off), a[r]) : v16_mul(w, v16_ld(xs[r] + off));
            }
            for (int r = 0; r < M; r++) acc[r][(s + 1) % NA] = v16_fma(S, a[r], acc[r][(s + 1) % NA]);
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(v16_add(acc[r][0], acc[r][1]));
}
/* the passes of one lane-order kernel over m token rows: 8, 4, 2, 1 at a time (M a constant in each pass) */
#define LANE_DOTS(NAME, PASS, TYPE)                                                                                 \
    static void dots_##NAME(const uint8_t *row, int n, const float *const *xs, const float *const *xsum, int m,   \
                            float *out, const uint8_t *pf_end) {                                                    \
        for (int r0 = 0; r0 < m;) {                                                                                 \
            const int left = m - r0, M = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;                        \
            if (M == 8) PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 8, pf_end);                                \
            else if (M == 4) PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 4, pf_end);                           \
            else if (M == 2) PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 2, pf_end);                           \
            else PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 1, pf_end);                                       \
            r0 += M;                                                                                                \
        }                                                                                                           \
    }
LANE_DOTS(q2_kx, pass_q2_kx, T_Q2_K)
LANE_DOTS(q3_kx, pass_q2_kx, T_Q3_K)
#endif

#ifdef STRATA_PERM
/* pass_q2_k_rows converts the next block's d / dmin of its RW rows in one xmm (a block
 * ahead, off the block's chain) and stores them, so the scale and min products take them as memory broadcasts
 * ({1to16}: a load, no shuffle) instead of a zmm broadcast, a zmm f16 convert and two dups per row, and the mins'
 * nibbles are converted (p0) instead of permuted out of iota (p5, the port the 20 permutes a block-row load). Per
 * 2 block-rows (llvm-mca 14 -mcpu=sapphirerapids, GCC 12's RW = 2 loop) 62.2 -> 56.1 cycles (p5 62.0 -> 56.0 uops,
 * 129 -> 128 instructions), the same bits (the same products of the same floats). On the H200's host (2026-12-04,
 * 16 threads, bench/pool_bench.py --ab against the kernel before) a tie at one token row (Q2_K + Q4_0 down 46.9
 * against 47.3 GB/s) and +6 % at four (19.6 against 18.5): the only kernel since. */
/* One token row against RW (1, 2) Q2_K weight rows in lane order (pass_q2_kx's layout, scales and min term at
 * M = 1): each x load serves the RW rows and the rows' chains are independent.
 *   row w: rows + w * stride, n weights (n % 256 == 0);  x: n floats in Q2_K's lane order;  xsum: the natural
 *   order's 16-element group sums of x;  out[w * MAX_M] += dot
 *   dd[2 w], dd[2 w + 1]: row w's d, dmin of block b (converted in block b - 1) */
AI void pass_q2_k_rows(const uint8_t *rows, int64_t stride, int n, const float *x, const float *xsum, float *out,
                       const int RW) {
    const int nb = n / 256;
    const v16 table = v16_cyc4(0), rep4 = v16_rep4();
    v16 acc[2][2];
    float dd[4];
    for (int w = 0; w < RW; w++) acc[w][0] = acc[w][1] = v16_zero();
    /* the f16 pairs (d, dmin) of block b of the RW rows in one xmm's dwords 0, RW - 1 */
#define Q2K_DD_HALVES(b)                                                                                           \
    (RW == 2 ? _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)rd32(rows + 84 * (int64_t)(b) + 80)),                    \
                                  _mm_cvtsi32_si128((int)rd32(rows + stride + 84 * (int64_t)(b) + 80)))            \
             : _mm_cvtsi32_si128((int)rd32(rows + 84 * (int64_t)(b) + 80)))
    __m128 ddn = _mm_cvtph_ps(Q2K_DD_HALVES(0));
    for (int b = 0; b < nb; b++) {
        v16 sc[2];
        __m512i qk[2][4], qh[2][4];
        _mm_storeu_ps(dd, ddn);
        /* dd as memory from here: the broadcasts below load it ({1to16}), not shuffle it out of ddn */
        __asm__("" : "+m"(dd));
        ddn = _mm_cvtph_ps(Q2K_DD_HALVES(b + 1 < nb ? b + 1 : b)); /* the last block reconverts itself: no read past the row */
        const v16 xs16 = v16_ld(xsum + 16 * b);
        for (int w = 0; w < RW; w++) {
            const uint8_t *blk = rows + w * stride + 84 * (int64_t)b;
            PF_BLOCK(blk, 84);
            const __m512i e = _mm512_cvtepu8_epi32(ld16b(blk));
            sc[w] = v16_mul(_mm512_permutexvar_ps(e, v16_iota(0)), v16_set1(dd[2 * w]));
            /* the mins' nibbles (0..15, e's bytes zero-extended) converted, not permuted out of iota: the same
             * floats off the shuffle port, which the 20 permutes a block-row fill (p0 takes the convert) */
            const v16 mn = v16_mul(_mm512_cvtepi32_ps(_mm512_srli_epi32(e, 4)), v16_set1(dd[2 * w + 1]));
            acc[w][0] = _mm512_fnmadd_ps(mn, xs16, acc[w][0]);
            __m512i q = _mm512_loadu_si512(blk + 16);
            __asm__("" : "+v"(q)); /* in a register, not re-read by each shift (pass_q2_kx) */
            for (int k = 0; k < 4; k++) {
                qk[w][k] = k ? _mm512_srli_epi32(q, 8 * k) : q;
                qh[w][k] = _mm512_srli_epi32(qk[w][k], 4);
            }
        }
        _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++) {
            const __m512i sidx = _mm512_setr_epi32(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 1, 2 * s + 1, 2 * s + 1,
                                                   2 * s + 1, 8 + 2 * s, 8 + 2 * s, 8 + 2 * s, 8 + 2 * s, 9 + 2 * s,
                                                   9 + 2 * s, 9 + 2 * s, 9 + 2 * s);
            v16 a[2];
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const v16 xv = v16_ld(x + 256 * (int64_t)b + 16 * (4 * s + k));
                for (int w = 0; w < RW; w++) {
                    const v16 wv = _mm512_permutexvar_ps(s < 2 ? qk[w][k] : qh[w][k], s % 2 ? rep4 : table);
                    a[w] = k ? v16_fma(wv, xv, a[w]) : v16_mul(wv, xv);
                }
            }
            for (int w = 0; w < RW; w++)
                acc[w][(s + 1) % 2] = v16_fma(_mm512_permutexvar_ps(sidx, sc[w]), a[w], acc[w][(s + 1) % 2]);
        }
    }
    for (int w = 0; w < RW; w++) out[w * MAX_M] += v16_hsum(v16_add(acc[w][0], acc[w][1]));
#undef Q2K_DD_HALVES
}
static void rows1_q2_kx(const uint8_t *rows0, int64_t stride, int nrows, int n, const float *x, const float *xsum,
                        float *out, const uint8_t *pf_end) {
    (void)pf_end;
    int i = 0;
    for (; i + 2 <= nrows; i += 2) pass_q2_k_rows(rows0 + i * stride, stride, n, x, xsum, out + i * MAX_M, 2);
    if (i < nrows) pass_q2_k_rows(rows0 + i * stride, stride, n, x, xsum, out + i * MAX_M, 1);
}
#endif

#ifdef STRATA_PERM
/* The 32-weight 4-bit types (Q4_0, Q4_1, IQ4_NL, MXFP4; Q5_0, Q5_1 with their fifth bit) in lane order: 4 blocks' 16 code bytes
 * in one zmm (lane i: dword i % 4 of block i / 4), group g (0..7) = the nibble at bit 4 g of each dword, one shift
 * and one permute of the type's 16 values (k - 8, kvalues_iq4nl, kvalues_fp4, k - 16) per 16 weights (Q5_0: one
 * more test and masked permute for the codes 16..31); a = sum_g value * xp, then acc += D * a with
 * D the lanes' block scales (one multiply per 128 weights and row instead of a scale x table multiply per block);
 * Q4_1 / Q5_1's + m: per 4 blocks and row one FMA of their 4 m with their x sums (pairs of the 16-group sums).
 * Element of the 128 (4 blocks) that lane i of group g holds: 32 (i / 4) + 16 (g % 2) + 4 (i % 4) + g / 2. */
AI int q4x_src(int g, int i) { return 32 * (i / 4) + 16 * (g % 2) + 4 * (i % 4) + g / 2; }
AI int q4x_pos(int e) { /* the inverse: where element e of 128 sits in lane order */
    const int q = e % 16;
    return 16 * (2 * (q % 4) + (e % 32) / 16) + 4 * (e / 32) + q / 4;
}
static void xperm_q4x(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 128; b++)
        for (int e = 0; e < 128; e++) xp[128 * b + q4x_pos(e)] = x[128 * b + e];
}
AI float q4x_scale(int type, const uint8_t *b) { return type == T_MXFP4 ? e8m0_half(b[0]) : rdh(b); }
AI void pass_q4x(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                 float *out, const int M, const uint8_t *pf_end) {
    const int nsb = n / 128;
    /* Q4_1, Q5_1: d * code + m; the codes' sum as the others', the m term from the x group sums (MN) */
    const int MN = type == T_Q4_1 || type == T_Q5_1, Q5 = type == T_Q5_0 || type == T_Q5_1;
    const int BPB = type == T_MXFP4 ? 17 : type == T_Q5_0 ? 22 : type == T_Q4_1 ? 20 : type == T_Q5_1 ? 24 : 18;
    const int QS = type == T_MXFP4 ? 1 : type == T_Q5_0 ? 6 : type == T_Q4_1 ? 4 : type == T_Q5_1 ? 8 : 2;
    const int QH = type == T_Q5_1 ? 4 : 2; /* Q5_0, Q5_1: the qh word */
    v16 acc[PASS_M][2];
    __m128 macc[PASS_M];
    /* Q5_0: codes 0..15 -> k - 16 (table), 16..31 -> k - 16 (hi) where the lane's qh bit is set; Q5_1: k, 16 + k */
    const v16 table = type == T_Q4_0 ? v16_iota(-8) : type == T_Q5_0 ? v16_iota(-16) : MN ? v16_iota(0)
                    : v16_i8(ld16b((const uint8_t *)(type == T_IQ4_NL ? kvalues_iq4nl : kvalues_fp4)));
    const v16 hi = v16_iota(type == T_Q5_1 ? 16 : 0);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int NA = M <= 2 ? 2 : 1;
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = v16_zero(), macc[r] = _mm_setzero_ps();
    if (type == T_Q4_0) PF_LINES(row, 4 * BPB * (int64_t)nsb, pf_end); /* pf_lines_of */
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *b0 = row + 4 * BPB * (int64_t)sb;
        if (type != T_Q4_0) PF_BLOCK(b0, 4 * BPB);
        __m512i q = _mm512_castsi128_si512(ld16b(b0 + QS));
        q = _mm512_inserti32x4(q, ld16b(b0 + BPB + QS), 1);
        q = _mm512_inserti32x4(q, ld16b(b0 + 2 * BPB + QS), 2);
        q = _mm512_inserti32x4(q, ld16b(b0 + 3 * BPB + QS), 3);
        /* D, the lanes' block scales. Where the 4 blocks' scales lie in their first 64 bytes (Q4_0, IQ4_NL, Q4_1:
         * 3 BPB + 4 <= 64) one load holds them and, at even offsets, one word permute puts d of block i / 4 in
         * half i, converted at once (was 4 scalar loads, 3 inserts, a convert and a float permute); MXFP4: the
         * e8m0 bytes (at 17 t: byte t of 128-bit lane t) by one in-lane byte shuffle into the dwords, then
         * e8m0_half's integer formula in vector ops (was 4 times scalar); the same values, so the same bits.
         * The word permute only at M <= 2: at 4 rows it measured slower on the dev box (Q4_0 down, T = 4:
         * -15 % in pool_bench, the loop 8 instructions shorter) */
        const int W16 = 3 * BPB + 4 <= 64 && type != T_MXFP4 && M <= 2;
        v16 D;
        __m512i head = _mm512_setzero_si512();
        if (W16 || type == T_MXFP4) head = _mm512_loadu_si512(b0);
        if (type == T_MXFP4) {
            const __m512i e = _mm512_shuffle_epi8(head, _mm512_setr_epi32(
                0xFFFFFF00, 0xFFFFFF00, 0xFFFFFF00, 0xFFFFFF00, 0xFFFFFF01, 0xFFFFFF01, 0xFFFFFF01, 0xFFFFFF01,
                0xFFFFFF02, 0xFFFFFF02, 0xFFFFFF02, 0xFFFFFF02, 0xFFFFFF03, 0xFFFFFF03, 0xFFFFFF03, 0xFFFFFF03));
            const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e); /* e < 2 */
            D = _mm512_castsi512_ps(_mm512_mask_mov_epi32(big, _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), tiny));
        } else if (W16) {
            const int w = BPB / 2;
            D = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_setr_epi32(
                0, 0, w * 0x10001, w * 0x10001, 2 * w * 0x10001, 2 * w * 0x10001, 3 * w * 0x10001, 3 * w * 0x10001,
                0, 0, 0, 0, 0, 0, 0, 0), head)));
        } else {
            const __m128 d4 = _mm_cvtph_ps(_mm_setr_epi16((short)rd16(b0), (short)rd16(b0 + BPB), (short)rd16(b0 + 2 * BPB),
                                                          (short)rd16(b0 + 3 * BPB), 0, 0, 0, 0));
            D = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
        }
        if (MN) { /* the 4 blocks' m times their x sums (pairs of the 8 natural 16-group sums of this 128) */
            const int w = BPB / 2;
            const __m128 m4 = W16 ? _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(
                                        _mm512_setr_epi32(1 + (1 + w) * 0x10000, 1 + 2 * w + (1 + 3 * w) * 0x10000, 0, 0, 0, 0, 0, 0,
                                                          0, 0, 0, 0, 0, 0, 0, 0), head)))
                                  : _mm_cvtph_ps(_mm_setr_epi16((short)rd16(b0 + 2), (short)rd16(b0 + BPB + 2),
                                                                (short)rd16(b0 + 2 * BPB + 2),
                                                                (short)rd16(b0 + 3 * BPB + 2), 0, 0, 0, 0));
            for (int r = 0; r < M; r++) {
                const __m256 s8 = _mm256_loadu_ps(xsum[r] + 8 * (int64_t)sb);
                macc[r] = _mm_fmadd_ps(m4, _mm_hadd_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)),
                                       macc[r]);
            }
        }
        /* Q5_0: lanes 4 t .. 4 t + 3 hold block t's qh; lane i of group g needs its bit 16 (g % 2) + 4 (i % 4) + g / 2
         * (the element that lane holds), tested into a mask that picks the high table */
        const __m512i qh = Q5 ? _mm512_permutexvar_epi32(spread, _mm512_castsi128_si512(_mm_setr_epi32(
                               (int)rd32(b0 + QH), (int)rd32(b0 + BPB + QH), (int)rd32(b0 + 2 * BPB + QH),
                               (int)rd32(b0 + 3 * BPB + QH)))) : _mm512_setzero_si512();
        v16 a[PASS_M][2]; /* at few rows two chains of 4 FMAs, not one of 8 (short down rows: 5 of these per row) */
        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
            const __m512i idx = g ? _mm512_srli_epi32(q, 4 * g) : q;
            v16 w = _mm512_permutexvar_ps(idx, table);
            if (Q5) {
                const int e0 = 16 * (g % 2) + g / 2;
                const __m512i at = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
                const __mmask16 h = _mm512_test_epi32_mask(qh, _mm512_sllv_epi32(_mm512_set1_epi32(1 << e0), at));
                w = _mm512_mask_permutexvar_ps(w, h, idx, hi);
            }
            const int64_t off = 128 * (int64_t)sb + 16 * g, c = g % NA;
            for (int r = 0; r < M; r++)
                a[r][c] = g >= NA ? v16_fma(w, v16_ld(xs[r] + off), a[r][c]) : v16_mul(w, v16_ld(xs[r] + off));
        }
        for (int r = 0; r < M; r++) acc[r][0] = v16_fma(D, NA == 2 ? v16_add(a[r][0], a[r][1]) : a[r][0], acc[r][0]);
    }
    for (int r = 0; r < M; r++) {
        __m128 m = _mm_add_ps(macc[r], _mm_movehl_ps(macc[r], macc[r]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[r] = v16_hsum(v16_add(acc[r][0], acc[r][1])) + (MN ? _mm_cvtss_f32(m) : 0.0f);
    }
}
LANE_DOTS(q4_0x, pass_q4x, T_Q4_0)
LANE_DOTS(q4_1x, pass_q4x, T_Q4_1)
LANE_DOTS(q5_1x, pass_q4x, T_Q5_1)
LANE_DOTS(iq4_nlx, pass_q4x, T_IQ4_NL)
LANE_DOTS(mxfp4x, pass_q4x, T_MXFP4)
LANE_DOTS(q5_0x, pass_q4x, T_Q5_0)
#endif

#ifdef STRATA_PERM
/* One token row against RW (1, 2, 4) Q4_0 weight rows in lane order (pass_q4x's layout and sums, M = 1): the x
 * load of each group serves the RW rows, the rows' chains are independent (one chain a row, where pass_q4x at M = 1
 * splits its row in two), and the RW sums are reduced together once (one transpose-add tree instead of RW
 * reductions). Why: at one token row per expert a row pass is short (down rows: 640 weights, 5 steps of 128) and
 * its fixed costs, the reduction, the call and the prefetch loop, are a fifth of it.
 *   row w: rows + w * stride, n weights (n % 128 == 0);  x: n floats in Q4_0's lane order;  out[w * MAX_M] += dot */
AI v16 q4x_d4(const uint8_t *b0) { /* the 4 blocks' d in lanes 4 t .. 4 t + 3 (pass_q4x's W16 word permute) */
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_setr_epi32(
        0, 0, 9 * 0x10001, 9 * 0x10001, 18 * 0x10001, 18 * 0x10001, 27 * 0x10001, 27 * 0x10001, 0, 0, 0, 0, 0, 0, 0,
        0), _mm512_loadu_si512(b0))));
}
AI __m512i q4x_codes(const uint8_t *b0) { /* the 4 blocks' 16 code bytes, block t in 128-bit lane t */
    __m512i q = _mm512_castsi128_si512(ld16b(b0 + 2));
    q = _mm512_inserti32x4(q, ld16b(b0 + 20), 1);
    q = _mm512_inserti32x4(q, ld16b(b0 + 38), 2);
    return _mm512_inserti32x4(q, ld16b(b0 + 56), 3);
}
/* the upper 8 lanes (AVX512F only: extractf32x8 is AVX512DQ) */
AI __m256 hi8(v16 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
/* the sums of 4 vectors as 4 floats (lane w: the sum of v[w]) */
AI __m128 hsum4(v16 v0, v16 v1, v16 v2, v16 v3) {
    const __m256 a0 = _mm256_add_ps(_mm512_castps512_ps256(v0), hi8(v0));
    const __m256 a1 = _mm256_add_ps(_mm512_castps512_ps256(v1), hi8(v1));
    const __m256 a2 = _mm256_add_ps(_mm512_castps512_ps256(v2), hi8(v2));
    const __m256 a3 = _mm256_add_ps(_mm512_castps512_ps256(v3), hi8(v3));
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
AI void pass_q4_0_rows(const uint8_t *rows, int64_t stride, int n, const float *x, float *out, const int RW,
                       const uint8_t *pf_end) {
    const int nsb = n / 128;
    const v16 table = v16_iota(-8);
    v16 acc[4];
    for (int w = 0; w < RW; w++) acc[w] = v16_zero();
    /* the RW rows' bytes PREFETCH_AHEAD past the last row's start: consecutive passes prefetch consecutive spans,
     * and at RW = 1 this is pass_q4x's (prefetching each row's own span would fall mostly on this pass's rows) */
    PF_LINES(rows + (RW - 1) * stride, 72 * (int64_t)nsb * RW, pf_end);
    for (int sb = 0; sb < nsb; sb++) {
        __m512i q[4];
        v16 a[4];
        for (int w = 0; w < RW; w++) q[w] = q4x_codes(rows + w * stride + 72 * (int64_t)sb);
        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
            const v16 xv = v16_ld(x + 128 * (int64_t)sb + 16 * g);
            for (int w = 0; w < RW; w++) {
                const v16 wv = _mm512_permutexvar_ps(g ? _mm512_srli_epi32(q[w], 4 * g) : q[w], table);
                a[w] = g ? v16_fma(wv, xv, a[w]) : v16_mul(wv, xv);
            }
        }
        for (int w = 0; w < RW; w++) acc[w] = v16_fma(q4x_d4(rows + w * stride + 72 * (int64_t)sb), a[w], acc[w]);
    }
    if (RW == 4) {
        float s[4];
        _mm_storeu_ps(s, hsum4(acc[0], acc[1], acc[2], acc[3]));
        for (int w = 0; w < 4; w++) out[w * MAX_M] += s[w];
    } else {
        for (int w = 0; w < RW; w++) out[w * MAX_M] += v16_hsum(acc[w]);
    }
}
/* nrows Q4_0 rows (rows0 + i * stride) of n against one token row x (lane order): 4 at a time, then 2, 1 */
static void rows1_q4_0x(const uint8_t *rows0, int64_t stride, int nrows, int n, const float *x, const float *xsum,
                        float *out, const uint8_t *pf_end) {
    (void)xsum;
    int i = 0;
    for (; i + 4 <= nrows; i += 4) pass_q4_0_rows(rows0 + i * stride, stride, n, x, out + i * MAX_M, 4, pf_end);
    if (i + 2 <= nrows) pass_q4_0_rows(rows0 + i * stride, stride, n, x, out + i * MAX_M, 2, pf_end), i += 2;
    if (i < nrows) pass_q4_0_rows(rows0 + i * stride, stride, n, x, out + i * MAX_M, 1, pf_end);
}
#endif

#ifdef STRATA_PERM
/* Q4_K, Q5_K and IQ4_XS in lane order: the 128 code bytes as two zmm (z = 0, 1) of 16 dwords, group (z, n, k) the nibble
 * n of byte k of each dword (bit 4 (2 k + n)); one shift and one permute (of 0..15 / kvalues_iq4nl) per 16 weights,
 * the lanes' sub-block scales applied once per 4 (Q4_K) or 8 (IQ4_XS) groups, Q4_K's min term as FUSED_PASS's.
 * Q5_K: Q4_K's order and scales, its fifth bit merged into bit 4 of each code byte (one bit select per 4 groups),
 * the 32 values 0..31 permuted from two registers (vpermt2ps) instead of one.
 *   Q4_K (pairs of sub-blocks share 32 bytes): group 4 (2 z + n) + k, lane i: element
 *     32 (2 (2 z + i / 8) + n) + (4 i + k) % 32, 16-group 4 (2 z + i / 8) + 2 n + (i / 4) % 2
 *   IQ4_XS (16 bytes per sub-block): group 8 z + 2 k + n, lane i: element 128 z + q4x_src(2 k + n, i), sub-block
 *     4 z + i / 4: x in Q4_0's lane order */
AI int q4kx_src(int g, int i) {
    const int z = g / 8, n = (g / 4) % 2, k = g % 4;
    return 32 * (2 * (2 * z + i / 8) + n) + (4 * i + k) % 32;
}
static void xperm_q4kx(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++)
        for (int g = 0; g < 16; g++)
            for (int i = 0; i < 16; i++) xp[256 * b + 16 * g + i] = x[256 * b + q4kx_src(g, i)];
}
/* the block's scales in registers, vector ops only (a scalar prep stored and read back as a vector would stall on
 * store forwarding): Q4_K: sc[j16], mn[j16] = d * scale, dmin * min of the 32-weight sub-block j16 / 2 (gguf's
 * get_scale_min_k4 in byte shuffles); IQ4_XS: sc[s] = d * (6-bit scale s - 32), s < 8 */
AI void q4k_scales(const uint8_t *b, v16 *sc, v16 *mn) {
    const __m128i s = ld16b(b + 4);
#define Z_ -128 /* a pshufb index that writes 0 */
    const __m128i top = _mm_set1_epi8((char)0xC0);
    /* sub-blocks j < 4: s[j] & 63, s[j + 4] & 63; j >= 4: (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,
     * (s[j + 4] >> 4) | (s[j] >> 6) << 4 */
    const __m128i P = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, Z_, Z_, Z_, Z_, Z_, Z_, Z_, Z_));
    const __m128i Q = _mm_shuffle_epi8(s, _mm_setr_epi8(Z_, Z_, Z_, Z_, 0, 1, 2, 3, Z_, Z_, Z_, Z_, Z_, Z_, Z_, Z_));
    const __m128i P2 = _mm_shuffle_epi8(s, _mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, Z_, Z_, Z_, Z_, Z_, Z_, Z_, Z_));
    const __m128i lo4 = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i hi6 = _mm_and_si128(_mm_srli_epi16(_mm_and_si128(Q, top), 2), _mm_set1_epi8(0x30));
    const __m128i Q2 = _mm_shuffle_epi8(s, _mm_setr_epi8(Z_, Z_, Z_, Z_, 4, 5, 6, 7, Z_, Z_, Z_, Z_, Z_, Z_, Z_, Z_));
#undef Z_
    const __m128i hi6m = _mm_and_si128(_mm_srli_epi16(_mm_and_si128(Q2, top), 2), _mm_set1_epi8(0x30));
    const __m128i sc8 = _mm_or_si128(_mm_and_si128(P, lo4), hi6);
    const __m128i mlo = _mm_and_si128(P2, _mm_setr_epi8(63, 63, 63, 63, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m128i mhi = _mm_and_si128(_mm_and_si128(_mm_srli_epi16(P2, 4), _mm_set1_epi8(15)),
                                      _mm_setr_epi8(0, 0, 0, 0, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m128i m8 = _mm_or_si128(_mm_or_si128(mlo, mhi), hi6m);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    *sc = v16_mul(v16_set1(rdh(b)), v16_i8(_mm_shuffle_epi8(sc8, dup)));
    *mn = v16_mul(v16_set1(rdh(b + 2)), v16_i8(_mm_shuffle_epi8(m8, dup)));
}
AI v16 iq4xs_scales(const uint8_t *b) {
    const __m128i x = _mm_cvtsi32_si128((int)rd32(b + 4));
    const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(x, _mm_set1_epi8(15)),
                                         _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(15)));
    const __m128i hi16 = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)rd16(b + 2)),
                                                      _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)), _mm_set1_epi16(3));
    const __m128i hi = _mm_packus_epi16(hi16, _mm_setzero_si128());
    const __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    return v16_mul(v16_set1(rdh(b)), v16_i8(q));
}
/* the K lane-order passes' steps: group t of a scale's 4 into the rows' sums a[r][c] (c = t % NA: the first NA
 * groups start the chains), then acc[r][into] += S * the chains' sum */
AI void lane_group(v16 a[][2], v16 w, const float *const *xs, int64_t off, const int M, int t, int c) {
    const int NA = M <= 2 ? 2 : 1;
    for (int r = 0; r < M; r++)
        a[r][c] = t >= NA ? v16_fma(w, v16_ld(xs[r] + off), a[r][c]) : v16_mul(w, v16_ld(xs[r] + off));
}
AI void lane_scale(v16 acc[][2], v16 S, v16 a[][2], const int M, const int NA, int into) {
    for (int r = 0; r < M; r++) acc[r][into] = v16_fma(S, NA == 2 ? v16_add(a[r][0], a[r][1]) : a[r][0], acc[r][into]);
}
AI void pass_k4x(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                 float *out, const int M, const uint8_t *pf_end) {
    const int nb = n / 256;
    (void)pf_end;
    const int KQ = type != T_IQ4_XS; /* Q4_K, Q5_K: the K-quant scales and mins */
    const int BPB = type == T_Q4_K ? 144 : type == T_Q5_K ? 176 : 136;
    const int QS = type == T_Q4_K ? 16 : type == T_Q5_K ? 48 : 8;
    v16 acc[PASS_M][2];
    const v16 table = KQ ? v16_iota(0) : v16_i8(ld16b((const uint8_t *)kvalues_iq4nl)), table_hi = v16_iota(16);
    const int NA = M <= 2 ? 2 : 1;
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = v16_zero();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + BPB * (int64_t)b;
        PF_BLOCK(blk, BPB);
        v16 sc, mn;
        if (KQ) q4k_scales(blk, &sc, &mn);
        else sc = mn = iq4xs_scales(blk);
        if (KQ) {
            for (int r = 0; r < M; r++) acc[r][0] = _mm512_fnmadd_ps(mn, v16_ld(xsum[r] + 16 * b), acc[r][0]);
        }
        /* Q5_K's fifth bits: qh[l] bit 2 P + n for the element of pair P = 2 z + i / 8, nibble n, byte l = 4 (i % 8)
         * + k: qh's 8 dwords in both halves, the upper lanes shifted by 2 (their P is odd): bit 4 z + n of byte k */
        const __m512i qh = type != T_Q5_K ? _mm512_setzero_si512()
            : _mm512_srlv_epi32(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16))),
                                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2));
        _Pragma("GCC unroll 2") for (int z = 0; z < 2; z++) {
            const __m512i q = _mm512_loadu_si512(blk + QS + 64 * z);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) { /* Q4_K: n = h; IQ4_XS: k in 2 h, 2 h + 1 */
                /* Q5_K: each byte's 5-bit index, nibble h in bits 0..3 and its fifth bit (4 z + h of qhv) in bit 4
                 * (one bit select; bits 5..7 are the next nibble's, which vpermt2ps ignores) */
                const int up = 4 - (4 * z + h);
                const __m512i hb = up > 0 ? _mm512_slli_epi32(qh, up) : up < 0 ? _mm512_srli_epi32(qh, -up) : qh;
                const __m512i q5 = type == T_Q5_K ? _mm512_ternarylogic_epi32(h ? _mm512_srli_epi32(q, 4) : q, hb,
                                                                             _mm512_set1_epi8(0x10), 0xD8) /* c ? b : a */
                                                  : q;
                const __m512i idx = KQ
                    ? _mm512_setr_epi32(8 * z + h * 2, 8 * z + h * 2, 8 * z + h * 2, 8 * z + h * 2, 8 * z + h * 2 + 1,
                                        8 * z + h * 2 + 1, 8 * z + h * 2 + 1, 8 * z + h * 2 + 1, 8 * z + 4 + h * 2,
                                        8 * z + 4 + h * 2, 8 * z + 4 + h * 2, 8 * z + 4 + h * 2, 8 * z + 5 + h * 2,
                                        8 * z + 5 + h * 2, 8 * z + 5 + h * 2, 8 * z + 5 + h * 2)
                    : _mm512_setr_epi32(4 * z, 4 * z, 4 * z, 4 * z, 4 * z + 1, 4 * z + 1, 4 * z + 1, 4 * z + 1,
                                        4 * z + 2, 4 * z + 2, 4 * z + 2, 4 * z + 2, 4 * z + 3, 4 * z + 3, 4 * z + 3,
                                        4 * z + 3);
                /* Q4_K's ps holds 16 entries (one per 16-group), IQ4_XS's the 8 sub-blocks' */
                const v16 S = _mm512_permutexvar_ps(idx, sc);
                v16 a[PASS_M][2];
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
                    /* Q4_K: group (z, n = h, k = t) at bit 8 t + 4 h; IQ4_XS: group 8 z + 4 h + t (k = 2 h + t / 2,
                     * n = t % 2) at bit 4 (4 h + t) */
                    const int bit = type == T_Q5_K ? 8 * t : type == T_Q4_K ? 8 * t + 4 * h : 4 * (4 * h + t);
                    const __m512i qq = type == T_Q5_K ? q5 : q;
                    const __m512i ix = bit ? _mm512_srli_epi32(qq, bit) : qq;
                    const v16 w = type == T_Q5_K ? _mm512_permutex2var_ps(table, ix, table_hi)
                                                 : _mm512_permutexvar_ps(ix, table);
                    const int64_t off = 256 * (int64_t)b + 16 * (8 * z + 4 * h + t);
                    const int c = t % NA;
                    lane_group(a, w, xs, off, M, t, c);
                }
                lane_scale(acc, S, a, M, NA, (2 * z + h + 1) % NA);
            }
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(v16_add(acc[r][0], acc[r][1]));
}
LANE_DOTS(q4_kx, pass_k4x, T_Q4_K)
LANE_DOTS(q5_kx, pass_k4x, T_Q5_K)
LANE_DOTS(iq4_xsx, pass_k4x, T_IQ4_XS)
#endif

#ifdef STRATA_PERM
/* Q6_K in lane order: ql (128 bytes) as two zmm (z = 0, 1) of 16 dwords, qh's 2-bit pairs moved beside them; group
 * (z, n, k) = 8 z + 4 n + k holds in lane i the weight of nibble n of ql byte 64 z + 4 i + k:
 *   element 128 z + 32 (i / 8 + 2 n) + 4 (i % 8) + k,  16-group 8 z + 2 (i / 8) + 4 n + (i % 8) / 4 (the same for all k)
 * Per (z, n) one bit select builds in each byte the 6-bit code in bits 2..7 (nibble in 2..5, qh's pair in 6..7, its
 * top bit flipped once per block: code ^ 32, so that an arithmetic shift yields code - 32); per group k one or two
 * shifts (byte k's field to the dword's top, then >> 26 signed: the exact int code - 32), a convert and the FMA;
 * the lanes' scales d * sc applied once per 4 groups. (A 64-entry table would take two vpermt2ps and a blend.) */
AI int q6kx_src(int g, int i) {
    const int z = g / 8, n = (g / 4) % 2, k = g % 4;
    return 128 * z + 32 * (i / 8 + 2 * n) + 4 * (i % 8) + k;
}
static void xperm_q6kx(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++)
        for (int g = 0; g < 16; g++)
            for (int i = 0; i < 16; i++) xp[256 * b + 16 * g + i] = x[256 * b + q6kx_src(g, i)];
}
AI void pass_q6kx(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                  float *out, const int M, const uint8_t *pf_end) {
    const int nb = n / 256;
    (void)type, (void)xsum, (void)pf_end;
    v16 acc[PASS_M][2];
    const int NA = M <= 2 ? 2 : 1;
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = v16_zero();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + 210 * (int64_t)b;
        PF_BLOCK(blk, 210);
        const v16 sc = v16_mul(v16_set1(rdh(blk + 208)), v16_i8(ld16b(blk + 192))); /* gguf's d * sc */
        /* qh: the top bit of each 2-bit pair flipped (code ^ 32) */
        const __m512i qh = _mm512_xor_si512(_mm512_loadu_si512(blk + 128), _mm512_set1_epi8((char)0xAA));
        _Pragma("GCC unroll 2") for (int z = 0; z < 2; z++) {
            const __m512i q = _mm512_loadu_si512(blk + 64 * z);
            /* lane i: qh dword 8 z + i % 8 (byte k = qh[32 z + 4 (i % 8) + k]), the upper lanes' pairs (i / 8 = 1:
             * bits 2 + 4 n) shifted down by 2: pair n at bits 4 n, 4 n + 1 of each byte */
            const __m512i hz = _mm512_srlv_epi32(
                _mm512_permutexvar_epi32(_mm512_setr_epi32(8 * z, 8 * z + 1, 8 * z + 2, 8 * z + 3, 8 * z + 4, 8 * z + 5,
                                                           8 * z + 6, 8 * z + 7, 8 * z, 8 * z + 1, 8 * z + 2, 8 * z + 3,
                                                           8 * z + 4, 8 * z + 5, 8 * z + 6, 8 * z + 7), qh),
                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2));
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) { /* h: the nibble n */
                /* bits 2..5 the nibble, 6..7 the pair (bits 0..1: neighbours' bits, below every field) */
                const __m512i c6 = _mm512_ternarylogic_epi32(_mm512_slli_epi32(hz, h ? 2 : 6),
                                                             h ? _mm512_srli_epi32(q, 2) : _mm512_slli_epi32(q, 2),
                                                             _mm512_set1_epi8(0x3C), 0xD8); /* c ? b : a */
                const int s0 = 8 * z + 4 * h;
                const v16 S = _mm512_permutexvar_ps(_mm512_setr_epi32(s0, s0, s0, s0, s0 + 1, s0 + 1, s0 + 1, s0 + 1,
                                                                      s0 + 2, s0 + 2, s0 + 2, s0 + 2, s0 + 3, s0 + 3,
                                                                      s0 + 3, s0 + 3), sc);
                v16 a[PASS_M][2];
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
                    const __m512i top = t == 3 ? c6 : _mm512_slli_epi32(c6, 24 - 8 * t);
                    const v16 w = _mm512_cvtepi32_ps(_mm512_srai_epi32(top, 26));
                    const int64_t off = 256 * (int64_t)b + 16 * (s0 + t);
                    const int c = t % NA;
                    lane_group(a, w, xs, off, M, t, c);
                }
                lane_scale(acc, S, a, M, NA, (2 * z + h + 1) % NA);
            }
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(v16_add(acc[r][0], acc[r][1]));
}
LANE_DOTS(q6_kx, pass_q6kx, T_Q6_K)
#endif

#endif /* STRATA_AVX2 */
#endif /* STRATA_EXPERT_POOL_GROUPS_H */
