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
// The grouped expert GEMVs keep more in flight: at T = 1 (one row group a warp) a routed launch is 1600-3200 warps
// of 5-10 blocks each (gate / up [640 x 2560]: 10 experts x 20 groups x ksplit 8), so with 2 blocks (2.2 KB) a warp
// an SM holds ~26 KB of reads in flight, about half of what 4.26 TB/s x ~1.5 us of loaded latency / 132 SMs asks
// (~48 KB); at T = 2 (2 row groups, the same 2 blocks: twice the bytes a warp) they measured 46 % of the copy rate
// against 25 % at T = 1 (H200, 35b700f). 4 at T = 1 (~52 KB an SM) measured slower than 2 on the H200 at ed54e55
// (bench/quant_gemv_bench.py, Q8_0 experts on the real shapes, moe GB/s: 1218 against 1376; T = 2..8 within 3 %),
// so the ring stays at 2 blocks.
#define Q8R_EXPERT_INFLIGHT 2

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
// gq, gd = one group's stride in int4 / u16 units). RH < R (the gate/up kernel): rows RH.. are the same row groups
// of a second matrix (q1, d1), both loaded while their row group is live.
template <int R, int RH = R>
__device__ __forceinline__ void q8r_load(const int4* q, const u16* d, const int4* q1, const u16* d1, i64 gq, i64 gd,
                                         int b, int live, int4 (&qa)[R], int4 (&qb)[R], u16 (&dd)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int rr = r < RH ? r : r - RH;  // compile-time: r is unrolled
        const int4* qr = r < RH ? q : q1;
        const u16* dr = r < RH ? d : d1;
        if (rr < live) {
            qa[r] = __ldg(qr + rr * gq + b * 64);
            qb[r] = __ldg(qr + rr * gq + b * 64 + 32);
            dd[r] = __ldg(dr + rr * gd + b * 32);
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

// acc[r][t] += (this warp's K slice of) row 32 (g0 + r) + lane . x[xr[t]]; grp0 = group g0's first byte (RH0 > 0,
// the gate/up kernel: rows RH0.. from grp1, the same row groups of a second matrix).
// The warp takes blocks b = kslice, kslice + kstride, ...; each ring slot is refilled with the block DEPTH steps
// ahead as soon as it is consumed, so the next blocks' loads overlap this block's arithmetic.
template <int RH0 = 0, int INFLIGHT = Q8R_INFLIGHT, int NT, int R>
__device__ __forceinline__ void q8r_slice(const u8* __restrict__ grp0, const u8* __restrict__ grp1, int live, int nb,
                                          const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                          int kslice, int kstride, float (&acc)[R][NT]) {
    constexpr int RH = RH0 ? RH0 : R;  // RH0 0: every row from grp0
    constexpr int DEPTH = INFLIGHT / R > 1 ? INFLIGHT / R : 2;
    const int lane = threadIdx.x & (WARP - 1);
    const i64 group_bytes = (i64)nb * Q8R_BLOCK_BYTES;
    const int4* q = reinterpret_cast<const int4*>(grp0) + lane;
    const u16* d = reinterpret_cast<const u16*>(grp0 + (i64)nb * 1024) + lane;
    const int4* q1 = reinterpret_cast<const int4*>(grp1) + lane;
    const u16* d1 = reinterpret_cast<const u16*>(grp1 + (i64)nb * 1024) + lane;
    const i64 gq = group_bytes / 16, gd = group_bytes / 2;
    int4 qa[DEPTH][R], qb[DEPTH][R];
    u16 dd[DEPTH][R];
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
        const int b = kslice + i * kstride;
        if (b < nb) q8r_load<R, RH>(q, d, q1, d1, gq, gd, b, live, qa[i], qb[i], dd[i]);
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
                if (ahead < nb) q8r_load<R, RH>(q, d, q1, d1, gq, gd, ahead, live, qa[i], qb[i], dd[i]);
                q8r_block<NT, R>(ca, cb, cd, b, x, xr, nt, n_in, acc);
            }
        }
    }
}

// Sum the ksplit warps of each warp set; the set's first warp writes rows 32 (g0 + r) + lane, r < live, of every
// window row. Every warp of the block must call it (it holds a barrier when ksplit > 1). RH0 > 0 (the gate/up
// kernel): acc rows 0..RH0-1 gate, RH0.. the same up rows, and y = silu(gate) * up for r < RH0 (act, div, mul
// unused).
template <int RH0 = 0, int NT, int R>
__device__ __forceinline__ void q8r_store(float (&acc)[R][NT], int g0, int live, int n_out, int nt, int ksplit,
                                          int kslice, int set, float* y, const int (&y_rows)[NT], int act,
                                          float div, const float* mul, int mul_st, int mul_so) {
    constexpr int RO = RH0 ? RH0 : R;  // output row groups
    __shared__ float part[GEMV_WARPS][R][NT][WARP];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    if (!ksplit_reduce(acc, ksplit, kslice, true, [&](int r, int t) -> float& { return part[warp][r][t][lane]; },
                       [&](int s, int r, int t) { return part[set * ksplit + s][r][t][lane]; }))
        return;
#pragma unroll
    for (int r = 0; r < RO; ++r) {
        const int o = (g0 + r) * Q8R_GROUP + lane;
        if (r >= live || o >= n_out) continue;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const i64 row = y_rows[t];
                if constexpr (RH0 > 0)
                    y[row * n_out + o] = apply_act(acc[r][t], ACT_SILU) * acc[RH0 + r][t];
                else
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
                q8r_slice(W + (i64)g0 * nb * Q8R_BLOCK_BYTES, W + (i64)g0 * nb * Q8R_BLOCK_BYTES, live, nb,
                          x + (i64)t0 * n_in, xs, n, n_in, kslice, kstride, acc);
        },
        [&](auto& acc, const auto& ys, int n, float* dst, int a, float d, const float* m, int mst, int mso) {
            q8r_store(acc, g0, live, n_out, n, ksplit, warp % ksplit, set, dst, ys, a, d, m, mst, mso);
        });
}

// Row groups per warp and matrix of the gate/up kernel (launch_util.Q8R_GATEUP_ROWS mirrors it): half the plain
// kernel's, so a warp holds as many accumulators and loads in flight as a plain launch's warp.
constexpr int q8r_gateup_rows(int nt) { return q8r_rows(nt) > 1 ? q8r_rows(nt) / 2 : 1; }

// The grouped experts' driver (q8r_grouped, q8t_grouped), as gemv.cu's gemv_grouped: group u = blockIdx.y holds up
// to NT (row, slot) entries routed to expert g_expert[u]; entry j reads x row j / x_div and writes y row j. Empty
// groups leave at once (uniform per block: no barrier is left waiting); an expert id outside 0..E-1 writes NaN to
// its entries' rows. body(grp0, grp1, g0, live, set, kslice, nt, rows, xr) computes and stores this warp's RG row
// groups g0 .. g0 + live - 1 (grp0: their first byte in the group's expert of W, grp1 the same of Wu, a second
// matrix read beside it: the gate/up kernel's up; Wu = W where there is none) for entries rows (x rows xr). Every
// warp of the block calls it.
template <int NT, int RG, typename Body>
__device__ __forceinline__ void q8r_groups(const u8* W, const u8* Wu, i64 expert_stride, int n_expert,
                                           const int* g_expert, const int* g_count, const int* g_entries, int x_div,
                                           int n_in, float* y, int n_out, int ksplit, Body body) {
    const int u = blockIdx.y;
    const int nt = min(g_count[u], NT);
    if (nt == 0) return;
    const int e = g_expert[u];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const int set = warp / ksplit, kslice = warp % ksplit;
    const int g0 = (blockIdx.x * (GEMV_WARPS / ksplit) + set) * RG;
    const int live = min(RG, n_out / Q8R_GROUP - g0);
    int rows[NT], xr[NT];
    expert_group_rows<NT>(g_entries, u, nt, x_div, rows, xr);
    if (e < 0 || e >= n_expert) {
        if (kslice == 0)
            for (int r = 0; r < live; ++r)
                for (int t = 0; t < nt; ++t) y[(i64)rows[t] * n_out + (g0 + r) * Q8R_GROUP + lane] = QNAN;
        return;
    }
    const i64 off = (i64)e * expert_stride + (i64)g0 * (n_in / QK8_0) * Q8R_BLOCK_BYTES;
    body(W + off, Wu + off, g0, live, set, kslice, nt, rows, xr);
}

// Grouped experts on CUDA cores (q8r_groups' groups; single-entry groups run one accumulator column).
// GATEUP (gemv_q8r_gateup_t<NT>; gemv_quant.cu qtc_gateup_*'s arithmetic): the gate (W) and up (Wu) projections
// in one pass, RH = q8r_gateup_rows(NT) row groups of each per warp: acc rows 0..RH-1 gate, RH..2RH-1 the same up
// rows, loaded together (an expert's gate and up bytes in flight at once, read once for all its entries), then
//   y[j, o] = silu(gate_e[o] . x[j / x_div]) * (up_e[o] . x[j / x_div])
// (the two-launch path's values: up's epilogue is the plain sum, gate's silu(sum) * up; act, div and mul unused).
template <int NT, bool GATEUP = false>
__device__ __forceinline__ void q8r_grouped(const u8* W, const u8* Wu, i64 expert_stride, int n_expert,
                                            const int* g_expert, const int* g_count, const int* g_entries,
                                            const float* x, int x_div, int n_in, float* y, int n_out, int ksplit,
                                            int act, float div, const float* mul, int mul_st, int mul_so) {
    constexpr int RH = GATEUP ? q8r_gateup_rows(NT) : q8r_rows(NT);  // row groups per warp and matrix
    constexpr int R = GATEUP ? 2 * RH : RH;
    const int nb = n_in / QK8_0;
    q8r_groups<NT, RH>(W, GATEUP ? Wu : W, expert_stride, n_expert, g_expert, g_count, g_entries, x_div, n_in, y,
                       n_out, ksplit,
                       [&](const u8* grp0, const u8* grp1, int g0, int live, int set, int kslice, int nt,
                           const int (&rows)[NT], const int (&xr)[NT]) {
                           grouped_dot_store<NT, R>(
                               nt, xr, rows,
                               [&](auto& acc, const auto& xs, int n) {
                                   if (live > 0)
                                       q8r_slice<GATEUP ? RH : 0, Q8R_EXPERT_INFLIGHT>(grp0, grp1, live, nb, x, xs,
                                                                                       n, n_in, kslice, ksplit, acc);
                               },
                               [&](auto& acc, const auto& ys, int n) {
                                   q8r_store<GATEUP ? RH : 0>(acc, g0, live, n_out, n, ksplit, kslice, set, y, ys,
                                                              act, div, mul, mul_st, mul_so);
                               });
                       });
}

// Raw GGUF Q8_0 rows -> the layout above; one thread per (group, block, lane). n_rows % 32 == 0.
extern "C" __global__ void __launch_bounds__(256) q8r_pack(const u8* __restrict__ raw, i64 n_rows, int nb,
                                                          u8* __restrict__ packed) {
    pdl_begin();
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
        pdl_prefetch_rows(W, (i64)nb * Q8R_BLOCK_BYTES, (i64)blockIdx.x * q8r_rows(NT) * (GEMV_WARPS / ksplit),  \
                          q8r_rows(NT) * (GEMV_WARPS / ksplit), n_out / Q8R_GROUP);                              \
        pdl_begin();                                                                                             \
        q8r_dense<NT>(W, nb, x, n_in, y, n_out, T, ksplit, act, div, mul, mul_st, mul_so, partial, tile_done);  \
    }

#define Q8R_GROUPED_KERNEL(NT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                              \
        gemv_expert_q8r_t##NT(const u8* W, i64 expert_stride, int n_expert, const int* g_expert,                \
                              const int* g_count, const int* g_entries, const float* x, int x_div, int n_in,    \
                              float* y, int n_out, int ksplit, int act, float div, const float* mul, int mul_st, \
                              int mul_so) {                                                                      \
        pdl_begin();                                                                                             \
        q8r_grouped<NT>(W, W, expert_stride, n_expert, g_expert, g_count, g_entries, x, x_div, n_in, y, n_out,  \
                        ksplit, act, div, mul, mul_st, mul_so);                                                  \
    }

#define Q8R_GATEUP_KERNEL(NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                              \
        gemv_q8r_gateup_t##NT(const u8* Wg, const u8* Wu, i64 expert_stride, int n_expert, const int* g_expert,  \
                              const int* g_count, const int* g_entries, const float* x, int x_div, int n_in,    \
                              float* y, int n_out, int ksplit) {                                                 \
        pdl_begin();                                                                                             \
        q8r_grouped<NT, true>(Wg, Wu, expert_stride, n_expert, g_expert, g_count, g_entries, x, x_div, n_in, y, \
                              n_out, ksplit, ACT_NONE, 1.0f, nullptr, 0, 0);                                     \
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

// grid (ceil(groups per expert / (RH * GEMV_WARPS / ksplit)), J groups)
Q8R_GATEUP_KERNEL(1)
Q8R_GATEUP_KERNEL(2)
Q8R_GATEUP_KERNEL(4)
Q8R_GATEUP_KERNEL(8)
Q8R_GATEUP_KERNEL(16)

// A dense gate/up pair in one launch (the shared expert's, launch_gemv.launch_q8r_gateup; windows of T <= 2, where
// the dense GEMVs run on CUDA cores): y [T, F] = silu(Wg . x[t]) * (Wu . x[t]). A warp streams RH =
// q8r_gateup_rows(NT) row groups of each matrix together (acc rows 0..RH-1 gate, RH.. the same up rows: q8r_slice's
// gate/up ring), so the pair is one node with twice the bytes in flight a warp. The launcher gives it the K split
// (ksplit warps, zsplit blocks along z) launch_gemv gives either matrix alone; each sum then goes through the same
// lanes, ksplit_reduce and z order, and the two-launch path's epilogues (up plain into h, then gate's silu(sum) * h):
// the same bits as launching up, then gate with mul = h.
// grid (ceil(F / 32 / (RH * GEMV_WARPS / ksplit)), ceil(T / GEMV_MAXT), zsplit), block GEMV_WARPS * 32;
// zsplit > 1: raw sums to partial[z][t][o] (gate) and partial[z][t][F + o] (up), slices of T * 2F floats; the
// tile's last block (zsplit_last) adds them in z order.
template <int NT>
__device__ __forceinline__ void q8r_dense_gateup(const u8* Wg, const u8* Wu, int nb, const float* x, int n_in,
                                                 float* y, int F, int T, int ksplit, float* partial,
                                                 unsigned* tile_done) {
    constexpr int RH = q8r_gateup_rows(NT);
    constexpr int R = 2 * RH;
    __shared__ float part[GEMV_WARPS][R][NT][WARP];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP, set = warp / ksplit;
    const int kslice = warp % ksplit + blockIdx.z * ksplit, kstride = ksplit * gridDim.z;
    const int g0 = (blockIdx.x * (GEMV_WARPS / ksplit) + set) * RH;
    const int live = min(RH, F / Q8R_GROUP - g0);
    const int t0 = blockIdx.y * GEMV_MAXT, nt = min(NT, T - t0);
    const bool zsplit = gridDim.z > 1;
    int xr[NT];
    float acc[R][NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        xr[t] = t;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] = 0.0f;
    }
    if (live > 0) {
        const i64 off = (i64)g0 * nb * Q8R_BLOCK_BYTES;
        q8r_slice<RH>(Wg + off, Wu + off, live, nb, x + (i64)t0 * n_in, xr, nt, n_in, kslice, kstride, acc);
    }
    if (ksplit_reduce(acc, ksplit, warp % ksplit, true, [&](int r, int t) -> float& { return part[warp][r][t][lane]; },
                      [&](int s, int r, int t) { return part[set * ksplit + s][r][t][lane]; })) {
        float* slice = partial + (i64)blockIdx.z * T * 2 * F;  // only read with zsplit
#pragma unroll
        for (int r = 0; r < RH; ++r) {
            const int o = (g0 + r) * Q8R_GROUP + lane;
            if (r >= live || o >= F) continue;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t >= nt) continue;
                const i64 row = t0 + t;
                if (zsplit) {  // as dense_dot_store stores a z slice's sums (the plain epilogue)
                    slice[row * 2 * F + o] = gemv_epilogue(acc[r][t], ACT_NONE, 1.0f, nullptr, 0);
                    slice[row * 2 * F + F + o] = gemv_epilogue(acc[RH + r][t], ACT_NONE, 1.0f, nullptr, 0);
                } else {
                    y[row * F + o] = gemv_epilogue(acc[r][t], ACT_SILU, 1.0f, nullptr, 0) *
                                     gemv_epilogue(acc[RH + r][t], ACT_NONE, 1.0f, nullptr, 0);
                }
            }
        }
    }
    if (!zsplit || !zsplit_last(tile_done)) return;  // uniform per block: every thread meets zsplit_last's barriers
    const int rows = Q8R_GROUP * RH * (GEMV_WARPS / ksplit), o0 = blockIdx.x * rows;
    const i64 slice = (i64)T * 2 * F;
    for (int i = threadIdx.x; i < rows * nt; i += blockDim.x) {
        const int t = t0 + i / rows, o = o0 + i % rows;
        if (o >= F) continue;
        const i64 at = (i64)t * 2 * F + o;
        const float g = zsplit_sum(partial + at, slice, (int)gridDim.z);  // L2: other SMs wrote them
        const float u = zsplit_sum(partial + at + F, slice, (int)gridDim.z);
        y[(i64)t * F + o] = gemv_epilogue(g, ACT_SILU, 1.0f, nullptr, 0) * gemv_epilogue(u, ACT_NONE, 1.0f, nullptr, 0);
    }
}

#define Q8R_DENSE_GATEUP_KERNEL(NT)                                                                               \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                              \
        gemv_q8r_gateup_dense_t##NT(const u8* Wg, const u8* Wu, int nb, const float* x, int n_in, float* y,     \
                                    int F, int T, int ksplit, float* partial, unsigned* tile_done) {             \
        pdl_prefetch_rows(Wg, (i64)nb * Q8R_BLOCK_BYTES,                                                         \
                          (i64)blockIdx.x * q8r_gateup_rows(NT) * (GEMV_WARPS / ksplit),                         \
                          q8r_gateup_rows(NT) * (GEMV_WARPS / ksplit), F / Q8R_GROUP);                           \
        pdl_prefetch_rows(Wu, (i64)nb * Q8R_BLOCK_BYTES,                                                         \
                          (i64)blockIdx.x * q8r_gateup_rows(NT) * (GEMV_WARPS / ksplit),                         \
                          q8r_gateup_rows(NT) * (GEMV_WARPS / ksplit), F / Q8R_GROUP);                           \
        pdl_begin();                                                                                             \
        q8r_dense_gateup<NT>(Wg, Wu, nb, x, n_in, y, F, T, ksplit, partial, tile_done);                          \
    }

// windows of T <= 2 (the CUDA-core path; from T = 4 the dense GEMVs take tensor cores, two launches)
Q8R_DENSE_GATEUP_KERNEL(1)
Q8R_DENSE_GATEUP_KERNEL(2)

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core path for windows of T >= 2 (gemv_q8r_tc_t<NT>; launch_util.WINDOW_PATHS selects it from T = 4).
//
// Why: the CUDA-core kernel above spends per weight ~3 instructions to dequantize (2 prmt/fadd, 1 fmul by d) plus
// T FMAs, so at T = 8 ~11 lane-instructions per weight: the 675 MB head needs ~7.5e9 lane-instructions, which the
// 132 SMs issue in ~0.25 ms before latency and register pressure (acc[4][8] + the load ring) cut occupancy; it
// measured 0.92 ms against a 0.14 ms bytes floor. On mma.sync the window costs no instruction per weight: per
// block of 32 inputs a lane spends ~2.7 instructions per weight it holds (int8 -> f16 conversion, x split, loads,
// 16 MMAs, the scale FMAs) whatever T is (up to 8 columns of one MMA; T = 16 adds a second column tile), so the
// head is ~0.06 ms of issue: under the bytes floor, as the bandwidth-bound T = 1 kernel is.
//
// Exactness: an int8 q is exact in f16 (|q| <= 128 < 2^11). x is split x = hi + lo + e, hi = f16(x),
// lo = f16(x - hi) (x - hi is exact in f32): |e| <= 2^-22 |x| + 2^-25 (half an f16 subnormal ulp). Products of
// f16 are exact in the MMA's f32 accumulator, so per Q8_0 block the MMA returns sum_k q_k (hi_k + lo_k) in f32,
// which is then scaled once by d (the weight d * q is unchanged; only the sum is reassociated: per block first,
// as the brief allows). A block whose |x| reaches 2^15 (where f16(x) could overflow) is split from x * 2^-16 and
// its d taken times 2^16 (exact powers of two), so e stays <= 2^-22 |x| + 2^-24 max|x of the block|. Reductions
// are fixed-order (MMA, then the ksplit / zsplit sums of the CUDA-core path): replays are bit-identical.
//
// Fragments of mma.m16n8k16.row.col (PTX ISA; lane = 4 g + t): A (16 x 16, row-major) a0 = (row g, k 2t..2t+1),
// a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..2t+9), a3 = (row g+8, k 2t+8..); B (16 x 8) b0 = (k 2t..2t+1,
// col g), b1 = (k 2t+8..2t+9, col g); C (16 x 8) c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, same cols).
// A dot product may order its k freely as long as A and B agree, so k positions {2t, 2t+1, 2t+8, 2t+9} of k tile
// kt hold inputs 8t + 4kt + {0, 1, 2, 3} of the block: lane (g, t) then needs 8 contiguous quant bytes of a row
// (one 8-byte load; lanes g = 0..7 of one t-half read 128 contiguous bytes of the repacked layout) and 8
// contiguous x floats (two float4). Weights are A (M = rows), the window is B (N = window rows, padded to 8 with
// zeros). Lane (g, t) of a warp's row group reads rows g + 8 s, s = 0..3 (slot s; m tile s / 2, A row half s % 2).
#ifndef Q8T_DEPTH  // blocks of loads in flight per warp on the tensor-core path (a ring in registers)
#define Q8T_DEPTH 2
#endif
#ifndef Q8T_ROWS  // row groups (of 32 rows) per warp: the split of x is shared by 2 R MMA row tiles
#define Q8T_ROWS 2  // (strata_cli/gpu/launch_util.py Q8T_LANE_ROWS mirrors it; bench/gemv_tc_bench.py sweeps it)
#endif
#ifndef Q8T_MIN_BLOCKS  // __launch_bounds__ blocks per SM: 2 caps registers at 128 (151 at T = 8 otherwise)
#define Q8T_MIN_BLOCKS 1
#endif
#define Q8T_BIG 32768.0f  // |x| from which a block is split from x * 2^-16 (f16 overflows at 65520)

constexpr int q8t_ntiles(int nt) { return nt > 8 ? 2 : 1; }  // MMA column tiles of 8 window rows

// Two int8 of a word, biased to unsigned (u = q + 128), as an exact f16x2: splice u into the mantissa of 1024
// (0x64uu = 1024 + u) and subtract 1152. sel 0x4140 takes bytes 0, 1 (low half first), 0x4342 bytes 2, 3.
__device__ __forceinline__ u32 u8x2_to_f16x2(u32 biased, u32 sel) {
    const u32 h = __byte_perm(biased, 0x64646464u, sel);
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x64806480u));
    return r;
}

// Slot loads of block b for the warp's first `live` row groups (q, d: this lane's row g of group g0, block 0).
template <int R>
__device__ __forceinline__ void q8t_load(const uint2* q, const u16* d, i64 gq, i64 gd, int b, int live,
                                         uint2 (&qw)[R][4], u16 (&dw)[R][4]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < live) {
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                qw[r][s] = __ldg(q + r * gq + (i64)b * 128 + s * 16);
                dw[r][s] = __ldg(d + r * gd + (i64)b * 32 + s * 8);
            }
        }
    }
}

// acc[(r * 2 + mt) * NN + nn][e] += block b of the warp's rows (C fragment element e of m tile mt, column tile nn)
// times the window rows of xrow (this lane's column g of each column tile; null: a padding column of zeros).
template <int NN, int R>
__device__ __forceinline__ void q8t_block(const uint2 (&qw)[R][4], const u16 (&dw)[R][4], int b, int live,
                                          const float* const (&xrow)[NN], float (&acc)[R * 2 * NN][4]) {
    float xv[NN][8];
    bool big[NN];
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
        float4 u = {0.0f, 0.0f, 0.0f, 0.0f}, v = u;
        if (xrow[nn]) {
            u = __ldg(reinterpret_cast<const float4*>(xrow[nn] + b * 32));
            v = __ldg(reinterpret_cast<const float4*>(xrow[nn] + b * 32) + 1);
        }
        xv[nn][0] = u.x; xv[nn][1] = u.y; xv[nn][2] = u.z; xv[nn][3] = u.w;
        xv[nn][4] = v.x; xv[nn][5] = v.y; xv[nn][6] = v.z; xv[nn][7] = v.w;
#pragma unroll
        big[nn] = false;
#pragma unroll
        for (int k = 0; k < 8; ++k) big[nn] |= fabsf(xv[nn][k]) >= Q8T_BIG;
    }
    bool scaled[NN];
    float unscale[NN][2];  // per B column, so one window row's size costs the others no precision
    column_scales<NN>(big, scaled, unscale);
    u32 bh[NN][2][2], bl[NN][2][2];  // [column tile][k tile][b0 / b1]
    split_b_frags<NN, false>(xv, scaled, bh, bl);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= live) continue;  // warp-uniform
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            float c[NN][4];
#pragma unroll
            for (int nn = 0; nn < NN; ++nn) c[nn][0] = c[nn][1] = c[nn][2] = c[nn][3] = 0.0f;
#pragma unroll
            for (int kt = 0; kt < 2; ++kt) {
                const u32 wg = (kt ? qw[r][2 * mt].y : qw[r][2 * mt].x) ^ 0x80808080u;          // row g
                const u32 wg8 = (kt ? qw[r][2 * mt + 1].y : qw[r][2 * mt + 1].x) ^ 0x80808080u;  // row g + 8
                const u32 a0 = u8x2_to_f16x2(wg, 0x4140), a1 = u8x2_to_f16x2(wg8, 0x4140);
                const u32 a2 = u8x2_to_f16x2(wg, 0x4342), a3 = u8x2_to_f16x2(wg8, 0x4342);
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    mma_f16_16816(c[nn], a0, a1, a2, a3, bl[nn][kt][0], bl[nn][kt][1]);
                    mma_f16_16816(c[nn], a0, a1, a2, a3, bh[nn][kt][0], bh[nn][kt][1]);
                }
            }
            const float dg = f16_bits_to_float(dw[r][2 * mt]);
            const float dg8 = f16_bits_to_float(dw[r][2 * mt + 1]);
#pragma unroll
            for (int nn = 0; nn < NN; ++nn) {
                float* a = acc[(r * 2 + mt) * NN + nn];
                a[0] = fmaf(dg * unscale[nn][0], c[nn][0], a[0]);
                a[1] = fmaf(dg * unscale[nn][1], c[nn][1], a[1]);
                a[2] = fmaf(dg8 * unscale[nn][0], c[nn][2], a[2]);
                a[3] = fmaf(dg8 * unscale[nn][1], c[nn][3], a[3]);
            }
        }
    }
}

// This warp's K slice (blocks kslice, kslice + kstride, ...) of row groups g0.. (grp0 = group g0's first byte)
// times window columns n < nt (x row xr[n]); a ring of Q8T_DEPTH blocks of loads in flight, as q8r_slice.
// Every lane of the warp must call it (MMAs are warp-wide).
template <int NT, int R>
__device__ __forceinline__ void q8t_slice(const u8* __restrict__ grp0, int live, int nb,
                                          const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                          int kslice, int kstride, float (&acc)[R * 2 * q8t_ntiles(NT)][4]) {
    constexpr int NN = q8t_ntiles(NT), DEPTH = Q8T_DEPTH;
    const int lane = threadIdx.x & (WARP - 1), g = lane >> 2, t = lane & 3;
    const i64 group_bytes = (i64)nb * Q8R_BLOCK_BYTES;
    // row g, half t / 2, bytes 8 (t % 2).. of block 0: inputs 8t..8t+7 of the block
    const uint2* q = reinterpret_cast<const uint2*>(grp0) + (t >> 1) * 64 + g * 2 + (t & 1);
    const u16* d = reinterpret_cast<const u16*>(grp0 + (i64)nb * 1024) + g;
    const float* xrow[NN];
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
        const int n = nn * 8 + g;
        xrow[nn] = n < nt ? x + (i64)pick(xr, n) * n_in + 8 * t : nullptr;
    }
    uint2 qw[DEPTH][R][4];
    u16 dw[DEPTH][R][4];
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
        const int b = kslice + i * kstride;
        if (b < nb) q8t_load<R>(q, d, group_bytes / 8, group_bytes / 2, b, live, qw[i], dw[i]);
    }
    for (int base = kslice; base < nb; base += DEPTH * kstride) {
#pragma unroll
        for (int i = 0; i < DEPTH; ++i) {
            const int b = base + i * kstride;
            if (b < nb) {  // warp-uniform
                uint2 cq[R][4];
                u16 cd[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int s = 0; s < 4; ++s) { cq[r][s] = qw[i][r][s]; cd[r][s] = dw[i][r][s]; }
                const int ahead = b + DEPTH * kstride;
                if (ahead < nb) q8t_load<R>(q, d, group_bytes / 8, group_bytes / 2, ahead, live, qw[i], dw[i]);
                q8t_block<NN, R>(cq, cd, b, live, xrow, acc);
            }
        }
    }
}

// Sum the ksplit warps of each warp set; the set's first warp writes its C fragments: element e of fragment
// (r, mt, nn) is row 32 (g0 + r) + 16 mt + g + 8 (e / 2) of window column 8 nn + 2t + e % 2 (y row y_rows[col]).
// Every warp of the block must call it (a barrier when ksplit > 1).
template <int NT, int R>
__device__ __forceinline__ void q8t_store(float (&acc)[R * 2 * q8t_ntiles(NT)][4], int g0, int live, int n_out,
                                          int nt, int ksplit, int kslice, int set, float* y,
                                          const int (&y_rows)[NT], int act, float div, const float* mul,
                                          int mul_st, int mul_so) {
    constexpr int NN = q8t_ntiles(NT), F = R * 2 * NN;
    __shared__ float part[GEMV_WARPS][F][4][WARP];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    if (!ksplit_reduce(acc, ksplit, kslice, true, [&](int f, int e) -> float& { return part[warp][f][e][lane]; },
                       [&](int s, int f, int e) { return part[set * ksplit + s][f][e][lane]; }))
        return;
#pragma unroll
    for (int f = 0; f < F; ++f) {
        const int r = f / (2 * NN), mt = (f / NN) % 2, nn = f % NN;
        if (r >= live) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int o = (g0 + r) * Q8R_GROUP + 16 * mt + g + 8 * (e >> 1);
            const int col = 8 * nn + 2 * t + (e & 1);
            if (col < nt && o < n_out) {
                const i64 row = pick(y_rows, col);
                y[row * n_out + o] = gemv_epilogue(acc[f][e], act, div, mul, row * mul_st + (i64)o * mul_so);
            }
        }
    }
}

// grid (ceil(n_groups / (Q8T_ROWS * GEMV_WARPS / ksplit)), ceil(T / GEMV_MAXT), zsplit), block GEMV_WARPS * 32;
// the split-K and z-split scheme of q8r_dense (zsplit > 1: raw sums to partial, the tile's last block finishes).
template <int NT>
__device__ __forceinline__ void q8t_dense(const u8* W, int nb, const float* x, int n_in, float* y, int n_out,
                                          int T, int ksplit, int act, float div, const float* mul, int mul_st,
                                          int mul_so, float* partial, unsigned* tile_done) {
    constexpr int R = Q8T_ROWS, F = R * 2 * q8t_ntiles(NT);
    const int warp = threadIdx.x / WARP, set = warp / ksplit;
    const int kslice = warp % ksplit + blockIdx.z * ksplit, kstride = ksplit * gridDim.z;
    const int g0 = (blockIdx.x * (GEMV_WARPS / ksplit) + set) * R;
    const int live = min(R, n_out / Q8R_GROUP - g0);
    const int rows_per_block = Q8R_GROUP * R * (GEMV_WARPS / ksplit);
    const int t0 = blockIdx.y * GEMV_MAXT, nt = min(NT, T - t0);
    float acc[F][4];
    int rows[NT];
#pragma unroll
    for (int f = 0; f < F; ++f) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.0f;
#pragma unroll
    for (int t = 0; t < NT; ++t) rows[t] = t0 + t;  // x row and y row of window column t
    if (live > 0)
        q8t_slice<NT, R>(W + (i64)g0 * nb * Q8R_BLOCK_BYTES, live, nb, x, rows, nt, n_in, kslice, kstride, acc);
    if (gridDim.z > 1) {
        q8t_store<NT, R>(acc, g0, live, n_out, nt, ksplit, warp % ksplit, set, partial + (i64)blockIdx.z * T * n_out,
                         rows, ACT_NONE, 1.0f, nullptr, 0, 0);
        zsplit_finish(partial, tile_done, y, n_out, T, t0, nt, blockIdx.x * rows_per_block, rows_per_block, act, div,
                      mul, mul_st, mul_so);
    } else {
        q8t_store<NT, R>(acc, g0, live, n_out, nt, ksplit, warp % ksplit, set, y, rows, act, div, mul, mul_st,
                         mul_so);
    }
}

// Grouped experts on tensor cores (gemv_expert_q8r_tc_t<NT>, the windows whose launch_util.WindowPath has gemv_tc):
// q8r_groups' groups (group u = blockIdx.y: up to NT entries of expert g_expert[u], entry j reads x row j / x_div and
// writes y row j; an id outside 0..E-1 writes NaN to its entries' rows) over q8t_slice / q8t_store: the window's
// entries are the MMA's B columns, so a warp's 64 rows cost the same lane-instructions at any group size, where
// q8r_grouped's CUDA-core warp at T = 4 / 8 holds acc[4][8] plus a ring of 4 row groups (255 registers, one block of
// 8 warps an SM: 37-41 % of the copy rate on Flash-Next's experts at 35b700f).
// grid (ceil(groups per expert / (Q8T_ROWS * GEMV_WARPS / ksplit)), J groups), block GEMV_WARPS * 32.
template <int NT>
__device__ __forceinline__ void q8t_grouped(const u8* W, i64 expert_stride, int n_expert, const int* g_expert,
                                            const int* g_count, const int* g_entries, const float* x, int x_div,
                                            int n_in, float* y, int n_out, int ksplit, int act, float div,
                                            const float* mul, int mul_st, int mul_so) {
    constexpr int R = Q8T_ROWS, F = R * 2 * q8t_ntiles(NT);
    q8r_groups<NT, R>(W, W, expert_stride, n_expert, g_expert, g_count, g_entries, x_div, n_in, y, n_out, ksplit,
                      [&](const u8* grp0, const u8*, int g0, int live, int set, int kslice, int nt,
                          const int (&rows)[NT], const int (&xr)[NT]) {
                          float acc[F][4];
#pragma unroll
                          for (int f = 0; f < F; ++f) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.0f;
                          if (live > 0)
                              q8t_slice<NT, R>(grp0, live, n_in / QK8_0, x, xr, nt, n_in, kslice, ksplit, acc);
                          q8t_store<NT, R>(acc, g0, live, n_out, nt, ksplit, kslice, set, y, rows, act, div, mul,
                                           mul_st, mul_so);
                      });
}

#define Q8T_GROUPED_KERNEL(NT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP, Q8T_MIN_BLOCKS)                              \
        gemv_expert_q8r_tc_t##NT(const u8* W, i64 expert_stride, int n_expert, const int* g_expert,             \
                                 const int* g_count, const int* g_entries, const float* x, int x_div, int n_in, \
                                 float* y, int n_out, int ksplit, int act, float div, const float* mul,         \
                                 int mul_st, int mul_so) {                                                       \
        pdl_begin();                                                                                             \
        q8t_grouped<NT>(W, expert_stride, n_expert, g_expert, g_count, g_entries, x, x_div, n_in, y, n_out,     \
                        ksplit, act, div, mul, mul_st, mul_so);                                                  \
    }

// grid (ceil(groups per expert / (Q8T_ROWS * GEMV_WARPS / ksplit)), J groups)
Q8T_GROUPED_KERNEL(2)
Q8T_GROUPED_KERNEL(4)
Q8T_GROUPED_KERNEL(8)
Q8T_GROUPED_KERNEL(16)

#define Q8T_DENSE_KERNEL(NT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP, Q8T_MIN_BLOCKS)                              \
        gemv_q8r_tc_t##NT(const u8* W, int nb, const float* x, int n_in, float* y, int n_out, int T, int ksplit, \
                          int act, float div, const float* mul, int mul_st, int mul_so, float* partial,         \
                          unsigned* tile_done) {                                                                 \
        pdl_prefetch_rows(W, (i64)nb * Q8R_BLOCK_BYTES, (i64)blockIdx.x * Q8T_ROWS * (GEMV_WARPS / ksplit),      \
                          Q8T_ROWS * (GEMV_WARPS / ksplit), n_out / Q8R_GROUP);                                  \
        pdl_begin();                                                                                             \
        q8t_dense<NT>(W, nb, x, n_in, y, n_out, T, ksplit, act, div, mul, mul_st, mul_so, partial, tile_done);  \
    }

// grid (ceil(n_groups / (Q8T_ROWS * GEMV_WARPS / ksplit)), ceil(T / GEMV_MAXT), zsplit)
Q8T_DENSE_KERNEL(2)
Q8T_DENSE_KERNEL(4)
Q8T_DENSE_KERNEL(8)
Q8T_DENSE_KERNEL(16)
