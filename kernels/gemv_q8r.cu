// gemv_q8r.cu: GEMVs over Q8_0 weights repacked for streaming ("Q8_0_R32"), R output rows per lane.
//
//   y[t, o] = act(sum_i W[o, i] * x[t, i] / div) * (mul ? mul[t * mul_st + o * mul_so] : 1)   (as gemv.cu)
//
// Why a second layout: a GGUF Q8_0 block is 34 bytes, so raw rows only allow 2-byte loads and a warp needs a
// cross-lane reduction per row. Repacked, a warp's 16-byte loads move 512 contiguous bytes and lane l receives the
// quants of its own row, so each row's sum stays in one lane and x values are warp-uniform loads.
//
// Layout (strata_cli/model/packed.py packs and unpacks it in numpy). Rows come in groups of 32; a matrix of
// n_out rows (n_out % 32 == 0; for experts, every expert's rows) with nb = n_in / 32 blocks per row stores group g
// at g * G, G = nb * 1088 bytes (the size of 32 raw rows):
//   quants  [nb][2 halves][32 lanes][16 int8]  at byte ((b * 2 + h) * 32 + l) * 16   (row 32g+l, inputs 32b+16h..)
//   scales  [nb][32 lanes] fp16                at byte nb * 1024 + (b * 32 + l) * 2
// Legend: T window rows (NT = bucket 1..16), n_in / n_out widths, J (row, slot) entries of the MoE, E experts,
// R row groups per warp (lane l owns rows 32 (g0 + r) + l).
// Work split: a warp owns R row groups; one x load (a warp-uniform float4) feeds 4 R FMAs, which is what keeps a
// window of 4-16 rows from being bound by x loads; R = 1 at T = 1 keeps more warps streaming. The GEMV_WARPS
// warps of a block form GEMV_WARPS / ksplit sets of ksplit warps that take interleaved blocks of the input axis
// (split-K), added in shared memory; blocks along z split further (the last block of a tile finishes:
// common.cuh's zsplit_finish). Weights are d * q exactly as numpy dequantizes them; float32 accumulation.
#include "common.cuh"

#define Q8R_GROUP 32
#define Q8R_BLOCK_BYTES 1088  // one Q8_0 block of 32 rows: 1024 quant bytes + 32 fp16 scales
#ifndef Q8R_INFLIGHT  // group-blocks of loads in flight per warp (a ring in registers); bench/gemv_bench.py
#define Q8R_INFLIGHT 2
#endif

// Row groups per warp for the window bucket NT (strata_cli/gpu/launch_util.py Q8R_LANE_ROWS mirrors it).
constexpr int q8r_rows(int nt) { return nt == 1 ? 1 : (nt == 2 || nt == 16) ? 2 : 4; }

// Four int8 in a word -> exact floats without I2F (a quarter-rate conversion on sm_90): bias each byte to
// unsigned, splice it into the mantissa of 2^23 and subtract 2^23 + 128.
__device__ __forceinline__ void s8x4_to_float(int word, float* f) {
    const u32 u = (u32)word ^ 0x80808080u;
    f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
    f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
    f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
    f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}

__device__ __forceinline__ int word_of(const int4& qa, const int4& qb, int j) {
    switch (j) {
        case 0: return qa.x;
        case 1: return qa.y;
        case 2: return qa.z;
        case 3: return qa.w;
        case 4: return qb.x;
        case 5: return qb.y;
        case 6: return qb.z;
        default: return qb.w;
    }
}

// Block b of the warp's first `live` row groups (q, d point at group g0's quants / scales for this lane;
// gq, gd = one group's stride in int4 / u16 units).
template <int R>
__device__ __forceinline__ void q8r_load(const int4* q, const u16* d, i64 gq, i64 gd, int b, int live,
                                         int4 (&qa)[R], int4 (&qb)[R], u16 (&dd)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < live) {
            qa[r] = __ldg(q + r * gq + b * 64);
            qb[r] = __ldg(q + r * gq + b * 64 + 32);
            dd[r] = __ldg(d + r * gd + b * 32);
        }
    }
}

// acc[r][t] += sum over block b of (d q)[row r] * x[xr[t]]. Rows past `live` compute on stale registers and are
// never stored.
template <int NT, int R>
__device__ __forceinline__ void q8r_block(const int4 (&qa)[R], const int4 (&qb)[R], const u16 (&dd)[R], int b,
                                          const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                          float (&acc)[R][NT]) {
    float d[R];
#pragma unroll
    for (int r = 0; r < R; ++r) d[r] = f16_bits_to_float(dd[r]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float w[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            s8x4_to_float(word_of(qa[r], qb[r], j), w[r]);
#pragma unroll
            for (int k = 0; k < 4; ++k) w[r][k] *= d[r];
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {  // the same address in every lane: one broadcast load feeds 4 R FMAs
                const float4 v = __ldg(reinterpret_cast<const float4*>(x + (i64)xr[t] * n_in + b * 32) + j);
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[r][t] = fmaf(w[r][3], v.w, fmaf(w[r][2], v.z, fmaf(w[r][1], v.y, fmaf(w[r][0], v.x,
                                                                                            acc[r][t]))));
            }
        }
    }
}

// acc[r][t] += (this warp's K slice of) row 32 (g0 + r) + lane . x[xr[t]]; grp0 = group g0's first byte.
// The warp takes blocks b = kslice, kslice + kstride, ...; each ring slot is refilled with the block DEPTH steps
// ahead as soon as it is consumed, so the next blocks' loads overlap this block's arithmetic.
template <int NT, int R>
__device__ __forceinline__ void q8r_slice(const u8* __restrict__ grp0, int live, int nb,
                                          const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                          int kslice, int kstride, float (&acc)[R][NT]) {
    constexpr int DEPTH = Q8R_INFLIGHT / R > 1 ? Q8R_INFLIGHT / R : 2;
    const int lane = threadIdx.x & (WARP - 1);
    const i64 group_bytes = (i64)nb * Q8R_BLOCK_BYTES;
    const int4* q = reinterpret_cast<const int4*>(grp0) + lane;
    const u16* d = reinterpret_cast<const u16*>(grp0 + (i64)nb * 1024) + lane;
    int4 qa[DEPTH][R], qb[DEPTH][R];
    u16 dd[DEPTH][R];
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
        const int b = kslice + i * kstride;
        if (b < nb) q8r_load<R>(q, d, group_bytes / 16, group_bytes / 2, b, live, qa[i], qb[i], dd[i]);
    }
    for (int base = kslice; base < nb; base += DEPTH * kstride) {
#pragma unroll
        for (int i = 0; i < DEPTH; ++i) {
            const int b = base + i * kstride;
            if (b < nb) {
                int4 ca[R], cb[R];
                u16 cd[R];
#pragma unroll
                for (int r = 0; r < R; ++r) { ca[r] = qa[i][r]; cb[r] = qb[i][r]; cd[r] = dd[i][r]; }
                const int ahead = b + DEPTH * kstride;
                if (ahead < nb)
                    q8r_load<R>(q, d, group_bytes / 16, group_bytes / 2, ahead, live, qa[i], qb[i], dd[i]);
                q8r_block<NT, R>(ca, cb, cd, b, x, xr, nt, n_in, acc);
            }
        }
    }
}

// Sum the ksplit warps of each warp set; the set's first warp writes rows 32 (g0 + r) + lane, r < live, of every
// window row. Every warp of the block must call it (it holds a barrier when ksplit > 1).
template <int NT, int R>
__device__ __forceinline__ void q8r_store(float (&acc)[R][NT], int g0, int live, int n_out, int nt, int ksplit,
                                          int kslice, int set, float* y, const int (&y_rows)[NT], int act,
                                          float div, const float* mul, int mul_st, int mul_so) {
    __shared__ float part[GEMV_WARPS][R][NT][WARP];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    if (!ksplit_reduce(acc, ksplit, kslice, true, [&](int r, int t) -> float& { return part[warp][r][t][lane]; },
                       [&](int s, int r, int t) { return part[set * ksplit + s][r][t][lane]; }))
        return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int o = (g0 + r) * Q8R_GROUP + lane;
        if (r >= live || o >= n_out) continue;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const i64 row = y_rows[t];
                y[row * n_out + o] = gemv_epilogue(acc[r][t], act, div, mul, row * mul_st + (i64)o * mul_so);
            }
        }
    }
}

// grid (ceil(n_groups / (R * GEMV_WARPS / ksplit)), ceil(T / GEMV_MAXT), zsplit), block GEMV_WARPS * 32.
// zsplit > 1: raw sums to partial[z][t][o]; the tile's last block adds them and applies the epilogue.
template <int NT>
__device__ __forceinline__ void q8r_dense(const u8* W, int nb, const float* x, int n_in, float* y, int n_out,
                                          int T, int ksplit, int act, float div, const float* mul, int mul_st,
                                          int mul_so, float* partial, unsigned* tile_done) {
    constexpr int R = q8r_rows(NT);
    const int warp = threadIdx.x / WARP, set = warp / ksplit;
    const int kslice = warp % ksplit + blockIdx.z * ksplit, kstride = ksplit * gridDim.z;
    const int g0 = (blockIdx.x * (GEMV_WARPS / ksplit) + set) * R;
    const int live = min(R, n_out / Q8R_GROUP - g0);
    const int rows_per_block = Q8R_GROUP * R * (GEMV_WARPS / ksplit);
    dense_dot_store<NT, R>(
        T, y, n_out, blockIdx.x * rows_per_block, rows_per_block, act, div, mul, mul_st, mul_so, partial, tile_done,
        [&](auto& acc, const auto& xs, int n, int t0) {
            if (live > 0)
                q8r_slice(W + (i64)g0 * nb * Q8R_BLOCK_BYTES, live, nb, x + (i64)t0 * n_in, xs, n, n_in, kslice,
                          kstride, acc);
        },
        [&](auto& acc, const auto& ys, int n, float* dst, int a, float d, const float* m, int mst, int mso) {
            q8r_store(acc, g0, live, n_out, n, ksplit, warp % ksplit, set, dst, ys, a, d, m, mst, mso);
        });
}

// Grouped experts, as gemv.cu's gemv_grouped: group u = blockIdx.y holds up to GEMV_MAXT (row, slot) entries
// routed to expert g_expert[u]; entry j reads x row j / x_div and writes y row j. Empty groups leave at once; an
// expert id outside 0..E-1 writes NaN to its entries' rows.
template <int NT>
__device__ __forceinline__ void q8r_grouped(const u8* W, i64 expert_stride, int n_expert, const int* g_expert,
                                            const int* g_count, const int* g_entries, const float* x, int x_div,
                                            int n_in, float* y, int n_out, int ksplit, int act, float div,
                                            const float* mul, int mul_st, int mul_so) {
    constexpr int R = q8r_rows(NT);
    const int u = blockIdx.y;
    const int nt = min(g_count[u], NT);
    if (nt == 0) return;  // uniform per block: no barrier is left waiting
    const int e = g_expert[u];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const int set = warp / ksplit, kslice = warp % ksplit;
    const int g0 = (blockIdx.x * (GEMV_WARPS / ksplit) + set) * R;
    const int live = min(R, n_out / Q8R_GROUP - g0);
    const int nb = n_in / QK8_0;
    int rows[NT], xr[NT];
    expert_group_rows<NT>(g_entries, u, nt, x_div, rows, xr);
    if (e < 0 || e >= n_expert) {
        if (kslice == 0)
            for (int r = 0; r < live; ++r)
                for (int t = 0; t < nt; ++t) y[(i64)rows[t] * n_out + (g0 + r) * Q8R_GROUP + lane] = QNAN;
        return;
    }
    const u8* grp0 = W + (i64)e * expert_stride + (i64)g0 * nb * Q8R_BLOCK_BYTES;
    grouped_dot_store<NT, R>(
        nt, xr, rows,
        [&](auto& acc, const auto& xs, int n) {
            if (live > 0) q8r_slice(grp0, live, nb, x, xs, n, n_in, kslice, ksplit, acc);
        },
        [&](auto& acc, const auto& ys, int n) {
            q8r_store(acc, g0, live, n_out, n, ksplit, kslice, set, y, ys, act, div, mul, mul_st, mul_so);
        });
}

// Raw GGUF Q8_0 rows -> the layout above; one thread per (group, block, lane). n_rows % 32 == 0.
extern "C" __global__ void __launch_bounds__(256) q8r_pack(const u8* __restrict__ raw, i64 n_rows, int nb,
                                                          u8* __restrict__ packed) {
    const i64 n = n_rows * nb;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const int l = (int)(i % Q8R_GROUP);
        const i64 gb = i / Q8R_GROUP;
        const int b = (int)(gb % nb);
        const i64 g = gb / nb;
        const u8* src = raw + ((g * Q8R_GROUP + l) * nb + b) * Q8_0_BYTES;
        u8* grp = packed + g * nb * Q8R_BLOCK_BYTES;
        u8* q = grp + ((i64)b * 2 * Q8R_GROUP + l) * 16;
        for (int k = 0; k < 16; ++k) q[k] = src[2 + k];
        for (int k = 0; k < 16; ++k) q[Q8R_GROUP * 16 + k] = src[18 + k];
        u8* d = grp + (i64)nb * 1024 + ((i64)b * Q8R_GROUP + l) * 2;
        d[0] = src[0];
        d[1] = src[1];
    }
}

#define Q8R_DENSE_KERNEL(NT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                              \
        gemv_q8r_t##NT(const u8* W, int nb, const float* x, int n_in, float* y, int n_out, int T, int ksplit,   \
                       int act, float div, const float* mul, int mul_st, int mul_so, float* partial,            \
                       unsigned* tile_done) {                                                                    \
        q8r_dense<NT>(W, nb, x, n_in, y, n_out, T, ksplit, act, div, mul, mul_st, mul_so, partial, tile_done);  \
    }

#define Q8R_GROUPED_KERNEL(NT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                              \
        gemv_expert_q8r_t##NT(const u8* W, i64 expert_stride, int n_expert, const int* g_expert,                \
                              const int* g_count, const int* g_entries, const float* x, int x_div, int n_in,    \
                              float* y, int n_out, int ksplit, int act, float div, const float* mul, int mul_st, \
                              int mul_so) {                                                                      \
        q8r_grouped<NT>(W, expert_stride, n_expert, g_expert, g_count, g_entries, x, x_div, n_in, y, n_out,     \
                        ksplit, act, div, mul, mul_st, mul_so);                                                  \
    }

// grid (ceil(n_groups / (R * GEMV_WARPS / ksplit)), ceil(T / GEMV_MAXT), zsplit)
Q8R_DENSE_KERNEL(1)
Q8R_DENSE_KERNEL(2)
Q8R_DENSE_KERNEL(4)
Q8R_DENSE_KERNEL(8)
Q8R_DENSE_KERNEL(16)

// grid (ceil(groups per expert / (R * GEMV_WARPS / ksplit)), J groups)
Q8R_GROUPED_KERNEL(1)
Q8R_GROUPED_KERNEL(2)
Q8R_GROUPED_KERNEL(4)
Q8R_GROUPED_KERNEL(8)
Q8R_GROUPED_KERNEL(16)
