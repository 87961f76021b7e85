/* expert_pool_dispatch.h: which fused kernel serves a type (kernels/expert_pool.c's SIMD builds): the table's
 * check against the generated type table, the min term's group sums, fused_dots (the weight-table kernels of
 * expert_pool_groups.h) and the lane-order kernels' choice, x permutation and row order (fused_dots_xperm,
 * fused_xperm, xperm_of, xperm_pos, fused_lane_rows) over expert_pool_groups.h's, expert_pool_few.h's and
 * expert_pool_limbs.h's kernels (fused_dots_limbs, xlimbs_of: x rows as int8 limbs). Included by expert_pool_decode.h.
 */
#ifndef STRATA_EXPERT_POOL_DISPATCH_H
#define STRATA_EXPERT_POOL_DISPATCH_H
#include "expert_pool_groups.h"
#ifdef STRATA_AVX2

#ifdef STRATA_PERM
#include "expert_pool_few.h" /* TQ2_0, TQ1_0, IQ1_S, IQ1_M, NVFP4 in lane order */
#endif
#ifdef STRATA_VBMI
#include "expert_pool_limbs.h" /* the grid i-quants' x rows at few token rows: integer products */
#endif

/* the table's group counts and block bytes restate the generated type table (model/quant_tables.py): hold them to
 * it, so a changed type cannot silently decode with the wrong stride (F32/F16/BF16 "blocks" are 16 elements here) */
#define FUSED_CHECK(ID, DEC, GPB, BPB, PREP, MINS)                                                                   \
    _Static_assert((16 * (GPB)) % ID##_ELEMS == 0 && 16 * (GPB) * ID##_BYTES == (BPB) * ID##_ELEMS,               \
                   #ID ": FUSED_TYPES disagrees with the generated type table");
FUSED_TYPES(FUSED_CHECK)
#undef FUSED_CHECK

/* xsum[r][g] = sum of x[r][16 g .. 16 g + 15] (the min term's sums; any order: it is not part of the weights) */
static void group_sums(const float *x, int n, float *xsum) {
    for (int g = 0; g < n / 16; g++) {
        const float *p = x + 16 * g;
        float s = 0.0f;
        for (int k = 0; k < 16; k++) s += p[k];
        xsum[g] = s;
    }
}

typedef void (*dots_fn)(const uint8_t *row, int n, const float *const *xs, const float *const *xsum, int m,
                        float *out, const uint8_t *pf_end);
/* the fused kernel of a type, or NULL; rows of n elements need n % (16 * groups per block) == 0 */
static dots_fn fused_dots(int type, int n) {
#define FUSED_CASE(ID, DEC, GPB, BPB, PREP, MINS) case ID: return n % (16 * GPB) == 0 ? dots_##DEC : NULL;
    switch (type) { FUSED_TYPES(FUSED_CASE) default: return NULL; }
#undef FUSED_CASE
}
/* the lane-order kernel of a type for one token row over several weight rows at once (out[i * MAX_M] += row i's
 * dot), or NULL: where fused_dots_xperm's row-at-a-time passes lose to it at one token row. Q4_0 only for short
 * rows (the down rows, 640): on the dev box (1 thread, pool_bench) its gate/up rows of 2560 read 4 at a time ran
 * slower from memory (8-10 -> 4-6 GB/s, either prefetch span) though 1-8 % faster L2-hot, its down rows faster
 * (+15-20 % L2-hot); Q2_K's 2 rows a pass faster at gate/up (+10-30 %). */
#define ROWS1_Q4_0_MAX 1024 /* the longest Q4_0 row taken 4 at a time */
typedef void (*rows1_fn)(const uint8_t *rows0, int64_t stride, int nrows, int n, const float *x, const float *xsum,
                         float *out, const uint8_t *pf_end);
static rows1_fn fused_rows1_xperm(int type, int n) {
#ifdef STRATA_PERM
    if (type == T_Q4_0 && n % 128 == 0 && n <= ROWS1_Q4_0_MAX) return rows1_q4_0x;
    if (type == T_Q2_K && n % 256 == 0) return rows1_q2_kx;
#endif
    (void)type, (void)n;
    return NULL;
}
/* whether the type's kernel for x rows (gate/up) reads x in its lane order (xperm_of), and that kernel */
static dots_fn fused_dots_xperm(int type, int n) {
#ifdef STRATA_PERM
    if (type == T_Q2_K && n % 256 == 0) return dots_q2_kx;
    if (type == T_Q3_K && n % 256 == 0) return dots_q3_kx;
    if (type == T_Q4_K && n % 256 == 0) return dots_q4_kx;
    if (type == T_Q5_K && n % 256 == 0) return dots_q5_kx;
    if (type == T_Q6_K && n % 256 == 0) return dots_q6_kx;
    if (type == T_IQ4_XS && n % 256 == 0) return dots_iq4_xsx;
    if (type == T_TQ2_0 && n % 256 == 0) return dots_tq2_0x;
    if (type == T_TQ1_0 && n % 256 == 0) return dots_tq1_0x;
    if (type == T_NVFP4 && n % 128 == 0) return dots_nvfp4x;
    if (type == T_IQ1_S && n % 256 == 0) return dots_iq1_sx;
    if (type == T_IQ1_M && n % 256 == 0) return dots_iq1_mx;
    if (n % 128 == 0) {
        if (type == T_Q4_0) return dots_q4_0x;
        if (type == T_IQ4_NL) return dots_iq4_nlx;
        if (type == T_MXFP4) return dots_mxfp4x;
        if (type == T_Q5_0) return dots_q5_0x;
        if (type == T_Q4_1) return dots_q4_1x;
        if (type == T_Q5_1) return dots_q5_1x;
    }
#endif
    (void)type, (void)n;
    return NULL;
}
/* the limb kernel of a type for one token row over two weight rows at once (out[i * MAX_M] += row i's dot), or NULL:
 * each x limb row loaded once for both rows' products. Dev box (Sapphire Rapids), one core, ns a 2560-row at 1 row
 * against one weight row a pass: TQ1_0 98-119 / 105-127, IQ3_XXS 132-145 / 137-151, IQ3_S 139-164 / 151-166 */
static rows1_fn fused_rows1_limbs(int type, int n) {
#ifdef STRATA_VBMI
    if (n % 256 == 0) {
        if (type == T_TQ1_0) return rows1_tq1_0v;
        if (type == T_IQ3_XXS) return rows1_iq3_xxsv;
        if (type == T_IQ3_S) return rows1_iq3_sv;
    }
#endif
    (void)type, (void)n;
    return NULL;
}
/* the integer-product kernel of a type's x rows (expert_pool_limbs.h: x as limbs, xlimbs_of), or NULL; h rows (written
 * element by element) keep fused_dots_xperm's. TQ1_0's serves every row count (fused_lane_rows): dev box (Sapphire
 * Rapids) one core against pass_tq1x, ns a 2560-row at 1 / 2 / 4 / 8 rows 101 / 202 / 309 / 643 against 120 / 210 /
 * 323 / 636 */
static dots_fn fused_dots_limbs(int type, int n) {
#ifdef STRATA_VBMI
    if (n % 256 == 0) {
        if (type == T_IQ2_XXS) return dots_iq2_xxsv;
        if (type == T_IQ3_XXS) return dots_iq3_xxsv;
        if (type == T_IQ3_S) return dots_iq3_sv;
        if (type == T_IQ1_S) return dots_iq1_sv;
        if (type == T_IQ1_M) return dots_iq1_mv;
        if (type == T_IQ2_XS) return dots_iq2_xsv;
        if (type == T_IQ2_S) return dots_iq2_sv;
        if (type == T_TQ1_0) return dots_tq1_0v;
    }
#endif
    (void)type, (void)n;
    return NULL;
}
/* x row (n floats) as the limb slots of the type's fused_dots_limbs kernel */
static void xlimbs_of(int type, const float *x, int n, float *xp) {
#ifdef STRATA_VBMI
    if (type == T_IQ2_XXS) xlimbs_iq2(x, n, xp);
    else if (type == T_IQ1_S || type == T_IQ1_M) xlimbs_iq1(x, n, xp);
    else if (type == T_IQ2_XS || type == T_IQ2_S) xlimbs_iq2g(x, n, xp);
    else if (type == T_TQ1_0) xlimbs_tq1(x, n, xp);
    else xlimbs_iq3(x, n, xp);
#else
    (void)type, (void)x, (void)n, (void)xp;
#endif
}
/* the most token rows on an expert for which its gate/up rows take the type's lane-order kernel (pool_run): where
 * the lane kernel applies a scale per row once per block or sub-block of 8-16 groups (expert_pool_few.h) it stays
 * ahead at 4 and 8 rows (llvm-mca, icelake-server, per 256 weights at M = 1 / 4 / 8: TQ2_0 23 / 59 / 88 cycles
 * against the weight-table kernel's 88 / 83 / 103, TQ1_0 34 / 66 / 104 against 88 / 89 / 108, MXFP4 30 / 58 / 96
 * against 49 / 81 / 117; the dev box's Zen 4 ties them: pool_bench --ab at 4 rows TQ2_0 -1 %, TQ1_0 -3 %, MXFP4
 * +3 %, NVFP4 +5 %), NVFP4 up to 7 rows (at 8: 110 against 91); the others LANE_MAX_ROWS (expert_pool.c) */
static int fused_lane_rows(int type) {
#ifdef STRATA_PERM
    if (type == T_TQ2_0 || type == T_TQ1_0 || type == T_MXFP4) return 1 << 30;
    if (type == T_NVFP4) return 7;
#endif
    (void)type;
    return LANE_MAX_ROWS;
}
/* the lane order of a type's kernel over rows of n (fused_dots_xperm), 0 if it has none; 1..7 name the orders */
static int fused_xperm(int type, int n) {
    if (!fused_dots_xperm(type, n)) return 0;
    switch (type) {
    case T_Q2_K: case T_Q3_K: case T_TQ2_0: return 1;
    case T_Q4_K: case T_Q5_K: return 3;
    case T_Q6_K: return 4;
    case T_TQ1_0: return 5;
    case T_IQ1_S: case T_IQ1_M: return 6;
    case T_NVFP4: return 7;
    default: return 2;
    }
}
/* x (n floats) in the lane order of fused_xperm(type, n) */
static void xperm_of(int type, const float *x, int n, float *xp) {
#ifdef STRATA_PERM
    if (fused_xperm(type, n) == 1) xperm_q2_k(x, n, xp);
    else if (fused_xperm(type, n) == 2) xperm_q4x(x, n, xp);
    else if (fused_xperm(type, n) == 3) xperm_q4kx(x, n, xp);
    else if (fused_xperm(type, n) == 4) xperm_q6kx(x, n, xp);
    else if (fused_xperm(type, n) == 5) xperm_tq1x(x, n, xp);
    else if (fused_xperm(type, n) == 6) xperm_iq1x(x, n, xp);
    else if (fused_xperm(type, n) == 7) xperm_nvfp4x(x, n, xp);
#else
    (void)type, (void)x, (void)n, (void)xp;
#endif
}
/* whether the type's kernel over rows of n prefetches by lines (PF_LINES: Q4_0 in lane order) */
static int pf_lines_of(int type, int n) { return type == T_Q4_0 && fused_dots_xperm(type, n); }
/* where element f of a row of n sits in that order */
static int xperm_pos(int type, int n, int f) {
#ifdef STRATA_PERM
    if (fused_xperm(type, n) == 2) return 128 * (f / 128) + q4x_pos(f % 128);
    if (fused_xperm(type, n) == 3) { /* Q4_K: element e = 32 (2 P + n) + l, P = 2 z + i / 8, l = (4 i + k) % 32 */
        const int e = f % 256, j32 = e / 32, l = e % 32, nn = j32 % 2, P = j32 / 2, z = P / 2;
        const int i = 8 * (P % 2) + l / 4, k = l % 4;
        return 256 * (f / 256) + 16 * (4 * (2 * z + nn) + k) + i;
    }
    if (fused_xperm(type, n) == 4) { /* Q6_K: element e = 128 z + 32 (c + 2 n) + 4 (i % 8) + k, c = i / 8 */
        const int e = f % 256, z = e / 128, j32 = (e % 128) / 32, l = e % 32;
        return 256 * (f / 256) + 16 * (8 * z + 4 * (j32 / 2) + l % 4) + 8 * (j32 % 2) + l / 4;
    }
    if (fused_xperm(type, n) == 5) return 256 * (f / 256) + tq1x_pos_of[f % 256];
    if (fused_xperm(type, n) == 7) { /* nvfp4x_src's inverse: e = 64 B + 16 s + 8 nib + l, l = 4 (i % 2) + t */
        const int e = f % 128, B = e / 64, sub = (e % 64) / 16, nb = (e % 16) / 8, l = e % 8;
        return 128 * (f / 128) + 16 * (2 * (l % 4) + nb) + 8 * B + 2 * sub + l / 4;
    }
    if (fused_xperm(type, n) == 6) return 128 * (f / 128) + 16 * (f % 8) + (f % 128) / 8; /* iq1x_src's inverse */
    if (fused_xperm(type, n) == 1) {
        const int e = f % 256, s = (e % 128) / 32, l = e % 32, j = 32 * (e / 128) + l; /* byte j = 4 i + k */
        return 256 * (f / 256) + 16 * (4 * s + j % 4) + j / 4;
    }
#endif
    (void)type, (void)n;
    return f;
}
/* whether the type's fused kernel reads the x group sums (Q4_1 / Q5_1: their lane-order kernels' m term; the
 * weight-table kernels that serve them elsewhere ignore the sums) */
#ifdef STRATA_PERM
#define LANE_MN 1
#else
#define LANE_MN 0
#endif
static int fused_needs_sums(int type) {
#define FUSED_CASE(ID, DEC, GPB, BPB, PREP, MINS) case ID: return (MINS && MIN_TERM) || (LANE_MN && (ID == T_Q4_1 || ID == T_Q5_1));
    switch (type) { FUSED_TYPES(FUSED_CASE) default: return 0; }
#undef FUSED_CASE
}
/* one row dequantized through the same decoders (the tests hold them to gguf bit for bit); 0 if not served */
static int fused_dequant_row(int type, const uint8_t *src, int64_t n, float *y) {
#define FUSED_CASE(ID, DEC, GPB, BPB, PREP, MINS) \
    case ID: if (n % (16 * GPB)) return 0; rowdeq_##DEC(src, n, y); return 1;
    switch (type) { FUSED_TYPES(FUSED_CASE) default: return 0; }
#undef FUSED_CASE
}

#endif /* STRATA_AVX2 */
#endif /* STRATA_EXPERT_POOL_DISPATCH_H */
