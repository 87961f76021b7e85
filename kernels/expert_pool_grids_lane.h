/* expert_pool_grids_lane.h: the grid i-quants' gate/up kernels at few token rows (fused_dots_xperm) in the
 * avx512vbmi build (STRATA_VBMI: AVX-512 with VBMI and BITALG, Ice Lake and later, Zen 4): IQ2_XXS, IQ3_XXS, IQ3_S
 * decoded from register tables. Built on expert_pool_groups.h's lane-order kernels and picked by
 * expert_pool_dispatch.h. The weight-table decoders of expert_pool_grids.h stay the row decoder (strata_dequant_row,
 * the bit-for-bit tests), the kernel at more token rows, the down rows' kernel and the plain avx512 build's.
 *
 * Why: those decoders build each 16 weights from 2 or 4 grid row loads and inserts, a sign mask, a widen and a
 * scale x table multiply, ~20 instructions beside the FMA: on the device the i-quants ran at 1.6-2.1 GB/s a thread
 * at one token row (Q4_0 5.0). Here, per block (IQ3) or pair of blocks (IQ2): the ids of 64 grid rows in one zmm
 * are looked up in the grid packed as 4-bit codes (vpermi2b, 128 entries a lookup), the signs go into the codes
 * (vpshufbitqmb picks each lane's sign bits, one masked byte add per nibble), and per 16 weights one dword shift,
 * one vpermps of the 16 signed values by each dword's low nibble and one FMA a token row do the rest.
 *
 * Arithmetic: float32 on the exact values (small integers) and x, x permuted once per call (xperm_iq2, xperm_iq3);
 * the sums a dword lane (all of one sub-block) times the sub-block's scale (gguf's float operations, so its scale
 * bits) once per block or pair. Not the weight-table kernels' bits (another order of the same float32 products):
 * within the tests' 1e-4 of float64 (dev box: max |err| / max |ref| ~1e-7 on a 2560-row).
 *
 * Until 2026-12-04 the dot products were vdpbf16ps pairs of x split into bf16 hi + lo: on the device's host (one
 * thread, rows hot in L2, IQ2_XXS) that kernel took 332 ns a 2560-row and 180 in a build with its vdpbf16ps taken
 * out (a diagnosis, not kept), where an FMA a 16 weights runs two a cycle (bench/pool_rows_bench.py --old: the
 * float32 kernel against it, docs/BENCHMARKS.md).
 */
#ifndef STRATA_EXPERT_POOL_GRIDS_LANE_H
#define STRATA_EXPERT_POOL_GRIDS_LANE_H
#include "expert_pool_groups.h"

AI __m512i ld64(const void *p) { return _mm512_load_si512(p); }
/* x permuted into a kernel's order: xp[16 i + k] = x[src[16 i + k]] for i < nvec */
static void gather_x(const float *x, const int32_t *src, int nvec, float *xp) {
    for (int i = 0; i < nvec; i++)
        _mm512_storeu_ps(xp + 16 * i, _mm512_i32gather_ps(_mm512_loadu_si512(src + 16 * i), x, 4));
}

/* ---- IQ3_XXS, IQ3_S per block. iq3*_pk[A][id]: values 2 A, 2 A + 1 of grid row id as 3-bit codes in the low and
 * high nibble (IQ3_XXS: 4, 12, .., 52, 62 -> v >> 3; IQ3_S: 1, 3, .., 15 -> v >> 1); byte r of P_A = row r of the
 * block, its nibbles' bit 3 the sign; dword j of P_A = rows 4 j .. 4 j + 3, nibble q = row 4 j + q / 2, value
 * 2 A + q % 2 */
static uint8_t iq3xxs_pk[2][256] __attribute__((aligned(64)));
static uint8_t iq3s_pk[2][512] __attribute__((aligned(64)));
/* IQ3_XXS, IQ3_S: + values at codes 0..7, - values at 8..15 */
static const float tab3f[2][16] __attribute__((aligned(64))) = {
    {4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62},
    {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15}};
static int32_t iq3_src[256];
/* x order per block: group G = 8 A + q (nibble q of every dword of P_A) at 16 G, lane j: row 4 j + q / 2, value
 * 2 A + q % 2 */
AI int iq3_elem(int G, int j) {
    const int A = G / 8, q = G % 8;
    return 16 * j + 4 * (q / 2) + 2 * A + q % 2;
}
__attribute__((constructor)) static void fill_iq3(void) {
    for (int A = 0; A < 2; A++) {
        for (int i = 0; i < 256; i++)
            iq3xxs_pk[A][i] = (uint8_t)((grid_iq3xxs[i][2 * A] >> 3) | (grid_iq3xxs[i][2 * A + 1] >> 3) << 4);
        for (int i = 0; i < 512; i++)
            iq3s_pk[A][i] = (uint8_t)((grid_iq3s[i][2 * A] >> 1) | (grid_iq3s[i][2 * A + 1] >> 1) << 4);
    }
    for (int G = 0; G < 16; G++)
        for (int j = 0; j < 16; j++) iq3_src[16 * G + j] = iq3_elem(G, j);
}
static void xperm_iq3(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++) gather_x(x + 256 * b, iq3_src, 16, xp + 256 * b);
}
AI void pass_iq3_tab(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                     float *out, const int M, const uint8_t *pf_end) {
    (void)xsum, (void)pf_end;
    const int nb = n / 256, S3 = type == T_IQ3_S, BPB = S3 ? 110 : 98;
    const __m512 table = _mm512_load_ps(tab3f[S3]);
    const int NC = M == 1 ? 4 : 2; /* independent sums a row (FMA latency 4, two a cycle) */
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
        v16 S; /* lane j: the scale of rows 4 j .. 4 j + 3 (sub-block j / 2) */
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
        for (int r = 0; r < M; r++)
            for (int c = 0; c < NC; c++) a[r][c] = v16_zero();
        _Pragma("GCC unroll 16") for (int G = 0; G < 16; G++) {
            const int A = G / 8, q = G % 8, c = G % NC;
            const v16 w = _mm512_permutexvar_ps(q ? _mm512_srli_epi32(P[A], 4 * q) : P[A], table);
            for (int r = 0; r < M; r++) a[r][c] = v16_fma(w, _mm512_loadu_ps(xs[r] + 256 * (int64_t)b + 16 * G), a[r][c]);
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

/* ---- IQ2_XXS per pair of blocks, in float32 (IQ2_XS's 512-row grid in 4 quarters and IQ2_S's 1024 rows lost to the
 * weight-table kernels on the device: 34.0 against 38.5 and 36.1 against 42.0 GB/s, 2026-12-03, so those two keep
 * them). iq2xxs_pk[A][id]: values 2 A, 2 A + 1 of grid row id as codes 0, 1, 2 (8, 25, 43) in the two nibbles. Pair
 * lane p: block p / 32, row rho(p % 32) (rho swaps the middle two of every 4 rows); Z_A = the 64 lanes' bytes of
 * iq2xxs_pk[A], the signs added as bit 3 of each nibble; dword j of Z_A = lanes 4 j .. 4 j + 3, all rows of sub-block
 * j % 8 of block j / 8 (one scale a dword: S lane j), nibble q of dword j = lane 4 j + q / 2, value 2 A + q % 2.
 * Group (A, q) of 16 weights: Z_A >> 4 q, one vpermps of the 16-float table by each dword's low nibble (the values,
 * exact), one FMA with x in that order a row; the scale once per pair (acc += S * sum).
 */
static uint8_t iq2xxs_pk[4][256] __attribute__((aligned(64)));
/* per lane p (R = rho(p % 32), 64 (p / 32) the second block's 64 bytes from offset 2): where its id lies (id l of
 * sub-block g at 8 g + l); and the bit of its sign for value 2 A + h = k in its qword of the pair's 512 sign bits */
static uint8_t iq2_sel[64] __attribute__((aligned(64)));
static uint8_t iq2_sgn[8][64] __attribute__((aligned(64)));
static const float tab2f[16] __attribute__((aligned(64))) = {8, 25, 43, 0, 0, 0, 0, 0, -8, -25, -43, 0, 0, 0, 0, 0};
static int32_t iq2_src2[512], iq2_src1[256]; /* element of each x position: pair, last single block */
AI int rho4(int r) { return (r & ~3) | ((r & 1) << 1) | ((r >> 1) & 1); }
/* x order: a pair at 512 k, group G = 8 A + q at 16 G, lane j; a last single block at 256 b, group G at 8 G, lane
 * j < 8. The element of (G, j) from the pair's / block's first */
AI int iq2_elem(int G, int j) {
    const int A = G / 8, q = G % 8, p = 4 * j + q / 2;
    return 256 * (p / 32) + 8 * rho4(p % 32) + 2 * A + q % 2;
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
    for (int G = 0; G < 32; G++)
        for (int j = 0; j < 16; j++) {
            iq2_src2[16 * G + j] = iq2_elem(G, j);
            if (j < 8) iq2_src1[8 * G + j] = iq2_elem(G, j);
        }
}
static void xperm_iq2(const float *x, int n, float *xp) {
    const int nb = n / 256;
    int b = 0;
    for (; b + 1 < nb; b += 2) gather_x(x + 256 * b, iq2_src2, 32, xp + 256 * b);
    if (b < nb) gather_x(x + 256 * b, iq2_src1, 16, xp + 256 * b);
}
/* one pair of blocks at b0 (TWO = 0: a last single block, looked up as a pair with itself, its lanes 8..15 read no
 * x: masked loads) */
AI void iq2_pair(const int type, const int TWO, const uint8_t *b0, const float *const *xs, int64_t xoff, v16 *acc,
                 const int M) {
    (void)type;
    const int BPB = 66, NT = 2;           /* the grid's 128-entry halves */
    const int NC = M == 1 ? 4 : 2;        /* independent sums a row (FMA latency 4, two a cycle) */
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
     * the lookups fill; the same floats, so the same scale bits. Each dword's upper half (the first qs bytes)
     * converts to an unused float. */
    float d2[4];
    _mm_storeu_ps(d2, _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)rd32(b0)), _mm_cvtsi32_si128((int)rd32(b1)))));
    __asm__("" : "+m"(d2));
    const v16 S = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(xxs_scale8(d2[0], a0, 0.25f))),
                                                      _mm256_castps_pd(xxs_scale8(d2[2], a1, 0.25f)), 1));
    const __m512 table = _mm512_load_ps(tab2f);
    v16 a[PASS_M][4];
    for (int r = 0; r < M; r++)
        for (int c = 0; c < NC; c++) a[r][c] = v16_zero();
    _Pragma("GCC unroll 4") for (int A = 0; A < 4; A++) {
        __m512i Z = ids;
        for (int t = 0; t < NT; t++)
            Z = _mm512_mask2_permutex2var_epi8(ld64(pk + 128 * (NT * A + t)), Z, part[t], ld64(pk + 128 * (NT * A + t) + 64));
        Z = _mm512_mask_add_epi8(Z, _mm512_bitshuffle_epi64_mask(SB, ld64(iq2_sgn[2 * A])), Z, _mm512_set1_epi8(8));
        Z = _mm512_mask_add_epi8(Z, _mm512_bitshuffle_epi64_mask(SB, ld64(iq2_sgn[2 * A + 1])), Z,
                                 _mm512_set1_epi8((char)0x80));
        _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++) {
            const v16 w = _mm512_permutexvar_ps(q ? _mm512_srli_epi32(Z, 4 * q) : Z, table);
            const int G = 8 * A + q, c = G % NC;
            for (int r = 0; r < M; r++) {
                const float *xr = xs[r] + xoff + (TWO ? 16 : 8) * G;
                a[r][c] = v16_fma(w, TWO ? _mm512_loadu_ps(xr) : _mm512_maskz_loadu_ps(0xFF, xr), a[r][c]);
            }
        }
    }
    for (int r = 0; r < M; r++) {
        v16 t = a[r][0];
        for (int c = 1; c < NC; c++) t = v16_add(t, a[r][c]);
        acc[r] = v16_fma(S, t, acc[r]);
    }
}
/* a row of n weights (its x permuted from a pair boundary: rows_dots' column chunks are whole pairs, see below) */
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
