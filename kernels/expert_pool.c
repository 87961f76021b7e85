/* Host kernels of the CPU expert pool (strata_cli/tiers/pool.py, native.py): routed experts straight from the
 * memory-mapped GGUF blocks, the doorbell word waits, and a plain parallel read for the benchmark.
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
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(STRATA_NO_SIMD)
#include <immintrin.h>
#define STRATA_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define STRATA_AVX512 1 /* the fused kernels' 16 lanes in one zmm register */
#endif
#endif

#define MAX_M 16         /* entries (token rows) one work item serves per pass over its weight rows */
#define ROWS_GATE_UP 16  /* gate/up rows per work item */
#define ROWS_DOWN 64     /* down rows per work item */
#ifndef X_CHUNK_FLOATS
#define X_CHUNK_FLOATS 4096 /* floats of x (all rows of a pass together) one column chunk keeps in L1 */
#endif

/* type ids, value tables, row decoders, the fused kernels */
#include "expert_pool_decode.h"

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
                      const float *const *xsum, int m, float *out, float *buf) {
#ifdef STRATA_AVX2
    const dots_fn fused = fused_dots(type, n);
    if (fused) {
        int elems, bytes;
        block_of(type, &elems, &bytes);
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
            for (int i = 0; i < nrows; i++) {
                fused(w0 + i * stride + at, len, xc, sc, m, part);
                for (int r = 0; r < m; r++) out[i * MAX_M + r] += part[r];
            }
        }
        return;
    }
#endif
    for (int i = 0; i < nrows; i++) {
        dequant_row(type, w0 + i * stride, n, buf);
        dot_f32_rows(buf, n, xs, m, out + i * MAX_M);
    }
}

/* the x group sums of the fused kernels' min term (expert_pool_groups.h) */
static int needs_sums(int type) {
#ifdef STRATA_AVX2
    return fused_needs_sums(type);
#else
    (void)type;
    return 0;
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

/* y[dst[i]] = down_g · (silu(gate_g · x[tok[i]]) * (up_g · x[tok[i]])) for every entry i of every group g
 *
 * The min term's group sums (fused_needs_sums: Q2_K, Q4_K, Q5_K in the AVX-512 build) are computed once per call:
 * those of the x rows before the gate/up items, those of each h row by the gate/up items that write it (an item's
 * 16 rows are one 16-element group of h). Per work item they cost 10-40 % of a Q2_K item at one row per expert. */
int strata_pool_swiglu(int n_threads, int H, int F, int G, const uint64_t *gate, const uint64_t *up,
                       const uint64_t *down, int64_t gate_row, int64_t up_row, int64_t down_row, int gate_type,
                       int up_type, int down_type, const int32_t *start, const int32_t *tok, const int32_t *dst,
                       const float *x, float *y, float *h) {
    if (!row_ok(gate_type, H) || !row_ok(up_type, H) || !row_ok(down_type, F)) return -1;
    const int items_gu = (F + ROWS_GATE_UP - 1) / ROWS_GATE_UP, items_dn = (H + ROWS_DOWN - 1) / ROWS_DOWN;
    const int N = start[G], x_sums = needs_sums(gate_type) || needs_sums(up_type), h_sums = needs_sums(down_type);
    int n_x = 0; /* x rows: 1 + the largest token row an entry reads */
    for (int i = 0; i < N; i++) n_x = tok[i] + 1 > n_x ? tok[i] + 1 : n_x;
    float *sums = (float *)malloc(sizeof(float) * ((size_t)(x_sums ? n_x : 0) * (H / 16) +
                                                   (size_t)(h_sums ? N : 0) * (F / 16) + 1));
    if (!sums) return -2;
    float *const xs_all = sums, *const hs_all = sums + (size_t)(x_sums ? n_x : 0) * (H / 16);
    int failed = 0;
#pragma omp parallel num_threads(n_threads)
    {
        const int n_max = H > F ? H : F;
        float *buf = (float *)malloc(sizeof(float) * (size_t)n_max);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        const float *xs[MAX_M], *xsum[MAX_M];
        float gv[ROWS_GATE_UP * MAX_M], uv[ROWS_GATE_UP * MAX_M];
        if (x_sums) {
#pragma omp for schedule(static)
            for (int t = 0; t < n_x; t++) sums_of(x + (int64_t)t * H, H, xs_all + (int64_t)t * (H / 16));
        } /* implicit barrier: every x sum is there */
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < G * items_gu; item++) {
            if (!buf) continue;
            const int g = item / items_gu, f0 = (item % items_gu) * ROWS_GATE_UP;
            const int f1 = f0 + ROWS_GATE_UP < F ? f0 + ROWS_GATE_UP : F;
            const uint8_t *wg = (const uint8_t *)(uintptr_t)gate[g], *wu = (const uint8_t *)(uintptr_t)up[g];
            for (int e0 = start[g]; e0 < start[g + 1]; e0 += MAX_M) {
                const int m = start[g + 1] - e0 < MAX_M ? start[g + 1] - e0 : MAX_M;
                for (int r = 0; r < m; r++) {
                    xs[r] = x + (int64_t)tok[e0 + r] * H;
                    xsum[r] = x_sums ? xs_all + (int64_t)tok[e0 + r] * (H / 16) : NULL;
                }
                rows_dots(gate_type, wg + f0 * gate_row, gate_row, f1 - f0, H, xs, xsum, m, gv, buf);
                rows_dots(up_type, wu + f0 * up_row, up_row, f1 - f0, H, xs, xsum, m, uv, buf);
                for (int r = 0; r < m; r++) {
                    float *hr = h + (int64_t)(e0 + r) * F;
                    for (int f = f0; f < f1; f++) {
                        const float gr = gv[(f - f0) * MAX_M + r];
                        hr[f] = gr * (1.0f / (1.0f + expf(-gr))) * uv[(f - f0) * MAX_M + r];
                    }
                    /* h_sums: F % 256 == 0 (a K-quant down row), so f0 .. f1 is the whole group f0 / 16 */
                    if (h_sums) sums_of(hr + f0, 16, hs_all + (int64_t)(e0 + r) * (F / 16) + f0 / 16);
                }
            }
        }
        /* implicit barrier: every h row and its sums are complete */
        float out[ROWS_DOWN * MAX_M];
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < G * items_dn; item++) {
            if (!buf) continue;
            const int g = item / items_dn, d0 = (item % items_dn) * ROWS_DOWN;
            const int d1 = d0 + ROWS_DOWN < H ? d0 + ROWS_DOWN : H;
            const uint8_t *wd = (const uint8_t *)(uintptr_t)down[g];
            for (int e0 = start[g]; e0 < start[g + 1]; e0 += MAX_M) {
                const int m = start[g + 1] - e0 < MAX_M ? start[g + 1] - e0 : MAX_M;
                for (int r = 0; r < m; r++) {
                    xs[r] = h + (int64_t)(e0 + r) * F;
                    xsum[r] = h_sums ? hs_all + (int64_t)(e0 + r) * (F / 16) : NULL;
                }
                rows_dots(down_type, wd + d0 * down_row, down_row, d1 - d0, F, xs, xsum, m, out, buf);
                for (int d = d0; d < d1; d++)
                    for (int r = 0; r < m; r++) y[(int64_t)dst[e0 + r] * H + d] = out[(d - d0) * MAX_M + r];
            }
        }
        free(buf);
    }
    free(sums);
    return failed ? -2 : 0;
}

/* exported for the tests: one row, exactly as the kernels see it */
int strata_dequant_row(int type, const void *src, int64_t n, float *y) {
    if (!row_ok(type, (int)n)) return -1;
    dequant_row(type, (const uint8_t *)src, n, y);
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

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
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
        uint64_t s = 0;
#ifdef STRATA_AVX2
        __m256i a = _mm256_setzero_si256();
        int64_t j = 0;
        for (; j + 32 <= len; j += 32)
            a = _mm256_add_epi64(a, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(p + j)), _mm256_setzero_si256()));
        uint64_t lanes[4];
        _mm256_storeu_si256((__m256i *)lanes, a);
        s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
        for (; j < len; j++) s += p[j];
#else
        for (int64_t j = 0; j < len; j++) s += p[j];
#endif
        sum += s;
    }
    return (double)sum;
}
