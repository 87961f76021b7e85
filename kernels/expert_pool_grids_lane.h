/* expert_pool_grids_lane.h: the grid i-quants' gate/up kernels at few token rows (fused_dots_xperm) in the
 * avx512spr build (STRATA_VBMI: AVX-512 with VBMI, BITALG and BF16, Sapphire Rapids and Zen 4): IQ2_XXS, IQ3_XXS,
 * IQ3_S decoded from register tables, the dot products in bf16 pairs. Built on expert_pool_groups.h's lane-order
 * kernels and picked by expert_pool_dispatch.h. The weight-table decoders of expert_pool_grids.h stay the row
 * decoder (strata_dequant_row, the bit-for-bit tests), the kernel at more token rows, the down rows' kernel and the
 * plain avx512 build's.
 *
 * Why: those decoders build each 16 weights from 2 or 4 grid row loads and inserts, a sign mask, a widen and a
 * scale x table multiply, ~20 instructions beside the FMA: on the device the i-quants ran at 1.6-2.1 GB/s a thread
 * at one token row (Q4_0 5.0). Here, per block (IQ3) or pair of blocks (IQ2): the ids of 64 grid rows in one zmm
 * are looked up in the grid packed as 4-bit codes (vpermi2b, 128 entries a lookup), the signs go into the codes
 * (vpshufbitqmb picks each lane's sign bits, one masked byte add per nibble), and per 32 weights one word shift, one
 * vpermw of the bf16 values and two vdpbf16ps do the rest.
 *
 * Arithmetic: x = hi + lo in bf16 (round to nearest twice: x - hi - lo within 2^-17 |x|), split once per call
 * (xsplit); the grid values are small integers, exact in bf16, their products with hi and lo exact in float32,
 * summed in float32 (vdpbf16ps), per 16-group sums times the group's scale (gguf's float operations, so its scale
 * bits) once per block. Not the weight-table kernels' bits: within the tests' 1e-4 of float64 (dev box: max |err| /
 * max |ref| 1.5-3e-6 against float32's 2e-7 on a 2560-row, sum |w x| ratio 1.7e-7).
 *
 * x layouts (xsplit: each group of W words of hi followed by W words of lo; a dword of the kernel's pairs two words,
 * so lane j of a dot sums two elements, both of one 16-group):
 *   IQ3 per block: combo C = 4 A + q (A: values 2 A, 2 A + 1 of a row; q: the nibble of a word), W = 32, word 2 j + t
 *     = element 16 j + 4 (q / 2) + 2 A + q % 2 + 8 t (iq3_elem; lane j = 16-group j)
 *   IQ2 per pair of blocks: combo C = 4 A + q, W = 32, word 2 j + t = element of block j / 8 (iq2_elem; lane j =
 *     16-group 2 (j % 8) + q / 2 of that block); a last single block W = 16 (j < 8)
 */
#ifndef STRATA_EXPERT_POOL_GRIDS_LANE_H
#define STRATA_EXPERT_POOL_GRIDS_LANE_H
#include "expert_pool_groups.h"

AI __m512i ld64(const void *p) { return _mm512_load_si512(p); }
static uint16_t bf16_rne(float f) { /* the tables' values (vcvtneps2bf16's rounding, for finite f) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
/* x split into bf16 hi + lo in a kernel's layout: vector i (16 elements at x + src[16 i ..]) to words
 * 2 W g + 16 k (hi) and 2 W g + W + 16 k (lo), g = i / (W / 16), k = i % (W / 16) */
static void xsplit(const float *x, const int32_t *src, int nvec, int W, uint16_t *o) {
    for (int i = 0; i < nvec; i++) {
        const __m512 v = _mm512_i32gather_ps(_mm512_loadu_si512(src + 16 * i), x, 4);
        const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
        const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)));
        uint16_t *at = o + 2 * W * (i / (W / 16)) + 16 * (i % (W / 16));
        _mm256_storeu_si256((__m256i *)at, hi);
        _mm256_storeu_si256((__m256i *)(at + W), (__m256i)_mm512_cvtneps_pbh(rest));
    }
}
/* 16-bit table of vpermw by the low 5 bits of each word (a nibble code and an ignored bit): t[c & 15] */
static void fill_words(uint16_t *w, const float *t) {
    for (int i = 0; i < 32; i++) w[i] = bf16_rne(t[i & 15]);
}

/* ---- IQ3_XXS, IQ3_S per block. iq3*_pk[A][id]: values 2 A, 2 A + 1 of grid row id as 3-bit codes in the low and
 * high nibble (IQ3_XXS: 4, 12, .., 52, 62 -> v >> 3; IQ3_S: 1, 3, .., 15 -> v >> 1); byte r of P_A = row r of the
 * block, its nibbles' bit 3 the sign; word w of P_A = rows 2 w, 2 w + 1, nibble q = row 2 w + q / 2, value
 * 2 A + q % 2 */
static uint8_t iq3xxs_pk[2][256] __attribute__((aligned(64)));
static uint8_t iq3s_pk[2][512] __attribute__((aligned(64)));
static uint16_t tab3w[2][32] __attribute__((aligned(64))); /* IQ3_XXS, IQ3_S: + values 0..7, - values 8..15 */
static int32_t iq3_src[256];
AI int iq3_elem(int C, int w) {
    const int A = C / 4, q = C % 4, j = w / 2, t = w % 2;
    return 16 * j + 4 * (q / 2) + 2 * A + q % 2 + 8 * t;
}
__attribute__((constructor)) static void fill_iq3(void) {
    static const float xxs[16] = {4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62};
    static const float s[16] = {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15};
    for (int A = 0; A < 2; A++) {
        for (int i = 0; i < 256; i++)
            iq3xxs_pk[A][i] = (uint8_t)((grid_iq3xxs[i][2 * A] >> 3) | (grid_iq3xxs[i][2 * A + 1] >> 3) << 4);
        for (int i = 0; i < 512; i++)
            iq3s_pk[A][i] = (uint8_t)((grid_iq3s[i][2 * A] >> 1) | (grid_iq3s[i][2 * A + 1] >> 1) << 4);
    }
    fill_words(tab3w[0], xxs);
    fill_words(tab3w[1], s);
    for (int C = 0; C < 8; C++)
        for (int w = 0; w < 32; w++) iq3_src[32 * C + w] = iq3_elem(C, w);
}
static void xsplit_iq3(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++) xsplit(x + 256 * b, iq3_src, 16, 32, (uint16_t *)(xp + 256 * b));
}
AI void pass_iq3_tab(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                     float *out, const int M, const uint8_t *pf_end) {
    (void)xsum, (void)pf_end;
    const int nb = n / 256, S3 = type == T_IQ3_S, BPB = S3 ? 110 : 98;
    const __m512i table = ld64(tab3w[S3]);
    const int NC = M == 1 ? 4 : M == 2 ? 2 : 1; /* independent sums a row */
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    v16 acc[PASS_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + BPB * (int64_t)b;
        PF_BLOCK(blk, BPB);
        const __m512i ids = _mm512_loadu_si512(blk + 2);
        const __mmask64 m7 = _mm512_movepi8_mask(ids);
        /* d converted in an xmm and read back as memory (iq2_pair's d2): the scale's broadcast loads it */
        float d1[4];
        _mm_storeu_ps(d1, _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd32(blk))));
        __asm__("" : "+m"(d1));
        __m512i P[2];
        __m256i sbits;
        v16 S; /* lane j: 16-group j's scale (sub-block j / 2) */
        /* each lane looked up once, in the 128-entry quarter its id's bits 7 (8) name: a masked vpermi2b writes
         * only its lanes, the others keep their ids for the next */
        if (S3) {
            const __mmask64 m8 = _cvtu64_mask64(rd64(blk + 66));
            const __mmask64 part[4] = {_knot_mask64(_kor_mask64(m7, m8)), _kandn_mask64(m8, m7), _kandn_mask64(m7, m8),
                                       _kand_mask64(m7, m8)};
            for (int A = 0; A < 2; A++) {
                P[A] = ids;
                for (int t = 0; t < 4; t++)
                    P[A] = _mm512_mask2_permutex2var_epi8(ld64(iq3s_pk[A] + 128 * t), P[A], part[t],
                                                          ld64(iq3s_pk[A] + 128 * t + 64));
            }
            sbits = _mm256_loadu_si256((const __m256i *)(blk + 74));
            S = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(iq3s_scale8d(blk, d1[0])));
        } else {
            for (int A = 0; A < 2; A++)
                P[A] = _mm512_mask2_permutex2var_epi8(
                    ld64(iq3xxs_pk[A] + 128),
                    _mm512_mask2_permutex2var_epi8(ld64(iq3xxs_pk[A]), ids, _knot_mask64(m7), ld64(iq3xxs_pk[A] + 64)),
                    m7, ld64(iq3xxs_pk[A] + 192));
            const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 66));
            sbits = xxs_signs_vbmi(a);
            S = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(xxs_scale8(d1[0], a, 0.5f)));
        }
        /* the sign of row r's value 2 A + h (bit 4 r + 2 A + h of the 256) into bit 3 of nibble h of byte r: qword
         * j of src holds rows 8 j .. 8 j + 7 (sign dword j) */
        const __m512i src = _mm512_cvtepu32_epi64(sbits);
        for (int A = 0; A < 2; A++)
            for (int h = 0; h < 2; h++) {
                const __mmask64 neg = _mm512_bitshuffle_epi64_mask(
                    src, _mm512_add_epi8(_mm512_set1_epi64(0x1C1814100C080400LL), _mm512_set1_epi8((char)(2 * A + h))));
                P[A] = _mm512_mask_add_epi8(P[A], neg, P[A], _mm512_set1_epi8((char)(8 << (4 * h))));
            }
        v16 a[PASS_M][4];
        _Pragma("GCC unroll 8") for (int C = 0; C < 8; C++) {
            const int A = C / 4, q = C % 4, c = C % NC;
            const __m512bh w = (__m512bh)_mm512_permutexvar_epi16(q ? _mm512_srli_epi16(P[A], 4 * q) : P[A], table);
            for (int r = 0; r < M; r++) {
                const float *xr = xs[r] + 256 * (int64_t)b + 32 * C;
                a[r][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(C < NC ? v16_zero() : a[r][c], w,
                                                            (__m512bh)_mm512_loadu_si512(xr)),
                                           w, (__m512bh)_mm512_loadu_si512(xr + 16));
            }
        }
        for (int r = 0; r < M; r++) {
            v16 t = a[r][0];
            for (int c = 1; c < NC; c++) t = v16_add(t, a[r][c]);
            acc[r] = v16_fma(S, t, acc[r]);
        }
    }
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LANE_DOTS(iq3_xxst, pass_iq3_tab, T_IQ3_XXS)
LANE_DOTS(iq3_st, pass_iq3_tab, T_IQ3_S)

/* ---- IQ2_XXS per pair of blocks (IQ2_XS's 512-row grid in 4 quarters and IQ2_S's 1024 rows lost to the weight-table
 * kernels on the device: 34.0 against 38.5 and 36.1 against 42.0 GB/s, 2026-12-03, so those two keep them). iq2xxs_pk[A][id]: values 2 A, 2 A + 1 of grid row id as codes 0, 1, 2 (8,
 * 25, 43) in the two nibbles. Pair lane p: block p / 32, row rho(p % 32) (rho swaps the middle two of every 4 rows:
 * the two rows a dword pairs are one 16-group's); Z_A = the 64 lanes' bytes of iq2xxs_pk[A]; word w of Z_A: lanes
 * 2 w, 2 w + 1, nibble q = lane 2 w + q / 2, value 2 A + q % 2; dword j of combo (A, q): rows 4 (j % 8) + 2 (q / 2)
 * + t of block j / 8, 16-group 2 (j % 8) + q / 2 (two scale vectors, q / 2 = 0, 1) */
static uint8_t iq2xxs_pk[4][256] __attribute__((aligned(64)));
/* per lane p (R = rho(p % 32), 64 (p / 32) the second block's 64 bytes from offset 2): where its id lies (id l of
 * sub-block g at 8 g + l); and the bit of its sign for value 2 A + h = k in its qword of the pair's 512 sign bits */
static uint8_t iq2_sel[64] __attribute__((aligned(64)));
static uint8_t iq2_sgn[8][64] __attribute__((aligned(64)));
static uint16_t tab2w[32] __attribute__((aligned(64))); /* codes 0, 1, 2: 8, 25, 43; 8..10: their negatives */
static int32_t iq2_src2[512], iq2_src1[256];               /* pair, last single block */
AI int rho4(int r) { return (r & ~3) | ((r & 1) << 1) | ((r >> 1) & 1); }
AI int iq2_elem(int C, int j, int t) {
    const int A = C / 4, q = C % 4;
    return 256 * (j / 8) + 8 * (4 * (j % 8) + 2 * (q / 2) + t) + 2 * A + q % 2;
}
AI uint8_t iq2_code(int v) { return (uint8_t)(v == 8 ? 0 : v == 25 ? 1 : 2); }
__attribute__((constructor)) static void fill_iq2(void) {
    for (int A = 0; A < 4; A++)
        for (int i = 0; i < 256; i++)
            iq2xxs_pk[A][i] = (uint8_t)(iq2_code(grid_iq2xxs[i][2 * A]) | iq2_code(grid_iq2xxs[i][2 * A + 1]) << 4);
    for (int p = 0; p < 64; p++) {
        const int R = rho4(p % 32), bb = 64 * (p / 32);
        iq2_sel[p] = (uint8_t)(bb + 8 * (R / 4) + R % 4);
        for (int k = 0; k < 8; k++) iq2_sgn[k][p] = (uint8_t)(8 * (R % 8) + k);
    }
    const float v[16] = {8, 25, 43, 0, 0, 0, 0, 0, -8, -25, -43, 0, 0, 0, 0, 0};
    fill_words(tab2w, v);
    for (int C = 0; C < 16; C++)
        for (int w = 0; w < 32; w++) {
            iq2_src2[32 * C + w] = iq2_elem(C, w / 2, w % 2);
            if (w < 16) iq2_src1[16 * C + w] = iq2_elem(C, w / 2, w % 2);
        }
}
static void xsplit_iq2(const float *x, int n, float *xp) {
    const int nb = n / 256;
    for (int b = 0; b + 1 < nb; b += 2) xsplit(x + 256 * b, iq2_src2, 32, 32, (uint16_t *)(xp + 256 * b));
    if (nb % 2) xsplit(x + 256 * (nb - 1), iq2_src1, 16, 16, (uint16_t *)(xp + 256 * (nb - 1)));
}
/* one pair of blocks at b0 (TWO = 0: a last single block, looked up as a pair with itself, its x half zero) */
AI void iq2_pair(const int type, const int TWO, const uint8_t *b0, const float *const *xs, int64_t xoff, v16 *acc,
                 const int M) {
    (void)type;
    const int BPB = 66, NT = 2;          /* the grid's 128-entry halves */
    const int NC = M == 1 ? 2 : 1;       /* sums per scale vector and row */
    const uint8_t *pk = &iq2xxs_pk[0][0], *b1 = TWO ? b0 + BPB : b0;
    PF_BLOCK(b0, 2 * BPB);
    const __m512i L0 = _mm512_loadu_si512(b0 + 2), L1 = _mm512_loadu_si512(b1 + 2);
    /* per 32 weights u32 of 4 grid ids, u32 of 4 sign ids and the scale: the lanes' ids (low 8 bits), the pair's
     * sign bytes in row order SB, the grid half of each id (part) */
    const __m512i ids = _mm512_permutex2var_epi8(L0, ld64(iq2_sel), L1);
    const __mmask64 m7 = _mm512_movepi8_mask(ids);
    const __mmask64 part[2] = {_knot_mask64(m7), m7};
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i a0 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, L0));
    const __m256i a1 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, L1));
    const __m512i SB = _mm512_inserti64x4(_mm512_castsi256_si512(xxs_signs_vbmi(a0)), xxs_signs_vbmi(a1), 1);
    /* the two blocks' d converted in one xmm and read back as memory (the asm): the scales' broadcasts of d load
     * it, where rdh's scalar convert cost each block an insert, a convert and a broadcast on the shuffle port that
     * the lookups fill (llvm-mca -mcpu=sapphirerapids, M = 1, per pair: 84.1 -> 80.1 cycles); the same floats, so
     * the same scale bits. Each dword's upper half (the first qs bytes) converts to an unused float. */
    float d2[4];
    _mm_storeu_ps(d2, _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)rd32(b0)), _mm_cvtsi32_si128((int)rd32(b1)))));
    __asm__("" : "+m"(d2));
    const v16 S0 = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(xxs_scale8(d2[0], a0, 0.25f))),
                                                       _mm256_castps_pd(xxs_scale8(d2[2], a1, 0.25f)), 1));
    const v16 S1 = S0;
    v16 a[PASS_M][2][2];
    _Pragma("GCC unroll 4") for (int A = 0; A < 4; A++) {
        __m512i Z = ids;
        for (int t = 0; t < NT; t++)
            Z = _mm512_mask2_permutex2var_epi8(ld64(pk + 128 * (NT * A + t)), Z, part[t], ld64(pk + 128 * (NT * A + t) + 64));
        Z = _mm512_mask_add_epi8(Z, _mm512_bitshuffle_epi64_mask(SB, ld64(iq2_sgn[2 * A])), Z, _mm512_set1_epi8(8));
        Z = _mm512_mask_add_epi8(Z, _mm512_bitshuffle_epi64_mask(SB, ld64(iq2_sgn[2 * A + 1])), Z,
                                 _mm512_set1_epi8((char)0x80));
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const __m512bh w = (__m512bh)_mm512_permutexvar_epi16(q ? _mm512_srli_epi16(Z, 4 * q) : Z, ld64(tab2w));
            const int C = 4 * A + q, s = q / 2, c = NC == 2 ? A & 1 : 0, first = A < NC && q % 2 == 0;
            for (int r = 0; r < M; r++) {
                const float *xr = xs[r] + xoff + (TWO ? 32 : 16) * C;
                const __m512i hi = TWO ? _mm512_loadu_si512(xr) : _mm512_maskz_loadu_epi16(0xFFFF, xr);
                const __m512i lo = TWO ? _mm512_loadu_si512(xr + 16) : _mm512_maskz_loadu_epi16(0xFFFF, xr + 8);
                a[r][s][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(first ? v16_zero() : a[r][s][c], w, (__m512bh)hi), w,
                                              (__m512bh)lo);
            }
        }
    }
    for (int r = 0; r < M; r++) {
        acc[r] = v16_fma(S0, NC == 2 ? v16_add(a[r][0][0], a[r][0][1]) : a[r][0][0], acc[r]);
        acc[r] = v16_fma(S1, NC == 2 ? v16_add(a[r][1][0], a[r][1][1]) : a[r][1][0], acc[r]);
    }
}
/* a row of n weights (its x split from a pair boundary: rows_dots' column chunks are whole pairs, see below) */
AI void pass_iq2_tab(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                     float *out, const int M, const uint8_t *pf_end) {
    (void)xsum, (void)pf_end;
    const int nb = n / 256, BPB = 66;
    v16 acc[PASS_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    int b = 0;
    for (; b + 2 <= nb; b += 2) iq2_pair(type, 1, row + BPB * (int64_t)b, xs, 256 * (int64_t)b, acc, M);
    if (b < nb) iq2_pair(type, 0, row + BPB * (int64_t)b, xs, 256 * (int64_t)b, acc, M);
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LANE_DOTS(iq2_xxst, pass_iq2_tab, T_IQ2_XXS)
/* the lane-order kernels of x rows serve at most LANE_MAX_ROWS token rows, in column chunks of X_CHUNK_FLOATS / m
 * (rows_dots): whole pairs of blocks for m = 1, 2 */
_Static_assert(LANE_MAX_ROWS <= 2 && X_CHUNK_FLOATS % 1024 == 0, "IQ2 pairs: chunks of whole block pairs");

#endif /* STRATA_EXPERT_POOL_GRIDS_LANE_H */
