/* expert_pool_few.h: the AVX-512 lane-order kernels of the types whose weights take few values, with one scale per
 * block or sub-block: TQ2_0, TQ1_0 (one d per 256), IQ1_S, IQ1_M (grid + delta, dl per 32 / 16), NVFP4 (e2m1 values,
 * an ue4m3 scale per 16); built on expert_pool_groups.h's lane-order kernels (STRATA_PERM) and named by
 * expert_pool_dispatch.h (fused_dots_xperm, fused_xperm, xperm_of, xperm_pos, fused_lane_rows).
 *
 * As there (pass_q2_kx, pass_q4x): x is permuted once per call into the order in which the codes decode, the codes
 * become the unscaled values (exact small floats) by one register permute per 16 weights, a = sum of value * x per
 * block or sub-block, and the scale is applied once to a (acc += S * a): float32 math on the exact codes and
 * scales, summed in another order than gguf's d * code per weight (tests/test_tiers_pool.py: with x one-hot each
 * dot is gguf's weight bit for bit, with random x within 1e-6 of float64; the row decoder, strata_dequant_row, keeps
 * the weight-table decoders, held to gguf bit for bit too).
 */
#ifndef STRATA_EXPERT_POOL_FEW_H
#define STRATA_EXPERT_POOL_FEW_H
#include "expert_pool_groups.h"

/* the chains of partial sums per token row: with few rows the FMAs of one row would wait on each other (4 cycles
 * each), so one row keeps 4 chains and two rows 2 */
#define FEW_NA(M) ((M) <= 2 ? 4 : 2)

/* TQ2_0 in Q2_K's lane order (xperm_q2_k, q2x_src): the 64 code bytes, one zmm of 16 dwords, hold the 2-bit
 * planes in the same layout as Q2_K's qs, so group (s, k) = 4 s + k holds in lane i the weight of byte 4 i + k,
 * plane s; one scale d per block: a = sum of (code - 1) * x over the block's 16 groups, acc += d * a. Per 16
 * weights one permute (of -1..2 by index bits 0, 1 or 2, 3), an FMA and under half a shift (7 a block), where the
 * weight-table decoder (g_tq2_0) paid a shift, a byte widen, a permute and a scale x table multiply. */
AI void pass_tq2x(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                  float *out, const int M, const uint8_t *pf_end) {
    (void)type, (void)xsum, (void)pf_end;
    const int nb = n / 256, NA = FEW_NA(M);
    const v16 lo = v16_cyc4(-1), hi = v16_sub(v16_rep4(), v16_set1(1.0f));
    v16 acc[PASS_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + 66 * (int64_t)b;
        PF_BLOCK(blk, 66);
        __m512i q = _mm512_loadu_si512(blk), qk[4], qh[4];
        __asm__("" : "+v"(q)); /* in a register, not re-read by each shift (pass_q2_kx) */
        for (int k = 0; k < 4; k++) {
            qk[k] = k ? _mm512_srli_epi32(q, 8 * k) : q;
            qh[k] = _mm512_srli_epi32(qk[k], 4);
        }
        v16 a[PASS_M][4];
        _Pragma("GCC unroll 16") for (int g = 0; g < 16; g++) {
            const int s = g / 4, k = g % 4, c = g % NA;
            const v16 w = _mm512_permutexvar_ps(s < 2 ? qk[k] : qh[k], s % 2 ? hi : lo);
            const int64_t off = 256 * (int64_t)b + 16 * g;
            for (int r = 0; r < M; r++)
                a[r][c] = g < NA ? v16_mul(w, v16_ld(xs[r] + off)) : v16_fma(w, v16_ld(xs[r] + off), a[r][c]);
        }
        const v16 d = v16_set1(rdh(blk + 64));
        for (int r = 0; r < M; r++) {
            v16 t = a[r][0];
            for (int c = 1; c < NA; c++) t = v16_add(t, a[r][c]);
            acc[r] = v16_fma(d, t, acc[r]);
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LANE_DOTS(tq2_0x, pass_tq2x, T_TQ2_0)

/* TQ1_0 in lane order: the 5 (qh: 4) base-3 digits of each code byte, digit k of byte v being
 * ((v * 3^k mod 256) * 3) >> 8, computed for 64 bytes at once in 16-bit lanes: a word times 3^k << 8 keeps
 * (v * 3^k mod 256) << 8 of its low byte (the high byte's product overflows out), and its high half times 3 is the
 * digit (vpmulhuw); the high bytes the same after a shift down by 8. Four such sources a block, each 64 (byte,
 * power) pairs in 128-bit lanes of one power (tq1x_src):
 *   Z0 = qs[0..31] x 3^0, 3^1;  Z1 = qs[0..31] x 3^2, 3^3;  Z2 = qs[0..31] x 3^4, qs[32..47] x 3^0, 3^1;
 *   Z3 = qs[32..47] x 3^2, 3^3, 3^4, qh[0..3] x 3^0 .. 3^3 (one power per dword)
 * and from each 4 groups: lane i holds the digit of byte 4 i (low word of the low bytes' digits), 4 i + 2 (their
 * high word, shifted down), 4 i + 1 and 4 i + 3 (the high bytes'), each digit an index into -1, 0, 1 (one permute).
 * One scale d per block, applied once to the block's sum. Per 16 weights a permute, an FMA and 1.75 integer ops
 * (a multiply, 3/4 shift), where the weight-table decoder (g_tq1_0) widened bytes to words and words to dwords
 * per 16 weights besides its two multiplies, the permute and the table multiply. */
AI int tq1x_src(int g, int i) { /* the in-block element that lane i of group g = 4 Z + t holds */
    static const int byte_of_t[4] = {0, 2, 1, 3};
    const int Z = g / 4, p = 4 * i + byte_of_t[g % 4], L = p / 16, q = p % 16;
    int src, pow;
    if (Z < 2) src = p % 32, pow = 2 * Z + L / 2;
    else if (Z == 2) src = L < 2 ? p : 32 + q, pow = L < 2 ? 4 : L - 2;
    else src = L < 3 ? 32 + q : 48 + q % 4, pow = L < 3 ? 2 + L : q / 4;
    return src < 32 ? 32 * pow + src : src < 48 ? 160 + 16 * pow + (src - 32) : 240 + 4 * pow + (src - 48);
}
static uint8_t tq1x_pos_of[256]; /* the inverse: where in-block element e sits in lane order (16 g + i) */
__attribute__((constructor)) static void fill_tq1x_pos_of(void) {
    for (int g = 0; g < 16; g++)
        for (int i = 0; i < 16; i++) tq1x_pos_of[tq1x_src(g, i)] = (uint8_t)(16 * g + i);
}
static void xperm_tq1x(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++)
        for (int g = 0; g < 16; g++)
            for (int i = 0; i < 16; i++) xp[256 * b + 16 * g + i] = x[256 * b + tq1x_src(g, i)];
}
/* 3^k << 8 per word of source Z (the powers of tq1x_src) */
AI __m512i tq1x_pow(int Z) {
#define P3(k) ((short)((k) << 8))
#define P8(k) P3(k), P3(k), P3(k), P3(k), P3(k), P3(k), P3(k), P3(k)
    switch (Z) {
    case 0: return _mm512_set_epi16(P8(3), P8(3), P8(1), P8(1));
    case 1: return _mm512_set_epi16(P8(27), P8(27), P8(9), P8(9));
    case 2: return _mm512_set_epi16(P8(3), P8(1), P8(81), P8(81));
    default: return _mm512_set_epi16(P3(27), P3(27), P3(9), P3(9), P3(3), P3(3), P3(1), P3(1), P8(81), P8(27), P8(9));
    }
#undef P8
#undef P3
}
AI void pass_tq1x(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                  float *out, const int M, const uint8_t *pf_end) {
    (void)type, (void)xsum, (void)pf_end;
    const int nb = n / 256, NA = FEW_NA(M);
    const v16 table = v16_iota(-1);
    const __m512i three = _mm512_set1_epi16(3);
    v16 acc[PASS_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + 54 * (int64_t)b;
        PF_BLOCK(blk, 54);
        const __m256i lo32 = _mm256_loadu_si256((const __m256i *)blk);
        const __m128i mid16 = ld16b(blk + 32);
        __m512i src[4];
        src[0] = src[1] = _mm512_broadcast_i64x4(lo32);
        src[2] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi256_si512(lo32), mid16, 2), mid16, 3);
        src[3] = _mm512_inserti32x4(_mm512_broadcast_i32x4(mid16), _mm_set1_epi32((int)rd32(blk + 48)), 3);
        v16 a[PASS_M][4];
        _Pragma("GCC unroll 4") for (int Z = 0; Z < 4; Z++) {
            const __m512i p = tq1x_pow(Z);
            const __m512i e = _mm512_mulhi_epu16(_mm512_mullo_epi16(src[Z], p), three);
            const __m512i o = _mm512_mulhi_epu16(_mm512_mullo_epi16(_mm512_srli_epi16(src[Z], 8), p), three);
            const __m512i idx[4] = {e, _mm512_srli_epi32(e, 16), o, _mm512_srli_epi32(o, 16)};
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
                const int g = 4 * Z + t, c = g % NA;
                const v16 w = _mm512_permutexvar_ps(idx[t], table);
                const int64_t off = 256 * (int64_t)b + 16 * g;
                for (int r = 0; r < M; r++)
                    a[r][c] = g < NA ? v16_mul(w, v16_ld(xs[r] + off)) : v16_fma(w, v16_ld(xs[r] + off), a[r][c]);
            }
        }
        const v16 d = v16_set1(rdh(blk + 52));
        for (int r = 0; r < M; r++) {
            v16 t = a[r][0];
            for (int c = 1; c < NA; c++) t = v16_add(t, a[r][c]);
            acc[r] = v16_fma(d, t, acc[r]);
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LANE_DOTS(tq1_0x, pass_tq1x, T_TQ1_0)

/* IQ1_S / IQ1_M in lane order: the 32 grid ids of a block gathered as two zmm of 16 dwords (vpgatherdd) from
 * iq1_grid4, the 2048 grid rows packed as 8 nibbles, one per weight: code 0 (grid value 0), 1 (1) or 3 (-1) in bits
 * 0, 1 and bit 2 set where the row's delta is negative (one masked OR per 16 rows), so that one permute of the 8
 * values grid + delta (exact: +-1/8 steps) by each lane's nibble is the weight over dl. Lane i of gather h holds
 * grid row 16 h + i (elements 8 i .. 8 i + 7 of that half block), group k its weight k:
 *   element 128 h + 8 i + k (xperm_iq1x), and each lane's dl (IQ1_S: per 32 weights = 4 rows, IQ1_M: per 16 = 2
 *   rows) applied once to its 8 products: acc += S * a.
 * Per 16 weights: a permute, an FMA and 7/8 shift, plus per 16 rows a gather and ~8 vector ops for the ids, signs
 * and scales, where the weight-table decoders (expert_pool_grids.h) read each row and offset with scalar loads,
 * merged two rows per xmm, widened to dwords and multiplied a table per 16 weights. */
static uint32_t iq1_grid4[2048];
static const float tab_iq1x[16] __attribute__((aligned(64))) = {0.125f, 1.125f, 0, -0.875f, -0.125f, 0.875f, 0,
                                                                 -1.125f, 0, 0, 0, 0, 0, 0, 0, 0};
__attribute__((constructor)) static void fill_iq1_grid4(void) {
    for (int id = 0; id < 2048; id++) {
        uint32_t w = 0;
        for (int k = 0; k < 8; k++) w |= (uint32_t)(grid_iq1s[id][k] & 3) << (4 * k); /* -1 & 3 = 3 */
        iq1_grid4[id] = w;
    }
}
/* iq1_grid4[id] of 16 ids: vpgatherdd into a register zeroed right before it. A gather merges into its destination,
 * so its result waits for whatever last wrote that register; with the all-ones mask GCC takes any register for the
 * intrinsic's (one a previous block's FMAs write: llvm-mca put the kernel at 58 % data-dependency stalls) */
AI __m512i iq1_gather(__m512i ids) {
    __m512i q;
    __mmask16 k = 0xFFFF;
    __asm__("vpxord %0, %0, %0\n\tvpgatherdd (%2, %3, 4), %0%{%1%}"
            : "=&v"(q), "+Yk"(k)
            : "r"(iq1_grid4), "v"(ids), "m"(*(const uint32_t(*)[2048])iq1_grid4));
    return q;
}
AI int iq1x_src(int g, int i) { return 128 * (g / 8) + 8 * i + g % 8; } /* g = 8 h + k */
static void xperm_iq1x(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 128; b++)
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 16; i++) xp[128 * b + 16 * g + i] = x[128 * b + 8 * i + g];
}
/* a block's 32 grid rows, 16 a half (q[h] lane i: row 16 h + i's 8 nibbles gathered by its id, the 3 high bits
 * merged; bit 2 set where its delta is negative), and each row's dl (S[h] lane i: row 16 h + i's sub-block) */
AI void iq1_rows(const int IQ1M, const uint8_t *blk, __m512i q[2], v16 S[2]) {
    __m512i ids[2];
    __mmask16 neg[2];
    if (IQ1M) { /* qs[32], qh[16] (per id: 3 high bits, delta sign; id 2 j + 1 in the high nibble), scales[8] */
        const __m512i hd = _mm512_slli_epi32(_mm512_cvtepu8_epi32(ld16b(blk + 32)), 8);
        const uint16_t s0 = rd16(blk + 48), s1 = rd16(blk + 50), s2 = rd16(blk + 52), s3 = rd16(blk + 54);
        const float d = f16_to_f32((uint16_t)(((s0 & 0xF000) >> 12) | ((s1 & 0xF000) >> 8) |
                                              ((s2 & 0xF000) >> 4) | (s3 & 0xF000)));
        /* the 16 scales of 16 weights: 3 bits of u16 word j / 4 at 3 (j % 4) */
        const __m512i sw = _mm512_cvtepu16_epi32(
            _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                     _mm256_castsi128_si256(ld8(blk + 48))));
        const __m512i sc = _mm512_and_si512(
            _mm512_srlv_epi32(sw, _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
            _mm512_set1_epi32(7));
        const v16 dl = v16_mul(v16_set1(d), _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(sc, sc),
                                                                                _mm512_set1_epi32(1))));
        for (int h = 0; h < 2; h++) {
            const __m512i pair = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            const __m512i at = _mm512_add_epi32(pair, _mm512_set1_epi32(8 * h));
            /* bits 8..10 the id's high bits, bit 11 its delta sign */
            const __m512i hq = _mm512_srlv_epi32(_mm512_permutexvar_epi32(at, hd),
                                                 _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
            neg[h] = _mm512_test_epi32_mask(hq, _mm512_set1_epi32(0x800));
            ids[h] = _mm512_ternarylogic_epi32(hq, _mm512_set1_epi32(0x700),
                                               _mm512_cvtepu8_epi32(ld16b(blk + 16 * h)), 0xEA); /* a & b | c */
            S[h] = _mm512_permutexvar_ps(at, dl);
        }
    } else { /* d, qs[32], qh u16[8] (per 32 weights: 3 high bits x 4 ids, 3-bit scale, delta sign) */
        const __m512i hw = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(ld16b(blk + 34))); /* lanes 0..7 */
        const __m512i h8 = _mm512_slli_epi32(hw, 8);
        /* dl of the 8 sub-blocks: d * (2 s + 1), s = bits 12..14 */
        const __m512i odd = _mm512_ternarylogic_epi32(_mm512_srli_epi32(hw, 11), _mm512_set1_epi32(14),
                                                      _mm512_set1_epi32(1), 0xEA);
        const v16 dl = v16_mul(v16_set1(rdh(blk)), _mm512_cvtepi32_ps(odd));
        for (int h = 0; h < 2; h++) {
            const __m512i at = _mm512_setr_epi32(4 * h, 4 * h, 4 * h, 4 * h, 4 * h + 1, 4 * h + 1, 4 * h + 1,
                                                 4 * h + 1, 4 * h + 2, 4 * h + 2, 4 * h + 2, 4 * h + 2, 4 * h + 3,
                                                 4 * h + 3, 4 * h + 3, 4 * h + 3);
            /* row l = i % 4 of its sub-block: high bits at 3 l (moved to 8..10); the delta sign bit 15 (23) */
            const __m512i hq = _mm512_permutexvar_epi32(at, h8);
            neg[h] = _mm512_test_epi32_mask(hq, _mm512_set1_epi32(1 << 23));
            ids[h] = _mm512_ternarylogic_epi32(
                _mm512_srlv_epi32(hq, _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
                _mm512_set1_epi32(0x700), _mm512_cvtepu8_epi32(ld16b(blk + 2 + 16 * h)), 0xEA); /* a & b | c */
            S[h] = _mm512_permutexvar_ps(at, dl);
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m512i g = iq1_gather(ids[h]);
        q[h] = _mm512_mask_or_epi32(g, neg[h], g, _mm512_set1_epi32(0x44444444));
    }
}
AI void pass_iq1x(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                  float *out, const int M, const uint8_t *pf_end) {
    (void)xsum, (void)pf_end;
    const int nb = n / 256, NA = FEW_NA(M), IQ1M = type == T_IQ1_M, BPB = IQ1M ? 56 : 50;
    const v16 table = v16_ld(tab_iq1x);
    v16 acc[PASS_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + BPB * (int64_t)b;
        PF_BLOCK(blk, BPB);
        __m512i qs[2];
        v16 S[2];
        iq1_rows(IQ1M, blk, qs, S);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const __m512i q = qs[h];
            v16 a[PASS_M][4];
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                const int c = k % NA;
                const v16 w = _mm512_permutexvar_ps(k ? _mm512_srli_epi32(q, 4 * k) : q, table);
                const int64_t off = 256 * (int64_t)b + 128 * h + 16 * k;
                for (int r = 0; r < M; r++)
                    a[r][c] = k < NA ? v16_mul(w, v16_ld(xs[r] + off)) : v16_fma(w, v16_ld(xs[r] + off), a[r][c]);
            }
            for (int r = 0; r < M; r++) {
                v16 t = a[r][0];
                for (int c = 1; c < NA; c++) t = v16_add(t, a[r][c]);
                acc[r] = v16_fma(S[h], t, acc[r]);
            }
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LANE_DOTS(iq1_sx, pass_iq1x, T_IQ1_S)
LANE_DOTS(iq1_mx, pass_iq1x, T_IQ1_M)

/* NVFP4 in lane order: 2 blocks (128 weights) a step, their 64 code bytes one zmm of 16 dwords (block i / 8, bytes
 * 4 (i % 8) .. + 3 of its qs in lane i), group g = 2 t + n the nibble n of byte t of each dword (one shift and one
 * permute of the doubled e2m1 values per 16 weights), and each lane's sub-block scale (sub-block (i % 8) / 2 of
 * block i / 8) applied once to its 8 products. Element of the step that lane i of group g holds (nvfp4x_src):
 *   64 (i / 8) + 16 ((i % 8) / 2) + 8 (g % 2) + 4 (i % 2) + g / 2
 * The scales in vector ops: an ue4m3 byte's low 7 bits shifted into an f16's exponent and mantissa fields (exponent
 * bias 15 for 7, the subnormals included) convert exactly with vcvtph2ps, times 2^7 is ue4m3_half; 0x7F is 0
 * (ue4m3_half_of holds the same values: the row decoder's and the tests'). */
AI int nvfp4x_src(int g, int i) { return 64 * (i / 8) + 16 * ((i % 8) / 2) + 8 * (g % 2) + 4 * (i % 2) + g / 2; }
static void xperm_nvfp4x(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 128; b++)
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 16; i++) xp[128 * b + 16 * g + i] = x[128 * b + nvfp4x_src(g, i)];
}
AI void pass_nvfp4x(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                    float *out, const int M, const uint8_t *pf_end) {
    (void)type, (void)xsum, (void)pf_end;
    const int ns = n / 128, NA = FEW_NA(M) > 2 ? 2 : FEW_NA(M);
    const v16 table = v16_i8(ld16b((const uint8_t *)kvalues_fp4));
    v16 acc[PASS_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    for (int sb = 0; sb < ns; sb++) {
        const uint8_t *b0 = row + 72 * (int64_t)sb;
        PF_BLOCK(b0, 72);
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 4))),
                                             _mm256_loadu_si256((const __m256i *)(b0 + 40)), 1);
        /* the 8 scale bytes, each twice, as 16 words; f16 bits (x & 0x7F) << 7 */
        const __m128i sc = _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)rd32(b0)), _mm_cvtsi32_si128((int)rd32(b0 + 36)));
        const __m256i w = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc, sc));
        const __mmask16 nan = _mm256_cmpeq_epi16_mask(w, _mm256_set1_epi16(0x7F));
        const v16 S = _mm512_maskz_mul_ps((__mmask16)~nan, _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(w, 7),
                                                                                           _mm256_set1_epi16(0x3F80))),
                                          v16_set1(128.0f));
        v16 a[PASS_M][2];
        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
            const int c = g % NA;
            const v16 wv = _mm512_permutexvar_ps(g ? _mm512_srli_epi32(q, 4 * g) : q, table);
            const int64_t off = 128 * (int64_t)sb + 16 * g;
            for (int r = 0; r < M; r++)
                a[r][c] = g < NA ? v16_mul(wv, v16_ld(xs[r] + off)) : v16_fma(wv, v16_ld(xs[r] + off), a[r][c]);
        }
        for (int r = 0; r < M; r++) acc[r] = v16_fma(S, NA == 2 ? v16_add(a[r][0], a[r][1]) : a[r][0], acc[r]);
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LANE_DOTS(nvfp4x, pass_nvfp4x, T_NVFP4)

#endif /* STRATA_EXPERT_POOL_FEW_H */
