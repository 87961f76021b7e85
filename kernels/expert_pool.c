/* Host kernels of the CPU expert pool (strata_cli/tiers/pool.py, native.py): routed experts straight from the
 * memory-mapped GGUF blocks, the same call with a per-thread profile (strata_pool_diag, for the benchmark), the
 * doorbell word waits, the PCIe share's gather into its pinned staging (strata_gather), and a plain parallel read for
 * the benchmark.
 *
 * Built at first use: cc -O3 -fopenmp -ffp-contract=off [-mavx2 -mfma -mf16c] -shared. Weights are dequantized
 * exactly as gguf.quants.dequantize does (same float32 operations, no contraction) and multiplied in float32 with
 * explicit FMAs; without AVX2 (or with -DSTRATA_NO_SIMD, which the tests build too) the same arithmetic runs scalar.
 *
 * Shapes (one layer, G experts, N entries = routed picks, H = hidden, F = expert ff):
 *   gate, up [F rows of H] and down [H rows of F] of each expert, rows `*_row` bytes apart, at gate[g] / up[g] / down[g]
 *   x [rows, H] f32;  y [rows*k, H] f32 (entry i writes row dst[i]);  h scratch [N, F] f32
 *   group g = entries start[g] .. start[g+1]-1, each with its token row tok[i] and output row dst[i]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, sched_yield under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(STRATA_NO_SIMD)
#include <immintrin.h>
#define STRATA_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define STRATA_AVX512 1 /* the fused kernels' 16 lanes in one zmm register */
#endif
#endif

#define MAX_M 16         /* entries (token rows) one work item serves per pass over its weight rows */
#define ROWS_GATE_UP 16  /* gate/up rows per work item (one 16-element group of h: the h sums rely on it) */
#define ROWS_DOWN 64     /* down rows per work item */
/* Gate/up rows of an expert take the lane-order kernels (expert_pool_groups.h) when it has at most this many rows:
 * at 1 and 2 rows they read the weights at least as fast as the weight-table kernels (dev box, 1 thread, L3-hot:
 * Q2_K 5.4 -> 6.8 GB/s at 1 row, 3.9 -> 4.0 at 2), at 4 slower (Q2_K 2.5 -> 2.1, Q4_0 4.2 -> 3.6: they pay a scale
 * FMA per row every 4-8 groups where a table multiply is shared by the rows). Down rows (640 at the released
 * geometry, 5 lane-order steps) measured faster in lane order at 1, 2 and 4 rows (Q4_0 3.5 -> 4.8 at 4) and always
 * take it. */
#define LANE_MAX_ROWS 2
/* the forms of a permuted x row (needs_xperm): the lane order, the limb slots */
#define X_LANES 1
#define X_LIMBS 2
#ifndef X_CHUNK_FLOATS
#define X_CHUNK_FLOATS 4096 /* floats of x (all rows of a pass together) one column chunk keeps in L1 */
#endif

/* How the team shares the work items: both item loops schedule(dynamic, chunk), POOL_CHUNK on large calls. Items are
 * numbered expert by expert, rows in order, so a take of 4 items is one contiguous run of 64 gate rows and 64 up rows
 * (4 x 23 KB each in Q4_0 at H = 2560), or 256 down rows: a thread starts a new run (the hardware prefetcher ramps up
 * again, a down item first fetches its expert's h row from the cores that wrote it) a quarter as often as at 1 item.
 * Measured on the device (16 cores, pool_bench --sweep --ab, 2026-12-02): 4 items beat 1 for every type and page kind
 * (Q2_K+Q4_0 47.1 / 46.7 / 43.4 GB/s against 42.9 / 44.0 / 41.3), one static share per thread and guided lost
 * (balance at the barrier), so neither is a build switch.
 * Small calls take smaller chunks (pool_chunk): inside the engine a layer's call is small (24 GiB VRAM cache, T = 1:
 * ~4 missed experts, 8.6 MB, 160 gate/up items = 40 takes of 4 for 16 threads, so 8 threads take 3 and the barrier
 * waits for them, ~15-30 % of the phase idle); the device measured the pool at 42.6 GB/s on these calls against
 * ~60 GB/s on large calls (Q2_K gate/up + Q4_0 down; 10-expert calls of ~20 MB below it too). Each call is on the
 * window's critical path (the GPU waits for it, 48 calls a window). POOL_CHUNK and POOL_MIN_TAKES are build switches
 * only for bench/pool_bench.py --ab (POOL_MIN_TAKES=0: every call at POOL_CHUNK, the schedule before this). */
#ifndef POOL_CHUNK
#define POOL_CHUNK 4
#endif
/* The takes every thread of the team gets at least, where the chunk can shrink to give them: the loop's chunk is the
 * largest c <= POOL_CHUNK with items >= team * c * POOL_MIN_TAKES, at least 1. At 16 threads and 40 items per
 * expert: 4 experts -> chunk 2 (5 takes each, none left over), 10 experts (the sweep's calls) -> chunk 4 as before,
 * 6 -> 3, 1 -> 1. Why 4 (a model, for the device to confirm): a take costs its c items + o, o the new run's ramp-up,
 * and the phase lasts the busiest thread's takes; the sweep's 4 against 1 at 10 experts (7 x (4 + o) against
 * 25 x (1 + o), +10 %) puts o near 0.3 item. At 4 experts that makes chunk 2 the fastest (5 x 2.3 = 11.7 items of
 * time against 3 x 4.3 = 13 at chunk 4 and 10 x 1.3 = 13 at chunk 1); at 10 experts chunks 2, 3 and 4 are within
 * 1 % of each other, so those calls keep chunk 4. */
#ifndef POOL_MIN_TAKES
#define POOL_MIN_TAKES 4
#endif
#define PRAGMA_(x) _Pragma(#x)
#define PRAGMA(x) PRAGMA_(x)
/* The item loops end in OpenMP's barrier. A barrier-free hand-off (a count of finished gate/up items, both loops
 * nowait; 83a07b7) lost in the engine: engine-ab on the H200 at 12 GiB, 3 alternating pairs, T = 8 66.6-72.7 ms
 * with the barrier against 71.2-74.2 without (docs/BENCHMARKS.md, session of 2026-12-03 (fourth)). The late
 * wakes it was made against were the bench's numpy OpenBLAS team spinning (bench/blas_spin_probe.py). */
#define OMP_FOR_ITEMS(chunk) PRAGMA(omp for schedule(dynamic, chunk))

/* the chunk of an item loop of `items` items on a team of `team` threads (POOL_MIN_TAKES above) */
static int pool_chunk(int items, int team) {
#if POOL_MIN_TAKES < 1
    (void)items, (void)team;
    return POOL_CHUNK;
#else
    const int fit = items / (team * POOL_MIN_TAKES);
    return fit < 1 ? 1 : fit < POOL_CHUNK ? fit : POOL_CHUNK;
#endif
}

/* type ids, value tables, row decoders, the fused kernels */
#include "expert_pool_decode.h"
#include "expert_pool_plan.h"

/* scalar fallback (no AVX2, or -DSTRATA_NO_SIMD): the row dequantized into scratch, then 8 partial sums per row */
static void dot_f32_rows(const float *w, int n, const float *const *xs, int m, float *out) {
    for (int r = 0; r < m; r++) {
        float s[8] = {0};
        for (int i = 0; i < n; i++) s[i % 8] += w[i] * xs[r][i];
        out[r] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    }
}

/* rows w0 + i * stride (i < nrows) of a type, n elements each, against m token rows: out[i * MAX_M + r].
 * The fused kernels run in column chunks that keep the m x-row slices in L1 (m * chunk <= X_CHUNK_FLOATS) while
 * the item's weight rows stream past them: a row of 2560 floats is 10 KB, so four whole x rows would not fit beside
 * the weights. Chunks start at multiples of 256 elements (whole blocks of every type). xsum[r]: the 16-element group
 * sums of x row r where the type's kernel needs them (fused_needs_sums), else NULL. Without a fused kernel: each
 * row dequantized into buf (n floats), then the scalar dot products. */
static void rows_dots(int type, const uint8_t *w0, int64_t stride, int nrows, int n, const float *const *xs,
                      const float *const *xsum, int m, float *out, float *buf, int xp) {
#ifdef STRATA_AVX2
    const dots_fn fused = xp == X_LIMBS ? fused_dots_limbs(type, n) : xp ? fused_dots_xperm(type, n) : fused_dots(type, n);
    /* one token row in lane order: several weight rows a pass where the type has such a kernel */
    const rows1_fn rows1 = m != 1 ? NULL : xp == X_LANES ? fused_rows1_xperm(type, n)
                         : xp == X_LIMBS ? fused_rows1_limbs(type, n) : NULL;
    if (fused) {
        int elems, bytes;
        block_of(type, &elems, &bytes);
        const uint8_t *const end = w0 + (int64_t)(nrows - 1) * stride + (int64_t)n / elems * bytes; /* the item's */
        int chunk = (X_CHUNK_FLOATS / m) & ~255;
        if (chunk < 256) chunk = 256;
        const float *xc[MAX_M], *sc[MAX_M];
        float part[MAX_M];
        for (int i = 0; i < nrows; i++)
            for (int r = 0; r < m; r++) out[i * MAX_M + r] = 0.0f;
        for (int c0 = 0; c0 < n; c0 += chunk) {
            const int len = n - c0 < chunk ? n - c0 : chunk;
            const int64_t at = (int64_t)c0 / elems * bytes;
            for (int r = 0; r < m; r++) {
                xc[r] = xs[r] + c0;
                sc[r] = xsum[r] ? xsum[r] + c0 / 16 : NULL;
            }
            if (rows1) {
                rows1(w0 + at, stride, nrows, len, xc[0], sc[0], out, end);
                continue;
            }
            for (int i = 0; i < nrows; i++) {
                fused(w0 + i * stride + at, len, xc, sc, m, part, end);
                for (int r = 0; r < m; r++) out[i * MAX_M + r] += part[r];
            }
        }
        return;
    }
#endif
    (void)xp; /* never set without a lane-order kernel (needs_xperm) */
    for (int i = 0; i < nrows; i++) {
        dequant_row(type, w0 + i * stride, n, buf);
        dot_f32_rows(buf, n, xs, m, out + i * MAX_M);
    }
}

/* the first PREFETCH_AHEAD bytes of a work item's rows, when it starts, for the types whose passes prefetch by lines
 * (pf_lines_of: those passes prefetch PREFETCH_AHEAD ahead of each row's start, never its first bytes) */
static void prefetch_span(int type, int n, const uint8_t *p, int64_t bytes) {
#ifdef STRATA_AVX2
    if (!pf_lines_of(type, n)) return;
    if (bytes > PREFETCH_AHEAD) bytes = PREFETCH_AHEAD;
    for (const uint8_t *q = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)63); q < p + bytes; q += 64)
        __builtin_prefetch(q, 0, 3);
#else
    (void)type, (void)n, (void)p, (void)bytes;
#endif
}

/* the sum of n bytes, 32 at a time (AVX2 vpsadbw): the plain read's and the touch mode's one pass over memory */
static uint64_t sum_bytes(const uint8_t *p, int64_t n) {
    uint64_t s = 0;
    int64_t j = 0;
#ifdef STRATA_AVX2
    __m256i a = _mm256_setzero_si256();
    for (; j + 32 <= n; j += 32)
        a = _mm256_add_epi64(a, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(p + j)), _mm256_setzero_si256()));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a);
    s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#endif
    for (; j < n; j++) s += p[j];
    return s;
}

/* the touch mode of strata_pool_diag: every byte of the rows read and summed, nothing decoded; the sums stand in for
 * the dot products (out[i * MAX_M + r], the same small value for every token row) */
static void rows_touch(const uint8_t *w0, int64_t stride, int nrows, int64_t row_bytes, int m, float *out) {
    for (int i = 0; i < nrows; i++) {
        const uint64_t s = sum_bytes(w0 + i * stride, row_bytes);
        for (int r = 0; r < m; r++) out[i * MAX_M + r] = (float)(s & 0xFF) * 1e-3f;
    }
}

/* the x group sums of the fused kernels' min term (expert_pool_dispatch.h) */
static int needs_sums(int type) {
#ifdef STRATA_AVX2
    return fused_needs_sums(type);
#else
    (void)type;
    return 0;
#endif
}

/* how x rows of n of the type are read (expert_pool_dispatch.h): X_LIMBS (the avx512vbmi build's integer-product
 * kernels: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, x as limb slots), X_LANES (the AVX-512 lane-order kernels: Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0, IQ1_S, IQ1_M, NVFP4, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, x permuted) or
 * 0 (as it is) */
static int needs_xperm(int type, int n) {
#ifdef STRATA_AVX2
    return fused_dots_limbs(type, n) ? X_LIMBS : fused_xperm(type, n) != 0 ? X_LANES : 0;
#else
    (void)type, (void)n;
    return 0;
#endif
}

/* whether h rows (the down rows' input, written element by element: perm_pos) of n of the type are read in its lane
 * order: never as limbs */
static int h_lanes(int type, int n) {
#ifdef STRATA_AVX2
    return fused_xperm(type, n) != 0 ? X_LANES : 0;
#else
    (void)type, (void)n;
    return 0;
#endif
}

/* the most token rows on an expert whose gate/up rows take the type's lane-order kernel (LANE_MAX_ROWS, or more
 * where the type's lane kernel is the faster one at more rows too: fused_lane_rows) */
static int lane_rows(int type) {
#ifdef STRATA_AVX2
    return fused_lane_rows(type);
#else
    (void)type;
    return LANE_MAX_ROWS;
#endif
}

static int perm_pos(int type, int n, int f) {
#ifdef STRATA_AVX2
    return xperm_pos(type, n, f);
#else
    (void)type, (void)n;
    return f;
#endif
}

/* x row in the form needs_xperm names (limb slots or the lane order) */
static void perm_of(int type, const float *x, int n, float *xp) {
#ifdef STRATA_AVX2
    if (needs_xperm(type, n) == X_LIMBS) xlimbs_of(type, x, n, xp);
    else xperm_of(type, x, n, xp);
#else
    (void)type, (void)x, (void)n, (void)xp;
#endif
}

static void sums_of(const float *x, int n, float *xsum) {
#ifdef STRATA_AVX2
    group_sums(x, n, xsum);
#else
    (void)x, (void)n, (void)xsum;
#endif
}

static int row_ok(int type, int n) {
    int elems, bytes;
    return block_of(type, &elems, &bytes) == 0 && n % elems == 0;
}

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int64_t row_bytes_of(int type, int n) {
    int elems, bytes;
    block_of(type, &elems, &bytes);
    return (int64_t)n / elems * bytes;
}

/* The profile of one call (strata_pool_diag with prof != NULL), CLOCK_MONOTONIC ns:
 *   prof[0] before the parallel region, prof[1] after it, prof[2] the team's size, prof[3] the gate/up loop's chunk;
 *   per thread t < n_threads, prof[PROF_HEAD + PROF_PER * t + k]: k = 0 it entered the region, 1 its gate/up items
 *   start (after the x sums' barrier), 2 its last gate/up item done, 3 its down items start (after the barrier),
 *   4 its last down item done, 5 its gate/up items, 6 its down items, 7 the down loop's chunk (pool_chunk). */
#define PROF_HEAD 4
#define PROF_PER 8

/* y[dst[i]] = down_g · (silu(gate_g · x[tok[i]]) * (up_g · x[tok[i]])) for every entry i of every group g
 *
 * The min term's group sums (fused_needs_sums: Q2_K, Q4_K, Q5_K, Q4_1, Q5_1 in the AVX-512 build) are computed once per call:
 * those of the x rows before the gate/up items, those of each h row by the gate/up items that write it (an item's
 * 16 rows are one 16-element group of h). Per work item they cost 10-40 % of a Q2_K item at one row per expert.
 * Work items: gate/up items of ROWS_GATE_UP rows of one expert's gate and up (F / 16 per expert), then, after a
 * barrier (every h row complete), down items of ROWS_DOWN rows (H / 64 per expert), pool_chunk at a time. Where a
 * type has a lane-order kernel (needs_xperm), x is copied in its order with the sums, and h written in the down
 * kernel's. touch: the same items, schedule and barriers with the weights' bytes only read, not decoded (what the
 * access pattern alone costs). */
static int pool_run(int n_threads, int H, int F, int G, const uint64_t *gate, const uint64_t *up,
                    const uint64_t *down, int64_t gate_row, int64_t up_row, int64_t down_row, int gate_type,
                    int up_type, int down_type, const int32_t *start, const int32_t *tok, const int32_t *dst,
                    const float *x, float *y, float *h, int touch, int64_t *prof, void (*side)(void *),
                    void *side_ctx) {
    if (!row_ok(gate_type, H) || !row_ok(up_type, H) || !row_ok(down_type, F) || n_threads < 1) return -1;
    const int items_gu = (F + ROWS_GATE_UP - 1) / ROWS_GATE_UP, items_dn = (H + ROWS_DOWN - 1) / ROWS_DOWN;
    const int N = start[G], x_sums = needs_sums(gate_type) || needs_sums(up_type), h_sums = needs_sums(down_type);
    const int64_t gate_bytes = row_bytes_of(gate_type, H), up_bytes = row_bytes_of(up_type, H);
    const int64_t down_bytes = row_bytes_of(down_type, F);
    int n_x = 0; /* x rows: 1 + the largest token row an entry reads */
    for (int i = 0; i < N; i++) n_x = tok[i] + 1 > n_x ? tok[i] + 1 : n_x;
    /* x in the lane order of the gate's / up's kernel where it has one (needs_xperm; the same order for both when
     * they are of one type) */
    const int xp_gate_kind = needs_xperm(gate_type, H), xp_up_kind = needs_xperm(up_type, H);
    const int xp_gate = xp_gate_kind != 0;
    const int xp_up = xp_up_kind && !(xp_gate && up_type == gate_type);
    /* h written in the down kernel's lane order where it has one that h can be written in */
    const int hp = h_lanes(down_type, F);
    const size_t n_xs = (size_t)(x_sums ? n_x : 0) * (H / 16), n_hs = (size_t)(h_sums ? N : 0) * (F / 16);
    const size_t n_xp = (size_t)n_x * H * (size_t)(xp_gate + xp_up);
    float *sums = (float *)malloc(sizeof(float) * (n_xs + n_hs + n_xp + 1));
    if (!sums) return -2;
    float *const xs_all = sums, *const hs_all = sums + n_xs;
    float *const xg_all = xp_gate ? sums + n_xs + n_hs : NULL;
    float *const xu_all = xp_up ? sums + n_xs + n_hs + (size_t)n_x * H * xp_gate
                          : xp_gate && xp_up_kind ? xg_all : NULL;
    int failed = 0;
    if (prof) {
        memset(prof, 0, sizeof(int64_t) * (PROF_HEAD + (size_t)PROF_PER * n_threads));
        prof[0] = now_ns();
    }
#pragma omp parallel num_threads(n_threads)
    {
        /* the profile in registers, stored once at the end (the threads' records share cache lines) */
        int64_t t_in = prof ? now_ns() : 0, t_gu0 = 0, t_gu1 = 0, t_dn0 = 0, t_dn1 = 0, n_gu = 0, n_dn = 0;
        /* the chunks for the team OpenMP gave (every thread computes the same ones, as schedule() requires) */
        const int team = omp_get_num_threads();
        const int chunk_gu = pool_chunk(G * items_gu, team), chunk_dn = pool_chunk(G * items_dn, team);
        const int n_max = H > F ? H : F;
        float *buf = (float *)malloc(sizeof(float) * (size_t)n_max);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        const float *xs[MAX_M], *xsum[MAX_M], *xg[MAX_M], *xu[MAX_M];
        float gv[ROWS_GATE_UP * MAX_M], uv[ROWS_GATE_UP * MAX_M];
        if (x_sums || xg_all || xu_all) {
#pragma omp for schedule(static)
            for (int t = 0; t < n_x; t++) {
                if (x_sums) sums_of(x + (int64_t)t * H, H, xs_all + (int64_t)t * (H / 16));
                if (xg_all) perm_of(gate_type, x + (int64_t)t * H, H, xg_all + (int64_t)t * H);
                if (xu_all && xu_all != xg_all) perm_of(up_type, x + (int64_t)t * H, H, xu_all + (int64_t)t * H);
            }
        } /* implicit barrier: every x sum and lane-order copy is there */
        /* side work of the caller's on one thread (the tier loop's PCIe copies, expert_pool_serve.h), while the
         * rest of the team starts on the items: the dynamic schedule hands that thread's share to the others */
        if (side && omp_get_thread_num() == 0) side(side_ctx);
        if (prof) t_gu0 = t_gu1 = now_ns();
        OMP_FOR_ITEMS(chunk_gu)
        for (int item = 0; item < G * items_gu; item++) {
            if (!buf) continue;
            const int g = item / items_gu, f0 = (item % items_gu) * ROWS_GATE_UP;
            const int f1 = f0 + ROWS_GATE_UP < F ? f0 + ROWS_GATE_UP : F;
            const uint8_t *wg = (const uint8_t *)(uintptr_t)gate[g] + f0 * gate_row;
            const uint8_t *wu = (const uint8_t *)(uintptr_t)up[g] + f0 * up_row;
            prefetch_span(gate_type, H, wg, (int64_t)(f1 - f0) * gate_row);
            prefetch_span(up_type, H, wu, (int64_t)(f1 - f0) * up_row);
            /* lane order for the gate/up rows of an expert with few rows (LANE_MAX_ROWS, or the type's lane_rows) */
            const int rows_g = start[g + 1] - start[g];
            const float *const xg_lane = rows_g <= lane_rows(gate_type) ? xg_all : NULL;
            const float *const xu_lane = rows_g <= lane_rows(up_type) ? xu_all : NULL;
            for (int e0 = start[g]; e0 < start[g + 1]; e0 += MAX_M) {
                const int m = start[g + 1] - e0 < MAX_M ? start[g + 1] - e0 : MAX_M;
                for (int r = 0; r < m; r++) {
                    xs[r] = x + (int64_t)tok[e0 + r] * H;
                    xg[r] = xg_lane ? xg_lane + (int64_t)tok[e0 + r] * H : xs[r];
                    xu[r] = xu_lane ? xu_lane + (int64_t)tok[e0 + r] * H : xs[r];
                    xsum[r] = x_sums ? xs_all + (int64_t)tok[e0 + r] * (H / 16) : NULL;
                }
                if (touch) {
                    rows_touch(wg, gate_row, f1 - f0, gate_bytes, m, gv);
                    rows_touch(wu, up_row, f1 - f0, up_bytes, m, uv);
                } else {
                    rows_dots(gate_type, wg, gate_row, f1 - f0, H, xg, xsum, m, gv, buf, xg_lane ? xp_gate_kind : 0);
                    rows_dots(up_type, wu, up_row, f1 - f0, H, xu, xsum, m, uv, buf, xu_lane ? xp_up_kind : 0);
                }
                for (int r = 0; r < m; r++) {
                    float *hr = h + (int64_t)(e0 + r) * F, hv[ROWS_GATE_UP];
                    for (int f = f0; f < f1; f++) {
                        const float gr = gv[(f - f0) * MAX_M + r];
                        hv[f - f0] = gr * (1.0f / (1.0f + expf(-gr))) * uv[(f - f0) * MAX_M + r];
                    }
                    for (int f = f0; f < f1; f++) hr[hp ? perm_pos(down_type, F, f) : f] = hv[f - f0];
                    /* h_sums: F % 32 == 0 (a K-quant, Q4_1 or Q5_1 down row), so f0 .. f1 is the whole group
                     * f0 / 16 */
                    if (h_sums) sums_of(hv, 16, hs_all + (int64_t)(e0 + r) * (F / 16) + f0 / 16);
                }
            }
            if (prof) t_gu1 = now_ns(), n_gu++;
        }
        /* implicit barrier: every h row and its sums are complete */
        if (prof) t_dn0 = t_dn1 = now_ns();
        float out[ROWS_DOWN * MAX_M];
        OMP_FOR_ITEMS(chunk_dn)
        for (int item = 0; item < G * items_dn; item++) {
            if (!buf) continue;
            const int g = item / items_dn, d0 = (item % items_dn) * ROWS_DOWN;
            const int d1 = d0 + ROWS_DOWN < H ? d0 + ROWS_DOWN : H;
            const uint8_t *wd = (const uint8_t *)(uintptr_t)down[g] + d0 * down_row;
            prefetch_span(down_type, F, wd, (int64_t)(d1 - d0) * down_row);
            for (int e0 = start[g]; e0 < start[g + 1]; e0 += MAX_M) {
                const int m = start[g + 1] - e0 < MAX_M ? start[g + 1] - e0 : MAX_M;
                for (int r = 0; r < m; r++) {
                    xs[r] = h + (int64_t)(e0 + r) * F;
                    xsum[r] = h_sums ? hs_all + (int64_t)(e0 + r) * (F / 16) : NULL;
                }
                if (touch) rows_touch(wd, down_row, d1 - d0, down_bytes, m, out);
                else rows_dots(down_type, wd, down_row, d1 - d0, F, xs, xsum, m, out, buf, hp);
                for (int d = d0; d < d1; d++)
                    for (int r = 0; r < m; r++) y[(int64_t)dst[e0 + r] * H + d] = out[(d - d0) * MAX_M + r];
            }
            if (prof) t_dn1 = now_ns(), n_dn++;
        }
        free(buf);
        const int tid = omp_get_thread_num();
        if (prof && tid < n_threads) {
            int64_t *const me = prof + PROF_HEAD + PROF_PER * tid;
            me[0] = t_in, me[1] = t_gu0, me[2] = t_gu1, me[3] = t_dn0, me[4] = t_dn1, me[5] = n_gu, me[6] = n_dn;
            me[7] = chunk_dn;
            if (tid == 0) prof[3] = chunk_gu;
        }
    }
    if (prof) prof[1] = now_ns(), prof[2] = n_threads;
    free(sums);
    return failed ? -2 : 0;
}

int strata_pool_swiglu(int n_threads, int H, int F, int G, const uint64_t *gate, const uint64_t *up,
                       const uint64_t *down, int64_t gate_row, int64_t up_row, int64_t down_row, int gate_type,
                       int up_type, int down_type, const int32_t *start, const int32_t *tok, const int32_t *dst,
                       const float *x, float *y, float *h) {
    return pool_run(n_threads, H, F, G, gate, up, down, gate_row, up_row, down_row, gate_type, up_type, down_type,
                    start, tok, dst, x, y, h, 0, NULL, NULL, NULL);
}

/* strata_pool_swiglu with its profile (prof: PROF_HEAD + PROF_PER * n_threads int64, or NULL) and, with touch = 1,
 * the weights only read (bench/pool_bench.py: where a call's time goes, and what the access pattern alone costs) */
int strata_pool_diag(int n_threads, int H, int F, int G, const uint64_t *gate, const uint64_t *up,
                     const uint64_t *down, int64_t gate_row, int64_t up_row, int64_t down_row, int gate_type,
                     int up_type, int down_type, const int32_t *start, const int32_t *tok, const int32_t *dst,
                     const float *x, float *y, float *h, int touch, int64_t *prof) {
    return pool_run(n_threads, H, F, G, gate, up, down, gate_row, up_row, down_row, gate_type, up_type, down_type,
                    start, tok, dst, x, y, h, touch, prof, NULL, NULL);
}

/* strata_pool_diag (touch 0) for the tier host's steps: the G experts by id (experts [G] int32 < E, the caller's
 * plan guarantees it) of one layer's tensors at base[m] + e * estride[m] (m = gate, up, down), the pointer arrays made
 * here: tiers/pool.ExpertPool.compute_step, where building them in numpy cost more than the plan itself */
int strata_pool_experts(int n_threads, int H, int F, int G, const int32_t *experts, const uint64_t *base,
                        const uint64_t *estride, int64_t gate_row, int64_t up_row, int64_t down_row, int gate_type,
                        int up_type, int down_type, const int32_t *start, const int32_t *tok, const int32_t *dst,
                        const float *x, float *y, float *h, int64_t *prof) {
    if (G < 1) return 0;
    uint64_t *ptr = malloc(3 * (size_t)G * sizeof(uint64_t));
    if (!ptr) return -2;
    for (int g = 0; g < G; g++)
        for (int m = 0; m < 3; m++) ptr[m * G + g] = base[m] + (uint64_t)experts[g] * estride[m];
    const int rc = pool_run(n_threads, H, F, G, ptr, ptr + G, ptr + 2 * G, gate_row, up_row, down_row, gate_type,
                            up_type, down_type, start, tok, dst, x, y, h, 0, prof, NULL, NULL);
    free(ptr);
    return rc;
}

/* the build's tuning: out[0..5] = POOL_CHUNK, PREFETCH_AHEAD, ROWS_GATE_UP, ROWS_DOWN, 1 for the AVX-512 permute and
 * lane-order kernels, POOL_MIN_TAKES; returns the item loops' schedule */
const char *strata_pool_config(int64_t *out) {
#ifdef STRATA_AVX2
    const int64_t ahead = PREFETCH_AHEAD;
#else
    const int64_t ahead = 0;
#endif
#ifdef STRATA_PERM
    const int64_t perm = 1;
#else
    const int64_t perm = 0;
#endif
    const int64_t v[6] = {POOL_CHUNK, ahead, ROWS_GATE_UP, ROWS_DOWN, perm, POOL_MIN_TAKES};
    memcpy(out, v, sizeof v);
    return "dynamic";
}

/* exported for the tests: one row, exactly as the kernels see it */
int strata_dequant_row(int type, const void *src, int64_t n, float *y) {
    if (!row_ok(type, (int)n)) return -1;
    dequant_row(type, (const uint8_t *)src, n, y);
    return 0;
}

/* exported for the tests: out[i * m + r] = the dot product of weight row i (w0 + i * stride, n weights of the type)
 * with x row r (x [m, n], m <= MAX_M) through the pool's kernels (rows_dots): lane = 1 the kernel of the type's x
 * rows where it has one (limbs or lane order: x made ready and summed as pool_run does), 0 its weight-table kernel;
 * -1 for rows of no whole blocks or a bad m */
int strata_rows_dots(int type, const void *w0, int64_t stride, int nrows, int n, const float *x, int m, int lane,
                     float *out) {
    if (!row_ok(type, n) || m < 1 || m > MAX_M || nrows < 0) return -1;
    /* the kernel of x rows where pool_run would take it for m rows on an expert (lane_rows: the grid i-quants' limb
     * kernels serve at most 2 rows, in column chunks of whole block pairs) */
    const int xp = lane && m <= lane_rows(type) ? needs_xperm(type, n) : 0, sums = needs_sums(type);
    float *const buf = (float *)malloc(sizeof(float) * ((size_t)n * (m + 1) + (size_t)(n / 16) * m + 1));
    if (!buf) return -2;
    float *const xperm = buf + n, *const xsum_all = xperm + (size_t)n * m;
    const float *xs[MAX_M], *xsum[MAX_M];
    for (int r = 0; r < m; r++) {
        if (xp) perm_of(type, x + (int64_t)r * n, n, xperm + (int64_t)r * n);
        if (sums) sums_of(x + (int64_t)r * n, n, xsum_all + (int64_t)r * (n / 16));
        xs[r] = xp ? xperm + (int64_t)r * n : x + (int64_t)r * n;
        xsum[r] = sums ? xsum_all + (int64_t)r * (n / 16) : NULL;
    }
    float part[ROWS_DOWN * MAX_M];
    for (int i0 = 0; i0 < nrows; i0 += ROWS_DOWN) {
        const int k = nrows - i0 < ROWS_DOWN ? nrows - i0 : ROWS_DOWN;
        rows_dots(type, (const uint8_t *)w0 + i0 * stride, stride, k, n, xs, xsum, m, part, buf, xp);
        for (int i = 0; i < k; i++)
            for (int r = 0; r < m; r++) out[(int64_t)(i0 + i) * m + r] = part[i * MAX_M + r];
    }
    free(buf);
    return 0;
}

/* ---- doorbell words (mapped pinned memory): wait, raise (max), store */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* spin until *word >= want or max_ns passed (the caller loops, checking its stream between slices). The first
 * 20 us are a pure pause-spin (the answer usually comes within it); after that the loop also yields the core
 * between batches, so a waiter on a busy host (the pool's OpenMP team, other processes) does not starve the
 * thread it waits for. */
uint32_t strata_wait_geq(const uint32_t *word, uint32_t want, int64_t max_ns) {
    uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (v >= want) return v;
    const int64_t start = now_ns(), end = start + max_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
            if (v >= want) return v;
            cpu_relax();
        }
        const int64_t t = now_ns();
        if (t >= end) return v;
        if (t - start > 20000) sched_yield();
    }
}

/* ---- the PCIe share's gather (strata_cli/engine/gpu/pcie_stage.py): n pieces src[i] -> dst[i] of bytes[i] each,
 * cut into GATHER_CHUNK-byte chunks shared dynamically by the team, so that even one expert's three projections (a
 * T = 1 step's PCIe share) spread over every core. Called on the thread that runs the pool, it runs on the pool's own
 * OpenMP team, one after the other with the pool's call, never beside it: the two share the host's cores and memory
 * bandwidth in any case (tiers/share.py models the host time as their sum), and a second team on the same cores
 * (the old 4 Python threads beside the pool's 16) only oversubscribed them (#17: 17.9 GB/s and a slower pool).
 * Plain memcpy per chunk: on the H200 host (bench/gather_bench.py, 02f665e, 32 experts, 64 MB a call) it gathered at
 * 61.2 GB/s on 16 threads against 48.8 for AVX2 non-temporal stores (equal at 4 threads), so those went. */
#define GATHER_CHUNK (64 << 10)

int strata_gather(int n_threads, int n, const uint64_t *src, const uint64_t *dst, const int64_t *bytes) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (bytes[i] < 0) return 1;
        total += (bytes[i] + GATHER_CHUNK - 1) / GATHER_CHUNK;
    }
    if (total == 0) return 0;
    if (n_threads > total) n_threads = (int)total;
#pragma omp parallel num_threads(n_threads)
    {
        int piece = 0;
        int64_t first = 0; /* the first chunk of `piece`: each thread walks the pieces forward with its chunks */
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < total; c++) {
            while (c - first >= (bytes[piece] + GATHER_CHUNK - 1) / GATHER_CHUNK) {
                first += (bytes[piece] + GATHER_CHUNK - 1) / GATHER_CHUNK;
                piece++;
            }
            const int64_t off = (c - first) * GATHER_CHUNK;
            const int64_t len = bytes[piece] - off < GATHER_CHUNK ? bytes[piece] - off : GATHER_CHUNK;
            memcpy((uint8_t *)(uintptr_t)dst[piece] + off, (const uint8_t *)(uintptr_t)src[piece] + off, (size_t)len);
        }
    }
    return 0;
}

/* ---- the plain parallel read the pool is measured against: the sum of every byte of n buffers */
double strata_stream_read(int n_threads, int n, const uint64_t *ptrs, const int64_t *sizes) {
    const int64_t chunk = 1 << 20;
    int64_t total_chunks = 0;
    for (int i = 0; i < n; i++) total_chunks += (sizes[i] + chunk - 1) / chunk;
    uint64_t sum = 0;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) reduction(+ : sum)
    for (int64_t c = 0; c < total_chunks; c++) {
        int64_t rest = c;
        int i = 0;
        while (rest >= (sizes[i] + chunk - 1) / chunk) { rest -= (sizes[i] + chunk - 1) / chunk; i++; }
        const uint8_t *p = (const uint8_t *)(uintptr_t)ptrs[i] + rest * chunk;
        const int64_t len = sizes[i] - rest * chunk < chunk ? sizes[i] - rest * chunk : chunk;
        sum += sum_bytes(p, len);
    }
    return (double)sum;
}

/* the tier host's steps of a window without a PCIe share in one loop (strata_cli/tiers/serve_loop.py) */
#include "expert_pool_serve.h"
