/* expert_pool_limbs.h: the grid i-quants' gate/up kernels at few token rows in the avx512vbmi build (STRATA_VBMI:
 * AVX-512 with VBMI, BITALG and VNNI: Ice Lake and later, Zen 4): IQ2_XXS, IQ3_XXS, IQ3_S (rows by register
 * lookups), IQ1_S, IQ1_M, IQ2_XS, IQ2_S (rows gathered), and TQ1_0's at every row count, with integer products (vpdpbusd): the weights as biased
 * bytes, x as three signed byte limbs of a fixed-point mantissa per sub-block. Picked by expert_pool_dispatch.h
 * (fused_dots_limbs: x rows only; h rows keep expert_pool_few.h's lane kernels or the weight-table decoders of
 * expert_pool_grids.h, which also stay the kernel at more token rows, of the plain avx512 build, and the row
 * decoder, strata_dequant_row, that the bit-for-bit tests hold to gguf).
 *
 * Why: the float32 table kernels these replace (until 2026-12-04) spent a dword shift, a vpermps and an FMA a 16
 * weights and token row beside their lookups, all on the two vector ports of the device's host (Golden Cove). Here
 * 64 weights cost a vpermb (code to biased byte), a sign mask (vpshufbitqmb) and a masked byte subtract, then three
 * vpdpbusd a token row: the 64 products with x's three limbs, summed 4 a dword lane, exact in int32. The grid
 * lookups (vpermi2b of 128 entries: 3 uops there) are kept few: IQ2_XXS's 8 values a row as 2-bit codes, 4 a byte
 * (2 lookups of 256 entries for 64 rows), IQ3's 4 as 3-bit codes, 2 a byte.
 *
 * Arithmetic. x: per dword lane j (the elements one sub-block scale multiplies: IQ2_XXS 32, IQ3 16), e_j = the
 * exponent with max |x| < 2^e_j (frexp); m = round(x 2^(22 - e_j)) (|m| <= 2^22, vcvtps2dq's rounding: to nearest),
 * m = l2 2^16 + l1 2^8 + l0 with l0, l1 in [-128, 127] (the low byte, signed) and l2 in [-64, 64]: x is taken as
 * m 2^(e_j - 22), within 2^-23 of the lane's largest |x| (a float32 of it holds 2^-24). A lane holding a NaN or an
 * infinity gets E = NaN (its rows' outputs are NaN). Weights:
 * u = LIMB_BIAS + the signed grid value, 0 < u < 128; vpdpbusd(u, l) sums u l, and the bias's part BIAS * sum(l) is
 * each lane's starting value (C, per call: the accumulators start there), so what is left is sum(w l) exactly, each
 * limb in its own int32 lane (|sum| < 2^20). Per lane then (a sub-block of one scale): t = float(L2) 2^16 +
 * float(L1) 2^8 + float(L0) (two roundings of float32), acc += S * (E * t). Not the float32 kernels' bits; within
 * the tests' 1e-4 of float64 (max |err| / max |ref| ~3e-7 on 2560-weight rows; a one-hot x is exact: each output is
 * gguf's weight bit for bit).
 *
 * x slot (xlimbs_of writes it where the lane order would put the floats: 4 bytes an element): V value rows of W
 * bytes, X[l][v] at W (V l + v) (l = 0 the low limb .. 2, value row v: byte p = limb l of x at the kernel's element
 * of (v, p)), E (W / 4 floats: lane j's 2^(e_j - 22)) at 3 V W, C[l] (W / 4 int32: -bias times the sum of lane
 * j's limb-l bytes over the V rows) at 3 V W + W + W l. IQ2_XXS: a pair of blocks (V = 8, W = 64: 1792 of 2048 bytes)
 * or a last lone block (W = 32); IQ3: a block (V = 4, W = 64: 1024 bytes); the gathered rows' form
 * (xlimbs_rows) below.
 */
#ifndef STRATA_EXPERT_POOL_LIMBS_H
#define STRATA_EXPERT_POOL_LIMBS_H
#include "expert_pool_groups.h"
#include "expert_pool_few.h" /* IQ1_S / IQ1_M's grid rows (iq1_rows) */

AI __m512i ld64(const void *p) { return _mm512_load_si512(p); }
/* x permuted into a kernel's order: xp[16 i + k] = x[src[16 i + k]] for i < nvec */
static void gather_x(const float *x, const int32_t *src, int nvec, float *xp) {
    for (int i = 0; i < nvec; i++)
        _mm512_storeu_ps(xp + 16 * i, _mm512_i32gather_ps(_mm512_loadu_si512(src + 16 * i), x, 4));
}

#define LIMB_BIAS 64 /* > the largest |grid value| of the types here (IQ2_XXS 43) */
#define LIMB_MANT 22 /* |m| <= 2^22: l2 in [-64, 64] */

/* ---- x into limbs: one slot from x at its first element; src[k] the element of slot position k (the kernel's byte
 * order: value row v's W bytes at W v), V value rows of W bytes (W = 64, or 32 for a lone IQ2 block). Each dword lane
 * j (bytes 4 j .. 4 j + 3 of every row: the elements one sub-block scale multiplies) has its own exponent: a large
 * value costs precision only to the 4 V - 1 elements beside it (IQ2_XXS 31, IQ3 15). */
static void limbs_of(const float *x, const int32_t *src, int V, int W, int mant, uint8_t *slot) {
    float g[512], mx[64] = {0}, up[64], E[16];
    gather_x(x, src, V * W / 16, g);
    __mmask64 bad = 0;
    for (int q = 0; q < W / 16; q++) {
        __m512 m = _mm512_setzero_ps();
        for (int v = 0; v < V; v++) {
            const __m512 xv = _mm512_loadu_ps(g + W * v + 16 * q);
            bad |= (__mmask64)_mm512_fpclass_ps_mask(xv, 0x99) << (16 * q); /* QNaN, SNaN, +Inf, -Inf */
            m = _mm512_max_ps(m, _mm512_abs_ps(xv));
        }
        _mm512_storeu_ps(mx + 16 * q, m);
    }
    for (int j = 0; j < W / 4; j++) {
        const float m = fmaxf(fmaxf(mx[4 * j], mx[4 * j + 1]), fmaxf(mx[4 * j + 2], mx[4 * j + 3]));
        int e = 0;
        if (m > 0.0f) frexpf(m, &e); /* m < 2^e */
        for (int i = 0; i < 4; i++) up[4 * j + i] = (float)(mant - e);
        E[j] = (bad >> (4 * j)) & 15 ? NAN : ldexpf(1.0f, e - mant);
    }
    int8_t *X = (int8_t *)slot;
    for (int v = 0; v < V; v++)
        for (int q = 0; q < W / 16; q++) {
            const __m512 xv = _mm512_loadu_ps(g + W * v + 16 * q);
            const __m512i mi = _mm512_cvtps_epi32(_mm512_scalef_ps(xv, _mm512_loadu_ps(up + 16 * q)));
            const __m512i l0 = _mm512_srai_epi32(_mm512_slli_epi32(mi, 24), 24);
            const __m512i m1 = _mm512_srai_epi32(_mm512_sub_epi32(mi, l0), 8);
            const __m512i l1 = _mm512_srai_epi32(_mm512_slli_epi32(m1, 24), 24);
            const __m512i l2 = _mm512_srai_epi32(_mm512_sub_epi32(m1, l1), 8);
            _mm_storeu_si128((__m128i *)(X + W * (0 * V + v) + 16 * q), _mm512_cvtepi32_epi8(l0));
            _mm_storeu_si128((__m128i *)(X + W * (1 * V + v) + 16 * q), _mm512_cvtepi32_epi8(l1));
            _mm_storeu_si128((__m128i *)(X + W * (2 * V + v) + 16 * q), _mm512_cvtepi32_epi8(l2));
        }
    memcpy(slot + 3 * V * W, E, sizeof(float) * (size_t)(W / 4));
}
/* C[l] of a slot limbs_of wrote: -bias times each lane's limb-l bytes over the V rows (the kernels with one
 * accumulator a limb; xlimbs_rows writes its own Horner-combined C) */
static void limb_bias_sums(int V, int W, int bias, uint8_t *slot) {
    const int8_t *X = (const int8_t *)slot;
    const __mmask64 lanes = W == 64 ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu;
    for (int l = 0; l < 3; l++) {
        __m512i c = _mm512_setzero_si512();
        for (int v = 0; v < V; v++)
            c = _mm512_dpbusd_epi32(c, _mm512_set1_epi8((char)bias), _mm512_maskz_loadu_epi8(lanes, X + W * (V * l + v)));
        _mm512_mask_storeu_epi32(slot + 3 * V * W + W + W * l, (__mmask16)(W == 64 ? 0xFFFF : 0xFF),
                                 _mm512_sub_epi32(_mm512_setzero_si512(), c));
    }
}
/* a slot's parts: limb row (l, v), E, C[l] (V value rows of W bytes; zero-extended past W) */
AI __m512i limb_row(const uint8_t *slot, const int V, const int W, int l, int v) {
    const uint8_t *p = slot + W * (V * l + v);
    return W == 64 ? _mm512_loadu_si512(p) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p));
}
AI v16 limb_E(const uint8_t *slot, const int V, const int W) {
    const float *p = (const float *)(slot + 3 * V * W);
    return W == 64 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(0xFF, p);
}
AI __m512i limb_C(const uint8_t *slot, const int V, const int W, int l) {
    const uint8_t *p = slot + 3 * V * W + W + W * l;
    return W == 64 ? _mm512_loadu_si512(p) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p));
}
/* token rows a pass of a limb kernel (LIMB_DOTS_FN: 4, 2, 1): 4 x 3 accumulators, and two chains a limb for 1 and 2
 * rows (vpdpbusd's latency: a chain of one row's 8 products a pair would wait on itself) */
#define LIMB_M 4
#define LIMB_NC(M) ((M) <= 2 ? 2 : 1)
#define LIMB_DOTS_FN(NAME, PASS, TYPE)                                                                              \
    static void dots_##NAME(const uint8_t *row, int n, const float *const *xs, const float *const *xsum, int m,   \
                            float *out, const uint8_t *pf_end) {                                                    \
        for (int r0 = 0; r0 < m;) {                                                                                 \
            const int left = m - r0, M = left >= 4 ? 4 : left >= 2 ? 2 : 1;                                        \
            if (M == 4) PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 4, pf_end);                                \
            else if (M == 2) PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 2, pf_end);                           \
            else PASS(TYPE, row, n, xs + r0, xsum + r0, out + r0, 1, pf_end);                                       \
            r0 += M;                                                                                                \
        }                                                                                                           \
    }
/* the pass of a per-block limb kernel over a row of n weights: BLOCK(type, blk, xs, xoff, acc, M) adds block b's
 * dots to acc (BPB(type) bytes a block) */
#define LIMB_BLOCKS_PASS(NAME, BLOCK, BPB)                                                                          \
    AI void NAME(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,      \
                 float *out, const int M, const uint8_t *pf_end) {                                                  \
        (void)xsum, (void)pf_end;                                                                                   \
        v16 acc[LIMB_M];                                                                                            \
        for (int r = 0; r < M; r++) acc[r] = v16_zero();                                                            \
        for (int b = 0; b < n / 256; b++) {                                                                         \
            const uint8_t *blk = row + BPB(type) * (int64_t)b;                                                      \
            PF_BLOCK(blk, BPB(type));                                                                               \
            BLOCK(type, blk, xs, 256 * (int64_t)b, acc, M);                                                         \
        }                                                                                                           \
        for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);                                                      \
    }
/* the accumulators of a slot: A[r][0][l] from C[l], A[r][1][l] zero (LIMB_NC chains a limb) */
#define LIMB_ACC_INIT(A, xs, xoff, V, W, M)                                                                         \
    for (int r = 0; r < (M); r++)                                                                                   \
        for (int l = 0; l < 3; l++) {                                                                               \
            A[r][0][l] = limb_C((const uint8_t *)((xs)[r] + (xoff)), V, W, l);                                      \
            if (LIMB_NC(M) > 1) A[r][1][l] = _mm512_setzero_si512();                                                \
        }
/* value row v's biased weight bytes w into the accumulators of every token row */
#define LIMB_DOTS(A, w, v, xs, xoff, V, W, M)                                                                       \
    for (int r = 0; r < (M); r++)                                                                                   \
        for (int l = 0; l < 3; l++)                                                                                 \
            A[r][(v) % LIMB_NC(M)][l] = _mm512_dpbusd_epi32(A[r][(v) % LIMB_NC(M)][l], w,                           \
                                                            limb_row((const uint8_t *)((xs)[r] + (xoff)), V, W, l, v));
/* acc[r] += S * (E * t), t the lanes' sum of w x from their three limb sums */
#define LIMB_FINISH(A, S, acc, xs, xoff, V, W, M)                                                                   \
    for (int r = 0; r < (M); r++) {                                                                                 \
        v16 F_[3];                                                                                                  \
        for (int l = 0; l < 3; l++)                                                                                 \
            F_[l] = _mm512_cvtepi32_ps(LIMB_NC(M) > 1 ? _mm512_add_epi32(A[r][0][l], A[r][1][l]) : A[r][0][l]);     \
        const v16 t_ = v16_fma(F_[2], v16_set1(65536.0f), v16_fma(F_[1], v16_set1(256.0f), F_[0]));                 \
        acc[r] = v16_fma(S, v16_mul(limb_E((const uint8_t *)((xs)[r] + (xoff)), V, W), t_), acc[r]);                \
    }
_Static_assert(28 * 64 <= 2048 && 28 * 32 <= 1024 && 16 * 64 <= 1024, "limb slots fit where x's floats would be");
/* the limb kernels of x rows serve at most LANE_MAX_ROWS token rows, in column chunks of X_CHUNK_FLOATS / m
 * (rows_dots): whole pairs of blocks for m = 1, 2 (IQ2_XXS's slots) */
_Static_assert(LANE_MAX_ROWS <= 2 && X_CHUNK_FLOATS % 1024 == 0, "IQ2 pairs: chunks of whole block pairs");

/* ---- IQ2_XXS per pair of blocks. Pair lane p (of 64): block p / 32, grid row p % 32 (sub-block (p % 32) / 4, row
 * p % 4), so dword j = the 4 rows of sub-block j % 8 of block j / 8 (one scale a lane: S lane j, as the float32
 * weight-table decoders'). Two 256-entry lookups a pair (each two vpermi2b, 3 uops on Golden Cove: the cost to keep few) give
 * every row's 8 values as 2-bit codes, 4 a byte; a vpermb a value maps its code to the biased byte. */
AI uint8_t iq2_code(int v) { return (uint8_t)(v == 8 ? 0 : v == 25 ? 1 : 2); }
static uint8_t iq2v_tab[2][256] __attribute__((aligned(64)));  /* byte k: values 4 k .. 4 k + 3 as codes 0, 1, 2 */
static uint8_t iq2v_map[3][64] __attribute__((aligned(64)));   /* [c][i]: LIMB_BIAS + the value of code (i >> 2 c) & 3 */
static uint8_t iq2v_sel[64] __attribute__((aligned(64)));    /* where lane p's id lies in the pair's qs bytes */
static uint8_t iq2v_sgn[8][64] __attribute__((aligned(64))); /* the bit of lane p's sign of value v in its qword */
static int32_t iq2v_src2[512], iq2v_src1[256];               /* the element of each slot position: pair, single */
__attribute__((constructor)) static void fill_iq2v(void) {
    static const int val[4] = {8, 25, 43, 0};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 256; i++) {
            int b = 0;
            for (int c = 0; c < 4; c++) b |= iq2_code(grid_iq2xxs[i][4 * k + c]) << (2 * c);
            iq2v_tab[k][i] = (uint8_t)b;
        }
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 64; i++) iq2v_map[c][i] = (uint8_t)(LIMB_BIAS + val[(i >> (2 * c)) & 3]);
    for (int p = 0; p < 64; p++) {
        iq2v_sel[p] = (uint8_t)(64 * (p / 32) + 8 * ((p % 32) / 4) + p % 4);
        for (int v = 0; v < 8; v++) iq2v_sgn[v][p] = (uint8_t)(8 * (p % 8) + v);
    }
    for (int v = 0; v < 8; v++)
        for (int p = 0; p < 64; p++) {
            iq2v_src2[64 * v + p] = 256 * (p / 32) + 8 * (p % 32) + v;
            if (p < 32) iq2v_src1[32 * v + p] = 8 * p + v;
        }
}
static void xlimbs_iq2(const float *x, int n, float *xp) {
    const int nb = n / 256;
    int b = 0;
    for (; b < nb; b += 2) {
        const int W = b + 1 < nb ? 64 : 32; /* a pair, or a last lone block */
        limbs_of(x + 256 * b, W == 64 ? iq2v_src2 : iq2v_src1, 8, W, LIMB_MANT, (uint8_t *)(xp + 256 * b));
        limb_bias_sums(8, W, LIMB_BIAS, (uint8_t *)(xp + 256 * b));
    }
}
AI void iq2v_pair(const int TWO, const uint8_t *b0, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    const int BPB = 66, W = TWO ? 64 : 32;
    const uint8_t *b1 = TWO ? b0 + BPB : b0;
    PF_BLOCK(b0, 2 * BPB);
    const __m512i L0 = _mm512_loadu_si512(b0 + 2), L1 = _mm512_loadu_si512(b1 + 2);
    const __m512i ids = _mm512_permutex2var_epi8(L0, ld64(iq2v_sel), L1);
    const __mmask64 m7 = _mm512_movepi8_mask(ids), lo7 = _knot_mask64(m7);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i a0 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, L0));
    const __m256i a1 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, L1));
    const __m512i SB = _mm512_inserti64x4(_mm512_castsi256_si512(xxs_signs_vbmi(a0)), xxs_signs_vbmi(a1), 1);
    float d2[4]; /* both blocks' d in one convert, read back as memory (no insert, convert and broadcast on the shuffle port a block) */
    _mm_storeu_ps(d2, _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)rd32(b0)), _mm_cvtsi32_si128((int)rd32(b1)))));
    __asm__("" : "+m"(d2));
    const v16 S = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(xxs_scale8(d2[0], a0, 0.25f))),
                                                      _mm256_castps_pd(xxs_scale8(d2[2], a1, 0.25f)), 1));
    const __m512i twob = _mm512_set1_epi8(2 * LIMB_BIAS);
    __m512i A[LIMB_M][2][3]; /* [row][value parity][limb] */
    LIMB_ACC_INIT(A, xs, xoff, 8, W, M)
    _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++) {
        const uint8_t *t = iq2v_tab[k];
        __m512i B = _mm512_mask2_permutex2var_epi8(ld64(t), ids, lo7, ld64(t + 64));
        B = _mm512_mask2_permutex2var_epi8(ld64(t + 128), B, m7, ld64(t + 192));
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            const int v = 4 * k + c; /* code c of B's bytes (the 4th shifted into the 3rd's place: vpermb reads 6 bits) */
            __m512i w = _mm512_permutexvar_epi8(c < 3 ? B : _mm512_srli_epi16(B, 2), ld64(iq2v_map[c < 3 ? c : 2]));
            w = _mm512_mask_sub_epi8(w, _mm512_bitshuffle_epi64_mask(SB, ld64(iq2v_sgn[v])), twob, w);
            LIMB_DOTS(A, w, v, xs, xoff, 8, W, M)
        }
    }
    LIMB_FINISH(A, S, acc, xs, xoff, 8, W, M)
}
AI void pass_iq2v(const int type, const uint8_t *row, int n, const float *const *xs, const float *const *xsum,
                  float *out, const int M, const uint8_t *pf_end) {
    (void)type, (void)xsum, (void)pf_end;
    const int nb = n / 256, BPB = 66;
    v16 acc[LIMB_M];
    for (int r = 0; r < M; r++) acc[r] = v16_zero();
    int b = 0;
    for (; b + 2 <= nb; b += 2) iq2v_pair(1, row + BPB * (int64_t)b, xs, 256 * (int64_t)b, acc, M);
    if (b < nb) iq2v_pair(0, row + BPB * (int64_t)b, xs, 256 * (int64_t)b, acc, M);
    for (int r = 0; r < M; r++) out[r] = v16_hsum(acc[r]);
}
LIMB_DOTS_FN(iq2_xxsv, pass_iq2v, T_IQ2_XXS)

/* ---- IQ3_XXS, IQ3_S per block. Lane p (of 64): grid row p of the block (4 values), so dword j = rows 4 j .. 4 j + 3,
 * all of sub-block j / 2 (S lane j, as the float32 kernel's). Per 2 values of every row one lookup in
 * the nibble tables (IQ3_XXS: 256 rows, two vpermi2b; IQ3_S: 512, four, in the quarters the
 * id's bits 7 and 8 name), a vpermb a value from code to biased byte. The sign bytes (one per 8 weights = 2 rows)
 * widened a dword to a qword, so qword q holds lanes 8 q .. 8 q + 7's. */
/* iq3*_pk[a][id]: values 2 a, 2 a + 1 of grid row id as 3-bit codes in the low and high nibble (IQ3_XXS: 4, 12, ..,
 * 52, 62 -> v >> 3; IQ3_S: 1, 3, .., 15 -> v >> 1), tab3[S3][code] the value */
static uint8_t iq3xxs_pk[2][256] __attribute__((aligned(64)));
static uint8_t iq3s_pk[2][512] __attribute__((aligned(64)));
static const int tab3[2][8] = {{4, 12, 20, 28, 36, 44, 52, 62}, {1, 3, 5, 7, 9, 11, 13, 15}};
static uint8_t iq3v_map[2][64] __attribute__((aligned(64))); /* [S3][i]: LIMB_BIAS + the value of code i & 7 */
static uint8_t iq3v_sgn[4][64] __attribute__((aligned(64)));
static int32_t iq3v_src[256];
__attribute__((constructor)) static void fill_iq3v(void) {
    for (int a = 0; a < 2; a++) {
        for (int i = 0; i < 256; i++)
            iq3xxs_pk[a][i] = (uint8_t)((grid_iq3xxs[i][2 * a] >> 3) | (grid_iq3xxs[i][2 * a + 1] >> 3) << 4);
        for (int i = 0; i < 512; i++)
            iq3s_pk[a][i] = (uint8_t)((grid_iq3s[i][2 * a] >> 1) | (grid_iq3s[i][2 * a + 1] >> 1) << 4);
    }
    for (int S3 = 0; S3 < 2; S3++)
        for (int i = 0; i < 64; i++) iq3v_map[S3][i] = (uint8_t)(LIMB_BIAS + tab3[S3][i & 7]);
    for (int v = 0; v < 4; v++) {
        for (int p = 0; p < 64; p++) {
            iq3v_sgn[v][p] = (uint8_t)(8 * ((p % 8) / 2) + 4 * (p % 2) + v);
            iq3v_src[64 * v + p] = 4 * p + v;
        }
    }
}
static void xlimbs_iq3(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++) {
        limbs_of(x + 256 * b, iq3v_src, 4, 64, LIMB_MANT, (uint8_t *)(xp + 256 * b));
        limb_bias_sums(4, 64, LIMB_BIAS, (uint8_t *)(xp + 256 * b));
    }
}
#define IQ3_BPB(type) ((type) == T_IQ3_S ? 110 : 98)
/* a block's 4 value rows of biased bytes w[v] and its lanes' scales S */
AI void iq3v_weights(const int type, const uint8_t *blk, __m512i w[4], v16 *Sp) {
    {
        const int S3 = type == T_IQ3_S;
        const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        const __m512i twob = _mm512_set1_epi8(2 * LIMB_BIAS);
        const __m512i ids = _mm512_loadu_si512(blk + 2);
        const __mmask64 m7 = _mm512_movepi8_mask(ids);
        float d1[4]; /* d converted in an xmm and read back as memory (the scales' broadcast loads it) */
        _mm_storeu_ps(d1, _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd32(blk))));
        __asm__("" : "+m"(d1));
        __m256i sbits;
        v16 S;
        __mmask64 part[4];
        if (S3) {
            const __mmask64 m8 = _cvtu64_mask64(rd64(blk + 66));
            part[0] = _knot_mask64(_kor_mask64(m7, m8)), part[1] = _kandn_mask64(m8, m7);
            part[2] = _kandn_mask64(m7, m8), part[3] = _kand_mask64(m7, m8);
            sbits = _mm256_loadu_si256((const __m256i *)(blk + 74));
            S = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(iq3s_scale8d(blk, d1[0])));
        } else {
            part[0] = _knot_mask64(m7), part[1] = m7;
            const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 66));
            sbits = xxs_signs_vbmi(a);
            S = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(xxs_scale8(d1[0], a, 0.5f)));
        }
        const __m512i SB = _mm512_cvtepu32_epi64(sbits);
        *Sp = S;
        const __m512i map = ld64(iq3v_map[S3]);
        _Pragma("GCC unroll 2") for (int a = 0; a < 2; a++) {
            /* values 2 a, 2 a + 1 of every row as 3-bit codes in the two nibbles */
            __m512i B = ids;
            const uint8_t *pk = S3 ? iq3s_pk[a] : iq3xxs_pk[a];
            for (int t = 0; t < (S3 ? 4 : 2); t++)
                B = _mm512_mask2_permutex2var_epi8(ld64(pk + 128 * t), B, part[t], ld64(pk + 128 * t + 64));
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const int v = 2 * a + h;
                const __m512i u = _mm512_permutexvar_epi8(h ? _mm512_srli_epi16(B, 4) : B, map);
                w[v] = _mm512_mask_sub_epi8(u, _mm512_bitshuffle_epi64_mask(SB, ld64(iq3v_sgn[v])), twob, u);
            }
        }
    }
}
/* the dots of a block's 4 value rows (the slot form V = 4, W = 64: IQ3, TQ1_0) against M token rows */
AI void limb4_dots(const __m512i w[4], v16 S, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    __m512i A[LIMB_M][2][3];
    LIMB_ACC_INIT(A, xs, xoff, 4, 64, M)
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) { LIMB_DOTS(A, w[v], v, xs, xoff, 4, 64, M) }
    LIMB_FINISH(A, S, acc, xs, xoff, 4, 64, M)
}
/* RW (1, 2) weight rows rows + i * stride of n against one token row x in that slot form: each x limb row loaded once
 * for the RW rows' products (a 512-bit op reading memory costs more than a load two register ops share: 12 vpdpbusd
 * from memory 9.6 cycles, 6 loads and 12 from registers 7.7 on Sapphire Rapids); out[i * MAX_M] += row i's dot */
#define LIMB4_ROWS_PASS(NAME, WEIGHTS, BPB)                                                                         \
    AI void NAME##_pass(const int type, const uint8_t *rows, int64_t stride, int n, const float *x, float *out,    \
                        const int RW) {                                                                             \
        v16 acc[2];                                                                                                 \
        for (int i = 0; i < RW; i++) acc[i] = v16_zero();                                                           \
        for (int b = 0; b < n / 256; b++) {                                                                         \
            const uint8_t *slot = (const uint8_t *)(x + 256 * (int64_t)b);                                          \
            __m512i w[2][4], A[2][2][3];                                                                            \
            v16 S[2];                                                                                               \
            for (int i = 0; i < RW; i++) {                                                                          \
                const uint8_t *blk = rows + i * stride + BPB(type) * (int64_t)b;                                    \
                PF_BLOCK(blk, BPB(type));                                                                           \
                WEIGHTS(type, blk, w[i], &S[i]);                                                                    \
            }                                                                                                       \
            for (int l = 0; l < 3; l++) {                                                                           \
                const __m512i c = limb_C(slot, 4, 64, l);                                                           \
                for (int i = 0; i < RW; i++) A[i][0][l] = c, A[i][1][l] = _mm512_setzero_si512();                   \
            }                                                                                                       \
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)                                                     \
                for (int l = 0; l < 3; l++) {                                                                       \
                    const __m512i xl = limb_row(slot, 4, 64, l, v);                                                 \
                    for (int i = 0; i < RW; i++) A[i][v % 2][l] = _mm512_dpbusd_epi32(A[i][v % 2][l], w[i][v], xl); \
                }                                                                                                   \
            const v16 E = limb_E(slot, 4, 64);                                                                      \
            for (int i = 0; i < RW; i++) {                                                                          \
                v16 F_[3];                                                                                          \
                for (int l = 0; l < 3; l++) F_[l] = _mm512_cvtepi32_ps(_mm512_add_epi32(A[i][0][l], A[i][1][l]));  \
                const v16 t_ = v16_fma(F_[2], v16_set1(65536.0f), v16_fma(F_[1], v16_set1(256.0f), F_[0]));        \
                acc[i] = v16_fma(S[i], v16_mul(E, t_), acc[i]);                                                     \
            }                                                                                                       \
        }                                                                                                           \
        for (int i = 0; i < RW; i++) out[i * MAX_M] += v16_hsum(acc[i]);                                            \
    }                                                                                                               \
    static void NAME(const uint8_t *rows0, int64_t stride, int nrows, int n, const float *x, const float *xsum,    \
                     float *out, const uint8_t *pf_end) {                                                           \
        (void)xsum, (void)pf_end;                                                                                   \
        int i = 0;                                                                                                  \
        for (; i + 2 <= nrows; i += 2) NAME##_pass(LIMB4_TYPE, rows0 + i * stride, stride, n, x, out + i * MAX_M, 2); \
        if (i < nrows) NAME##_pass(LIMB4_TYPE, rows0 + i * stride, stride, n, x, out + i * MAX_M, 1);              \
    }
AI void iq3v_block(const int type, const uint8_t *blk, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    __m512i w[4];
    v16 S;
    iq3v_weights(type, blk, w, &S);
    limb4_dots(w, S, xs, xoff, acc, M);
}
LIMB_BLOCKS_PASS(pass_iq3v, iq3v_block, IQ3_BPB)
LIMB_DOTS_FN(iq3_xxsv, pass_iq3v, T_IQ3_XXS)
LIMB_DOTS_FN(iq3_sv, pass_iq3v, T_IQ3_S)
#define LIMB4_TYPE T_IQ3_XXS
LIMB4_ROWS_PASS(rows1_iq3_xxsv, iq3v_weights, IQ3_BPB)
#undef LIMB4_TYPE
#define LIMB4_TYPE T_IQ3_S
LIMB4_ROWS_PASS(rows1_iq3_sv, iq3v_weights, IQ3_BPB)
#undef LIMB4_TYPE


/* ---- TQ1_0 per block: expert_pool_few.h's four sources Z of 64 (byte, power) pairs (tq1x_src: 128-bit lane L of Z
 * one power of 16 code bytes), each digit a byte u in 0..2 (value u - 1: LIMB_BIAS 1) from 16-bit multiplies with no
 * shift: the even bytes' digit ((v 3^k mod 256) 3) >> 8 in the low byte of mulhi(v 3^k << 8, 3) (the high byte's
 * product overflows out), the odd bytes' in the high byte of mulhi((v & 0xFF00) 3^k, 3 << 8) = the 16-bit
 * (t 3) for t = v 3^k mod 256, merged by one ternary op; then IQ3's slot form (V = 4 value rows Z, W = 64) and three
 * vpdpbusd a 64 weights and row, one scale d a block. Where pass_tq1x spent a permute, an FMA, a multiply and 3/4 of
 * a shift a 16 weights and row. */
static int32_t tq1v_src[256];
__attribute__((constructor)) static void fill_tq1v(void) {
    for (int Z = 0; Z < 4; Z++)
        for (int p = 0; p < 64; p++) {
            const int L = p / 16, bl = p % 16;
            int src, k; /* the code byte (0..31 qs, 32..47 qs, 48..51 qh) and the power of lane L of source Z */
            if (Z < 2) src = 16 * (L % 2) + bl, k = 2 * Z + L / 2;
            else if (Z == 2) src = L < 2 ? 16 * L + bl : 32 + bl, k = L < 2 ? 4 : L - 2;
            else src = L < 3 ? 32 + bl : 48 + bl % 4, k = L < 3 ? 2 + L : bl / 4;
            tq1v_src[64 * Z + p] = src < 32 ? 32 * k + src : src < 48 ? 160 + 16 * k + (src - 32) : 240 + 4 * k + (src - 48);
        }
}
static void xlimbs_tq1(const float *x, int n, float *xp) {
    for (int b = 0; b < n / 256; b++) {
        limbs_of(x + 256 * b, tq1v_src, 4, 64, LIMB_MANT, (uint8_t *)(xp + 256 * b));
        limb_bias_sums(4, 64, 1, (uint8_t *)(xp + 256 * b));
    }
}
#define TQ1_BPB(type) 54
AI void tq1v_weights(const int type, const uint8_t *blk, __m512i w[4], v16 *Sp) {
    (void)type;
    const __m256i lo32 = _mm256_loadu_si256((const __m256i *)blk);
    const __m128i mid16 = ld16b(blk + 32);
    __m512i src[4];
    src[0] = src[1] = _mm512_broadcast_i64x4(lo32);
    src[2] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi256_si512(lo32), mid16, 2), mid16, 3);
    src[3] = _mm512_inserti32x4(_mm512_broadcast_i32x4(mid16), _mm_set1_epi32((int)rd32(blk + 48)), 3);
    const __m512i three = _mm512_set1_epi16(3), three8 = _mm512_set1_epi16(3 << 8), hib = _mm512_set1_epi16((short)0xFF00);
    _Pragma("GCC unroll 4") for (int Z = 0; Z < 4; Z++) {
        const __m512i p = tq1x_pow(Z), p1 = _mm512_srli_epi16(p, 8); /* 3^k << 8, 3^k: constants */
        const __m512i e = _mm512_mulhi_epu16(_mm512_mullo_epi16(src[Z], p), three);
        const __m512i o = _mm512_mulhi_epu16(_mm512_mullo_epi16(_mm512_and_si512(src[Z], hib), p1), three8);
        w[Z] = _mm512_ternarylogic_epi32(o, hib, e, 0xEA); /* o & hib | e */
    }
    *Sp = v16_set1(rdh(blk + 52));
}
AI void tq1v_block(const int type, const uint8_t *blk, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    __m512i w[4];
    v16 S;
    tq1v_weights(type, blk, w, &S);
    limb4_dots(w, S, xs, xoff, acc, M);
}
#define LIMB4_TYPE T_TQ1_0
LIMB4_ROWS_PASS(rows1_tq1_0v, tq1v_weights, TQ1_BPB)
#undef LIMB4_TYPE
LIMB_BLOCKS_PASS(pass_tq1v, tq1v_block, TQ1_BPB)
LIMB_DOTS_FN(tq1_0v, pass_tq1v, T_TQ1_0)

/* ---- IQ1_S, IQ1_M per block: expert_pool_few.h's grid rows gathered (iq1_grid4: 8 nibbles a row, code + delta
 * sign), the delta folded into the byte: u = IQ1_BIAS + 8 (grid + delta) (exact: 8 (g +- 1/8) is an odd integer in
 * -9 .. 9), the scale dl / 8 (E holds the 1/8). Half h = 16 rows; lane r of value row v = 2 h + o (o: the odd
 * weights) = the 4 weights 2 i + o of row r, so a lane is one row (one dl: pass_iq1x's S[h] lane r). The weights
 * are small enough that a lane's limb sums combine in int32 ((L2 << 8 + L1) << 8 + L0 < 2^30): one accumulator a
 * half and token row, started at C_h (-IQ1_BIAS times the lane's mantissa sum over its 8 elements of half h); slot
 * (1024 bytes): X at 64 (4 l + v), E at 768, C_h at 832 + 64 h. */
#define IQ1_BIAS 16
static int32_t iq1v_src[256];
static uint8_t iq1v_map[64] __attribute__((aligned(64))); /* [nibble & 15]: IQ1_BIAS + 8 (grid + delta) */
__attribute__((constructor)) static void fill_iq1v(void) {
    for (int v = 0; v < 4; v++)
        for (int p = 0; p < 64; p++) iq1v_src[64 * v + p] = 128 * (v / 2) + 8 * (p / 4) + 2 * (p % 4) + v % 2;
    for (int i = 0; i < 64; i++) iq1v_map[i] = (uint8_t)(IQ1_BIAS + (int)(8.0f * tab_iq1x[i & 15]));
}
/* x in the row-lane slots (IQ1_S, IQ1_M; IQ2_XS, IQ2_S below): mant the mantissa bits (the lane sums' int32 bound),
 * bias the weights', E times escale (IQ1: the weights' 8) */
static void xlimbs_rows(const float *x, int n, float *xp, int mant, int bias, float escale) {
    for (int b = 0; b < n / 256; b++) {
        uint8_t *slot = (uint8_t *)(xp + 256 * b);
        limbs_of(x + 256 * b, iq1v_src, 4, 64, mant, slot);
        float *E = (float *)(slot + 768);
        _mm512_storeu_ps(E, _mm512_mul_ps(_mm512_loadu_ps(E), _mm512_set1_ps(escale)));
        for (int h = 0; h < 2; h++) {
            __m512i c = _mm512_setzero_si512();
            for (int l = 2; l >= 0; l--) {
                if (l < 2) c = _mm512_slli_epi32(c, 8);
                for (int o = 0; o < 2; o++)
                    c = _mm512_dpbusd_epi32(c, _mm512_set1_epi8((char)bias), ld64(slot + 64 * (4 * l + 2 * h + o)));
            }
            _mm512_storeu_si512(slot + 832 + 64 * h, _mm512_sub_epi32(_mm512_setzero_si512(), c));
        }
    }
}
static void xlimbs_iq1(const float *x, int n, float *xp) { xlimbs_rows(x, n, xp, LIMB_MANT, IQ1_BIAS, 0.125f); }
/* half h of a block in the row-lane form: q's 16 dwords the rows' 8 nibbles, map from nibble to biased byte; the even
 * and the odd weights' bytes, three limbs by Horner in one int32 lane sum, C_h, then acc += S (E t) */
AI void rows_half_w(const __m512i *w, int h, v16 S, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    for (int r = 0; r < M; r++) {
        const uint8_t *slot = (const uint8_t *)(xs[r] + xoff);
        __m512i a = _mm512_setzero_si512();
        for (int l = 2; l >= 0; l--) {
            if (l < 2) a = _mm512_slli_epi32(a, 8);
            for (int o = 0; o < 2; o++) a = _mm512_dpbusd_epi32(a, w[o], ld64(slot + 64 * (4 * l + 2 * h + o)));
        }
        a = _mm512_add_epi32(a, _mm512_loadu_si512(slot + 832 + 64 * h));
        acc[r] = v16_fma(S, v16_mul(_mm512_loadu_ps((const float *)(slot + 768)), _mm512_cvtepi32_ps(a)), acc[r]);
    }
}
AI void rows_half(__m512i q, __m512i map, int h, v16 S, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    const __m512i w[2] = {_mm512_permutexvar_epi8(q, map), _mm512_permutexvar_epi8(_mm512_srli_epi32(q, 4), map)};
    rows_half_w(w, h, S, xs, xoff, acc, M);
}
#define IQ1_BPB(type) ((type) == T_IQ1_M ? 56 : 50)
AI void iq1v_block(const int type, const uint8_t *blk, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    __m512i q[2];
    v16 S[2];
    iq1_rows(type == T_IQ1_M, blk, q, S);
    for (int h = 0; h < 2; h++) rows_half(q[h], ld64(iq1v_map), h, S[h], xs, xoff, acc, M);
}
LIMB_BLOCKS_PASS(pass_iq1v, iq1v_block, IQ1_BPB)
LIMB_DOTS_FN(iq1_sv, pass_iq1v, T_IQ1_S)
LIMB_DOTS_FN(iq1_mv, pass_iq1v, T_IQ1_M)

/* ---- IQ2_XS, IQ2_S per block in the row-lane form of IQ1 (xlimbs_rows: lane r of half h = row 16 h + r, one scale
 * per 2 rows, so no lane of a 4-row form would hold one scale): the rows gathered as 8 nibbles (code 0, 1, 2 of 8,
 * 25, 43 in bits 0, 1) from iq2xs_grid4 / iq2s_grid4, u = LIMB_BIAS + the value by one vpermb, then 2 BIAS - u where
 * the value's sign bit is set (rows_half_signs: a row's sign byte in its dword lane, IQ2_XS's by one 128-entry lookup
 * of its 7-bit id in ksigns_iq2xs, IQ2_S's read as is; until 2026-12-05 a second gather a half spread them into the
 * nibbles: 8 cycles a gather on the dev box's Sapphire Rapids, where the lookup is 2 and the masks 2 more, one core
 * 180 -> 161 ns a 2560-row for IQ2_XS, 177 -> 164 for IQ2_S). |u| <= 107: a lane's Horner sum fits int32 with a
 * 21-bit mantissa (8 u 2^21 < 2^31), x then held to 2^-22 of its lane's largest value. */
#define IQ2G_MANT 21
static uint32_t iq2xs_grid4[512], iq2s_grid4[1024];
static uint8_t iq2g_map[64] __attribute__((aligned(64)));
static uint8_t iq2g_sgn[2][64] __attribute__((aligned(64))); /* [o][4 r + b]: the bit of value 2 b + o's sign in qword r / 2 */
__attribute__((constructor)) static void fill_iq2g(void) {
    static const int val[4] = {8, 25, 43, 0};
    for (int id = 0; id < 1024; id++) {
        uint32_t a = 0, c = 0;
        for (int k = 0; k < 8; k++) {
            if (id < 512) a |= (uint32_t)iq2_code(grid_iq2xs[id][k]) << (4 * k);
            c |= (uint32_t)iq2_code(grid_iq2s[id][k]) << (4 * k);
        }
        if (id < 512) iq2xs_grid4[id] = a;
        iq2s_grid4[id] = c;
    }
    for (int i = 0; i < 64; i++) {
        iq2g_map[i] = (uint8_t)(LIMB_BIAS + val[i & 3]);
        for (int o = 0; o < 2; o++) iq2g_sgn[o][i] = (uint8_t)(32 * ((i / 4) % 2) + 2 * (i % 4) + o);
    }
}
static void xlimbs_iq2g(const float *x, int n, float *xp) { xlimbs_rows(x, n, xp, IQ2G_MANT, LIMB_BIAS, 1.0f); }
AI __m512i gather4(const uint32_t *t, __m512i idx) { return _mm512_i32gather_epi32(idx, (const int *)t, 4); }
/* rows_half with the signs applied to the mapped bytes (u -> 2 BIAS - u where sg's bit of the value is set) */
AI void rows_half_signs(__m512i q, __m512i map, __m512i sg, int h, v16 S, const float *const *xs, int64_t xoff,
                        v16 *acc, const int M) {
    const __m512i twob = _mm512_set1_epi8(2 * LIMB_BIAS);
    __m512i w[2] = {_mm512_permutexvar_epi8(q, map), _mm512_permutexvar_epi8(_mm512_srli_epi32(q, 4), map)};
    for (int o = 0; o < 2; o++) w[o] = _mm512_mask_sub_epi8(w[o], _mm512_bitshuffle_epi64_mask(sg, ld64(iq2g_sgn[o])), twob, w[o]);
    rows_half_w(w, h, S, xs, xoff, acc, M);
}
#define IQ2G_BPB(type) ((type) == T_IQ2_S ? 82 : 74)
AI void iq2g_block(const int type, const uint8_t *blk, const float *const *xs, int64_t xoff, v16 *acc, const int M) {
    {
        const int S2 = type == T_IQ2_S, SC = S2 ? 74 : 66;
        const __m512i map = ld64(iq2g_map);
        const __m512i at4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        const v16 d = v16_set1(rdh(blk));
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            /* row i of the half: its byte of 4-row data at 4 h + i / 4 */
            const __m512i by4 = _mm512_add_epi32(at4, _mm512_set1_epi32(4 * h));
            const __m512i scb = _mm512_permutexvar_epi32(by4, _mm512_cvtepu8_epi32(ld8(blk + SC)));
            const __m512i sc = _mm512_and_si512(
                _mm512_srlv_epi32(scb, _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4)),
                _mm512_set1_epi32(15));
            /* gguf's d * (0.5 + s) * 0.25 */
            const v16 S = v16_mul(v16_mul(d, v16_add(v16_set1(0.5f), _mm512_cvtepi32_ps(sc))), v16_set1(0.25f));
            __m512i q, sg;
            if (S2) {
                const __m512i qhb = _mm512_permutexvar_epi32(by4, _mm512_cvtepu8_epi32(ld8(blk + 66)));
                const __m512i hi = _mm512_and_si512(
                    _mm512_srlv_epi32(qhb, _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6)),
                    _mm512_set1_epi32(3));
                const __m512i ids = _mm512_or_si512(_mm512_cvtepu8_epi32(ld16b(blk + 2 + 16 * h)), _mm512_slli_epi32(hi, 8));
                q = gather4(iq2s_grid4, ids);
                sg = _mm512_cvtepu8_epi32(ld16b(blk + 34 + 16 * h));
            } else {
                const __m512i qw = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(blk + 2 + 32 * h)));
                q = gather4(iq2xs_grid4, _mm512_and_si512(qw, _mm512_set1_epi32(511)));
                sg = lut128(ksigns_iq2xs, _mm512_srli_epi32(qw, 9)); /* bytes 1..3 id 0: ksigns 0 */
            }
            /* the signs as masks of the mapped bytes: value 2 b + o of row r is bit 2 b + o of its sign byte, byte
             * 4 r of sg, so bit 32 (r % 2) + 2 b + o of qword r / 2 */
            rows_half_signs(q, map, sg, h, S, xs, xoff, acc, M);
        }
    }
}
LIMB_BLOCKS_PASS(pass_iq2g, iq2g_block, IQ2G_BPB)
LIMB_DOTS_FN(iq2_xsv, pass_iq2g, T_IQ2_XS)
LIMB_DOTS_FN(iq2_sv, pass_iq2g, T_IQ2_S)

#endif /* STRATA_EXPERT_POOL_LIMBS_H */
