/* Host kernels of the CPU expert pool (strata_cli/tiers/pool.py, native.py): routed experts straight from the
 * memory-mapped GGUF blocks, the doorbell word waits, and a plain parallel read for the benchmark.
 *
 * Built at first use: cc -O3 -fopenmp -ffp-contract=off [-mavx2 -mfma -mf16c] -shared. Weights are dequantized
 * exactly as gguf.quants.dequantize does (same float32 operations, no contraction) and multiplied in float32 with
 * explicit FMAs; without AVX2 the same arithmetic runs scalar.
 *
 * Shapes (one layer, G experts, N entries = routed picks, H = hidden, F = expert ff):
 *   gate, up [F rows of H] and down [H rows of F] of each expert, rows `*_row` bytes apart, at gate[g] / up[g] / down[g]
 *   x [rows, H] f32;  y [rows*k, H] f32 (entry i writes row dst[i]);  h scratch [N, F] f32
 *   group g = entries start[g] .. start[g+1]-1, each with its token row tok[i] and output row dst[i]
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define STRATA_AVX2 1
#endif

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10,
       T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20, T_IQ4_XS = 23, T_BF16 = 30 };
#define QK_K 256
#define MAX_M 8          /* entries (token rows) one pass over a weight row serves */
#define ROWS_GATE_UP 16  /* gate/up rows per work item */
#define ROWS_DOWN 64     /* down rows per work item */

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- scalars */
static inline float f16_to_f32(uint16_t h) {
#ifdef STRATA_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline float rdh(const uint8_t *p) { return f16_to_f32(rd16(p)); }

/* ---- dequantization of one row of n elements (n a multiple of the block), exactly gguf's float32 values */
static void get_scale_min_k4(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static int block_of(int type, int *elems, int *bytes) {
    switch (type) {
    case T_F32: *elems = 1; *bytes = 4; return 0;
    case T_F16: case T_BF16: *elems = 1; *bytes = 2; return 0;
    case T_Q4_0: *elems = 32; *bytes = 18; return 0;
    case T_Q4_1: *elems = 32; *bytes = 20; return 0;
    case T_Q5_0: *elems = 32; *bytes = 22; return 0;
    case T_Q5_1: *elems = 32; *bytes = 24; return 0;
    case T_Q8_0: *elems = 32; *bytes = 34; return 0;
    case T_IQ4_NL: *elems = 32; *bytes = 18; return 0;
    case T_Q2_K: *elems = QK_K; *bytes = 84; return 0;
    case T_Q3_K: *elems = QK_K; *bytes = 110; return 0;
    case T_Q4_K: *elems = QK_K; *bytes = 144; return 0;
    case T_Q5_K: *elems = QK_K; *bytes = 176; return 0;
    case T_Q6_K: *elems = QK_K; *bytes = 210; return 0;
    case T_IQ4_XS: *elems = QK_K; *bytes = 136; return 0;
    default: return -1;
    }
}

static void dequant_block(int type, const uint8_t *b, float *y) {
    switch (type) {
    case T_Q4_0: {
        const float d = rdh(b);
        for (int l = 0; l < 32; l++) y[l] = d * (float)((int)((b[2 + l % 16] >> (4 * (l / 16))) & 0xF) - 8);
        break;
    }
    case T_Q4_1: {
        const float d = rdh(b), m = rdh(b + 2);
        for (int l = 0; l < 32; l++) y[l] = d * (float)((b[4 + l % 16] >> (4 * (l / 16))) & 0xF) + m;
        break;
    }
    case T_Q5_0: {
        const float d = rdh(b);
        const uint32_t qh = rd32(b + 2);
        for (int l = 0; l < 32; l++) {
            int q = ((b[6 + l % 16] >> (4 * (l / 16))) & 0xF) | (((qh >> l) & 1) << 4);
            y[l] = d * (float)(q - 16);
        }
        break;
    }
    case T_Q5_1: {
        const float d = rdh(b), m = rdh(b + 2);
        const uint32_t qh = rd32(b + 4);
        for (int l = 0; l < 32; l++) {
            int q = ((b[8 + l % 16] >> (4 * (l / 16))) & 0xF) | (((qh >> l) & 1) << 4);
            y[l] = d * (float)q + m;
        }
        break;
    }
    case T_Q8_0: {
        const float d = rdh(b);
        for (int l = 0; l < 32; l++) y[l] = (float)(int8_t)b[2 + l] * d;
        break;
    }
    case T_IQ4_NL: {
        const float d = rdh(b);
        for (int l = 0; l < 32; l++) y[l] = d * (float)kvalues_iq4nl[(b[2 + l % 16] >> (4 * (l / 16))) & 0xF];
        break;
    }
    case T_Q2_K: { /* scales[16] qs[64] d dmin */
        const uint8_t *sc = b, *qs = b + 16;
        const float d = rdh(b + 80), dmin = rdh(b + 82);
        for (int e = 0; e < QK_K; e++) {
            const int half = e / 128, r = e % 128, s = r / 32, l = r % 32, sub = e / 16;
            const float dl = d * (float)(sc[sub] & 0xF), ml = dmin * (float)(sc[sub] >> 4);
            y[e] = dl * (float)((qs[half * 32 + l] >> (2 * s)) & 3) - ml;
        }
        break;
    }
    case T_Q3_K: { /* hmask[32] qs[64] scales[12] d */
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        const float d = rdh(b + 108);
        for (int e = 0; e < QK_K; e++) {
            const int sub = e / 16;
            const int lo = sub < 8 ? (sc[sub] & 0xF) : (sc[sub - 8] >> 4);
            const int hi = (sc[8 + sub % 4] >> (2 * (sub / 4))) & 3;
            const float dl = d * (float)((int8_t)(lo | (hi << 4)) - 32);
            const int half = e / 128, r = e % 128, s = r / 32, l = r % 32;
            const int ql = (qs[half * 32 + l] >> (2 * s)) & 3;
            const int qh = ((hm[e % 32] >> (e / 32)) & 1) ^ 1;
            y[e] = dl * (float)(ql - (qh << 2));
        }
        break;
    }
    case T_Q4_K: case T_Q5_K: { /* d dmin scales[12] [qh[32]] qs[128] */
        const float d = rdh(b), dmin = rdh(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (type == T_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j++) {
            uint8_t s, m;
            get_scale_min_k4(sc, j, &s, &m);
            const float dd = d * (float)s, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF;
                if (type == T_Q5_K) q |= ((qh[l] >> j) & 1) << 4;
                y[j * 32 + l] = dd * (float)q - dm;
            }
        }
        break;
    }
    case T_Q6_K: { /* ql[128] qh[64] scales[16] d */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = rdh(b + 208);
        for (int e = 0; e < QK_K; e++) {
            const int c = e / 32, l = e % 32, h = c / 4, s = (c % 4) / 2, p = (c % 2) * 32 + l;
            const int lo = (ql[h * 64 + p] >> (4 * s)) & 0xF;
            const int hi = (qh[h * 32 + l] >> (2 * (c % 4))) & 3;
            y[e] = (d * (float)sc[e / 16]) * (float)((int8_t)(lo | (hi << 4)) - 32);
        }
        break;
    }
    case T_IQ4_XS: { /* d scales_h(u16) scales_l[4] qs[128] */
        const float d = rdh(b);
        const uint16_t sh = rd16(b + 2);
        const uint8_t *sl = b + 4, *qs = b + 8;
        for (int j = 0; j < 8; j++) {
            const int lo = (sl[j / 2] >> (4 * (j % 2))) & 0xF, hi = (sh >> (2 * j)) & 3;
            const float dl = d * (float)((int8_t)(lo | (hi << 4)) - 32);
            for (int l = 0; l < 32; l++)
                y[j * 32 + l] = dl * (float)kvalues_iq4nl[(qs[j * 16 + l % 16] >> (4 * (l / 16))) & 0xF];
        }
        break;
    }
    }
}

static void dequant_row(int type, const uint8_t *src, int64_t n, float *y) {
    switch (type) {
    case T_F32: memcpy(y, src, (size_t)n * 4); return;
    case T_F16: {
        int64_t i = 0;
#ifdef STRATA_AVX2
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
#endif
        for (; i < n; i++) y[i] = f16_to_f32(rd16(src + 2 * i));
        return;
    }
    case T_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)rd16(src + 2 * i) << 16;
            memcpy(y + i, &bits, 4);
        }
        return;
    default: {
        int elems, bytes;
        block_of(type, &elems, &bytes);
        for (int64_t i = 0; i < n / elems; i++) dequant_block(type, src + i * bytes, y + i * elems);
    }
    }
}

/* ---- dot products of one weight row with m token rows
 * The kernels are specialised on the rows per pass M (1..4, constants after inlining, so the accumulators live in
 * registers) and use A accumulators per row so that no FMA chain waits on the one before it (4-cycle latency):
 * M = 1 -> 4 chains, M = 2..4 -> 2 chains per row. More than 4 rows: passes of 4 (the weight row is in L1 by then).
 */
#define PASS_M 4
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 1088 /* bytes ahead of the block being read (32 blocks) */
#endif

#ifdef STRATA_AVX2
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Q8_0 straight from the 34-byte blocks: w = q * d (exactly the dequantized float), then FMA with each row. */
static inline __attribute__((always_inline)) void q8_pass(const uint8_t *row, int nb, const float *const *xs,
                                                          float *out, const int M, const int A) {
    __m256 acc[PASS_M][4];
    for (int r = 0; r < M; r++)
        for (int a = 0; a < A; a++) acc[r][a] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + 34 * b;
        if (!(b & 1)) __builtin_prefetch(blk + PREFETCH_AHEAD);
        const __m256 d = _mm256_set1_ps(f16_to_f32(rd16(blk)));
        __m256 w[4];  /* sign-extending loads of 8 codes each (no shuffles of a 32-byte register) */
        for (int v = 0; v < 4; v++)
            w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                       _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * v)))), d);
        for (int r = 0; r < M; r++) {
            const float *xb = xs[r] + 32 * b;
            for (int v = 0; v < 4; v++)
                acc[r][v % A] = _mm256_fmadd_ps(w[v], _mm256_loadu_ps(xb + 8 * v), acc[r][v % A]);
        }
    }
    for (int r = 0; r < M; r++) {
        __m256 t = acc[r][0];
        for (int a = 1; a < A; a++) t = _mm256_add_ps(t, acc[r][a]);
        out[r] = hsum(t);
    }
}

/* float32 weights (F32 rows, or a row dequantized into scratch), n a multiple of 8 */
static inline __attribute__((always_inline)) void f32_pass(const float *w, int n, const float *const *xs,
                                                           float *out, const int M, const int A) {
    __m256 acc[PASS_M][4];
    for (int r = 0; r < M; r++)
        for (int a = 0; a < A; a++) acc[r][a] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 32) {
        if (!(i & 63)) __builtin_prefetch(w + i + 512);
        for (int v = 0; v < 4 && i + 8 * v < n; v++) {
            const __m256 wv = _mm256_loadu_ps(w + i + 8 * v);
            for (int r = 0; r < M; r++)
                acc[r][v % A] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[r] + i + 8 * v), acc[r][v % A]);
        }
    }
    for (int r = 0; r < M; r++) {
        __m256 t = acc[r][0];
        for (int a = 1; a < A; a++) t = _mm256_add_ps(t, acc[r][a]);
        out[r] = hsum(t);
    }
}

static void dot_q8_0_rows(const uint8_t *row, int n, const float *const *xs, int m, float *out) {
    for (int r0 = 0; r0 < m; r0 += PASS_M) {
        switch (m - r0 < PASS_M ? m - r0 : PASS_M) {
        case 1: q8_pass(row, n / 32, xs + r0, out + r0, 1, 4); break;
        case 2: q8_pass(row, n / 32, xs + r0, out + r0, 2, 2); break;
        case 3: q8_pass(row, n / 32, xs + r0, out + r0, 3, 2); break;
        default: q8_pass(row, n / 32, xs + r0, out + r0, 4, 2); break;
        }
    }
}
#endif

static void dot_f32_rows(const float *w, int n, const float *const *xs, int m, float *out) {
#ifdef STRATA_AVX2
    if (n % 8 == 0) {
        for (int r0 = 0; r0 < m; r0 += PASS_M) {
            switch (m - r0 < PASS_M ? m - r0 : PASS_M) {
            case 1: f32_pass(w, n, xs + r0, out + r0, 1, 4); break;
            case 2: f32_pass(w, n, xs + r0, out + r0, 2, 2); break;
            case 3: f32_pass(w, n, xs + r0, out + r0, 3, 2); break;
            default: f32_pass(w, n, xs + r0, out + r0, 4, 2); break;
            }
        }
        return;
    }
#endif
    for (int r = 0; r < m; r++) {
        float s[8] = {0};
        for (int i = 0; i < n; i++) s[i % 8] += w[i] * xs[r][i];
        out[r] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    }
}

/* one weight row (type, n elements) against m token rows; buf = n floats of scratch */
static void row_dots(int type, const uint8_t *row, int n, const float *const *xs, int m, float *out, float *buf) {
#ifdef STRATA_AVX2
    if (type == T_Q8_0) {
        dot_q8_0_rows(row, n, xs, m, out);
        return;
    }
#endif
    if (type == T_F32) {
        dot_f32_rows((const float *)row, n, xs, m, out);
        return;
    }
    dequant_row(type, row, n, buf);
    dot_f32_rows(buf, n, xs, m, out);
}

static int row_ok(int type, int n) {
    int elems, bytes;
    return block_of(type, &elems, &bytes) == 0 && n % elems == 0;
}

/* y[dst[i]] = down_g · (silu(gate_g · x[tok[i]]) * (up_g · x[tok[i]])) for every entry i of every group g */
int strata_pool_swiglu(int n_threads, int H, int F, int G, const uint64_t *gate, const uint64_t *up,
                       const uint64_t *down, int64_t gate_row, int64_t up_row, int64_t down_row, int gate_type,
                       int up_type, int down_type, const int32_t *start, const int32_t *tok, const int32_t *dst,
                       const float *x, float *y, float *h) {
    if (!row_ok(gate_type, H) || !row_ok(up_type, H) || !row_ok(down_type, F)) return -1;
    const int items_gu = (F + ROWS_GATE_UP - 1) / ROWS_GATE_UP, items_dn = (H + ROWS_DOWN - 1) / ROWS_DOWN;
    int failed = 0;
#pragma omp parallel num_threads(n_threads)
    {
        float *buf = (float *)malloc(sizeof(float) * (size_t)(H > F ? H : F));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        const float *xs[MAX_M];
        float gv[MAX_M], uv[MAX_M];
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < G * items_gu; item++) {
            if (!buf) continue;
            const int g = item / items_gu, f0 = (item % items_gu) * ROWS_GATE_UP;
            const int f1 = f0 + ROWS_GATE_UP < F ? f0 + ROWS_GATE_UP : F;
            const uint8_t *wg = (const uint8_t *)(uintptr_t)gate[g], *wu = (const uint8_t *)(uintptr_t)up[g];
            for (int e0 = start[g]; e0 < start[g + 1]; e0 += MAX_M) {
                const int m = start[g + 1] - e0 < MAX_M ? start[g + 1] - e0 : MAX_M;
                for (int r = 0; r < m; r++) xs[r] = x + (int64_t)tok[e0 + r] * H;
                for (int f = f0; f < f1; f++) {
                    row_dots(gate_type, wg + f * gate_row, H, xs, m, gv, buf);
                    row_dots(up_type, wu + f * up_row, H, xs, m, uv, buf);
                    for (int r = 0; r < m; r++) {
                        const float s = gv[r] * (1.0f / (1.0f + expf(-gv[r])));
                        h[(int64_t)(e0 + r) * F + f] = s * uv[r];
                    }
                }
            }
        }
        /* implicit barrier: every h row is complete */
        float out[MAX_M];
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < G * items_dn; item++) {
            if (!buf) continue;
            const int g = item / items_dn, d0 = (item % items_dn) * ROWS_DOWN;
            const int d1 = d0 + ROWS_DOWN < H ? d0 + ROWS_DOWN : H;
            const uint8_t *wd = (const uint8_t *)(uintptr_t)down[g];
            for (int e0 = start[g]; e0 < start[g + 1]; e0 += MAX_M) {
                const int m = start[g + 1] - e0 < MAX_M ? start[g + 1] - e0 : MAX_M;
                for (int r = 0; r < m; r++) xs[r] = h + (int64_t)(e0 + r) * F;
                for (int d = d0; d < d1; d++) {
                    row_dots(down_type, wd + d * down_row, F, xs, m, out, buf);
                    for (int r = 0; r < m; r++) y[(int64_t)dst[e0 + r] * H + d] = out[r];
                }
            }
        }
        free(buf);
    }
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

/* spin until *word >= want or max_ns passed (the caller loops, checking its stream between slices) */
uint32_t strata_wait_geq(const uint32_t *word, uint32_t want, int64_t max_ns) {
    uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (v >= want) return v;
    const int64_t end = now_ns() + max_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
            if (v >= want) return v;
            cpu_relax();
        }
        if (now_ns() >= end) return v;
    }
}

void strata_raise(uint32_t *word, uint32_t value) {
    uint32_t cur = __atomic_load_n(word, __ATOMIC_RELAXED);
    while (cur < value && !__atomic_compare_exchange_n(word, &cur, value, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void strata_store(uint32_t *word, uint32_t value) {
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
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
