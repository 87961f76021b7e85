// hyper.cu: the hyper-connection read and write (strata_cli/ops/hyper.py). A read is 3 launches
// (launch_hyper.hc_read; reference ops/hyper.hc_write_read_raw):
//   R, xn   = hc_write_norm(R, bo, inj_prev)            [T, C, D], [T, C*D]   the previous block's pending write
//                                                       R += bo * inj_prev (if any) in place, then the norm; after
//                                                       the routed experts bo is their combine, computed here; at
//                                                       the PLE layer the PLE's conv step (PleConv) instead
//   dn      = (W_dn . xn) / C                           [T, n_dn]   one gemv.cu / gemv_q8r.cu launch (ACT_NONE,
//                                                       div C) over W_dn = [W_down; W_inject; zero rows]: the down
//                                                       and inject projections read the same xn
//   mixed, inj = hc_up_mix(xn, dn, W_up)                [T, D], [T, C]   low = silu(dn[:, :L]),
//                                                       gates = sigmoid(W_up . low), mixed = mean_c gates * xn,
//                                                       inj = 2 * sigmoid(dn[:, L:L+C])
// hc_write applies a write on its own (before the PLE mix, which reads R, and at a layer-split hand-off).
// A window's residual stack starts as C copies of its embedding rows (broadcast_streams).
// Legend: T window rows, C streams, D hidden, L low rank, n_dn the rows of W_dn (>= L + C). All f32, C-contiguous.
#include "common.cuh"

// Pending (common.cuh): the block output a pending write adds (bo, or the MoE combine of parts).

// out[t, c, d] = R[t, c, d] + pending(t, d) * inj[t, c] (bo, or the MoE's combine of parts: Pending::at). out may
// be R (in place: each element read then written once). The product is rounded before the add (no FMA
// contraction), as numpy does. Grid-stride over T*C*D, block 256.
extern "C" __global__ void __launch_bounds__(256)
    hc_write(const float* R, const float* __restrict__ bo, const float* __restrict__ parts,
             const float* __restrict__ route_w, const float* __restrict__ shared, int K,
             const float* __restrict__ inj, float* out, int T, int C, int D) {
    const Pending pend{bo, parts, route_w, shared, K};
    const i64 n = (i64)T * C * D;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 d = idx % D, tc = idx / D;  // tc = t * C + c
        const int t = (int)(tc / C);
        out[idx] = R[idx] + __fmul_rn(pend.at(t, (int)d, D), inj[tc]);
    }
}

// The first kernel of the read. grid T*C (block b = t*C + c: stream c of row t), block HC_NORM_THREADS or fewer
// (launch_hyper.norm_threads: ceil(D / 4) rounded up to whole warps, at most 512).
//   bo or parts != null: R[t, c, :] += pending(t, :) * inj_prev[t, c] in place first (hc_write's rounding:
//   product, then add; pending as Pending::at); ple_gated != null instead: the PLE's last step (ple_conv_out's
//   arithmetic, PleConv) in place first, the PLE layer's read;
//   xn[t, c*D + d] = R[t, c, d] / sqrt(mean_d R[t, c, :]^2 + eps) * norm_w[c*D + d] (ops/basic.grouped_rms_norm).
// Each block owns its stream's elements, so the in-place update races with nothing. Thread i holds elements d = i +
// e * blockDim.x, e < HC_NORM_EPT, in registers (D <= HC_NORM_EPT * blockDim.x: all of them; the rest, if any, go
// through R once more): every load of the thread (R, the pending write's slots, inj_prev, norm_w) is issued before
// the first is used, the sum of squares goes in e order, then block_sum.
// Latency at T = 1 (D = 2560, C = 4, K = 11 slots): 4 blocks of 512 threads; 1 round of loads (was one round trip
// per element and slot group: 10 elements a thread, ~10 dependent trips), 1 block reduction (3 barriers), the
// stores. The threads' element sets changed (256 -> 512 threads, registers): the sum of squares' order differs from
// the old kernel's (float32 rounding only; the tests' tolerances against numpy hold), the write's bits do not.
#define HC_NORM_EPT 8
#define HC_NORM_THREADS 512
extern "C" __global__ void __launch_bounds__(HC_NORM_THREADS)
    hc_write_norm(float* R, const float* __restrict__ bo, const float* __restrict__ parts,
                  const float* __restrict__ route_w, const float* __restrict__ shared, int K,
                  const float* __restrict__ inj_prev, const float* __restrict__ norm_w, float* __restrict__ xn,
                  int C, int D, float eps, const float* __restrict__ ple_gated, const float* __restrict__ ple_history,
                  const float* __restrict__ ple_normed, const float* __restrict__ ple_conv_w, int ple_kc,
                  int ple_dil) {
    __shared__ float sh[WARP];
    const int b = blockIdx.x, c = b % C, t = b / C, nth = blockDim.x;
    const i64 base = (i64)b * D;
    float* r = R + base;
    const float* w = norm_w + (i64)c * D;
    const bool ple_write = ple_gated != nullptr, pend_write = !ple_write && (bo != nullptr || parts != nullptr);
    const PleConv ple{ple_gated, ple_history, ple_normed, ple_conv_w, C * D, ple_kc, ple_dil};
    const Pending pend{bo, parts, route_w, shared, K};
    const float g = pend_write ? inj_prev[b] : 0.0f;
    // the new value of element d (its loads only; the caller stores it)
    auto value = [&](int d) -> float {
        if (ple_write) return ple.add_to(r[d], t, (i64)c * D + d);  // the PLE layer's last step (PleConv)
        if (pend_write) return r[d] + __fmul_rn(pend.at(t, d, D), g);
        return r[d];
    };
    float v[HC_NORM_EPT], wv[HC_NORM_EPT];
#pragma unroll
    for (int e = 0; e < HC_NORM_EPT; ++e) {
        const int d = threadIdx.x + e * nth;
        v[e] = d < D ? value(d) : 0.0f;
        wv[e] = d < D ? w[d] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < HC_NORM_EPT; ++e) {
        const int d = threadIdx.x + e * nth;
        if (d < D && (ple_write || pend_write)) r[d] = v[e];
        ss += v[e] * v[e];  // 0 past D
    }
    for (int d = threadIdx.x + HC_NORM_EPT * nth; d < D; d += nth) {  // rows wider than the registers hold
        const float x = value(d);
        if (ple_write || pend_write) r[d] = x;
        ss += x * x;
    }
    ss = block_sum(ss, sh);
    const float s = sqrtf(ss / (float)D + eps);
#pragma unroll
    for (int e = 0; e < HC_NORM_EPT; ++e) {
        const int d = threadIdx.x + e * nth;
        if (d < D) xn[base + d] = v[e] / s * wv[e];
    }
    for (int d = threadIdx.x + HC_NORM_EPT * nth; d < D; d += nth) xn[base + d] = r[d] / s * w[d];  // its own r[d]
}

// The last kernel of the read: the up projection, its gates, the mix of the streams and the inject gates in one
// launch. dn [T, n_dn] is the down + inject GEMV's output (already divided by C); W_up [C*D, L] raw rows of
// up_stride bytes, type up_type (F32, F16, BF16, Q8_0: read by raw_at, L values a row).
//   low[t, l]    = silu(dn[t, l])                                    l < L   (shared memory, every block)
//   gate[t, c]   = sigmoid(W_up[c*D + d] . low[t])                   lanes over l, then warp_sum (fixed order)
//   mixed[t, d]  = (sum_c gate[t, c] * xn[t, c*D + d]) / C           summed in stream order
//   inj[t, j]    = 2 * sigmoid(dn[t, L + j])                         j < n_inj, block 0 (inj may be null)
// grid ceil(D / 8): warp w of block b owns column d = 8b + w for every row and stream; block 256; dynamic shared
// memory T*L floats. T <= GEMV_MAXT.
// Each lane loads its W_up values of the first UP_MAXC streams (l = lane + 32 j, j < UP_MAXJ) and row 0's xn of
// them into registers before the low barrier (they do not depend on dn), so the weights' trip overlaps dn's;
// wider rows and more streams read the rest as they go. The sums go in the same order as before (per lane j
// ascending, warp_sum, streams ascending): the same bits.
// Latency at T = 1 (D = 2560, C = 4, L = 320): 320 blocks; 1 round trip (W_up, xn and dn together; was dn, then
// per stream a W_up trip and an xn trip: ~9 dependent trips), 1 barrier, C warp_sums, the store.
#define UP_MAXC 4
#define UP_MAXJ 12
template <int TYPE>
struct TypeTag {
    static constexpr int value = TYPE;
};
extern "C" __global__ void __launch_bounds__(256)
    hc_up_mix(const float* __restrict__ xn, const float* __restrict__ dn, int n_dn, int L,
              const u8* __restrict__ up_w, i64 up_stride, int up_type, float* __restrict__ mixed,
              float* __restrict__ inj, int n_inj, int T, int C, int D) {
    extern __shared__ float low[];  // [T][L]
    const int lane = threadIdx.x & (WARP - 1), d = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    const bool col = d < D;  // a whole warp
    float wr[UP_MAXC][UP_MAXJ], x0[UP_MAXC];
    // the type dispatched once (uniform), so each body is one straight-line block of predicated loads
    auto preload = [&](auto type) {
        constexpr int TYPE = decltype(type)::value;
#pragma unroll
        for (int c = 0; c < UP_MAXC; ++c) {
            const u8* row = up_w + (i64)(c * D + d) * up_stride;
            x0[c] = col && c < C ? xn[(i64)c * D + d] : 0.0f;
#pragma unroll
            for (int j = 0; j < UP_MAXJ; ++j) {
                const int l = lane + WARP * j;
                wr[c][j] = col && c < C && l < L ? raw_at_t<TYPE>(row, l) : 0.0f;
            }
        }
    };
    if (up_type == GGML_F32) preload(TypeTag<GGML_F32>());
    else if (up_type == GGML_F16) preload(TypeTag<GGML_F16>());
    else if (up_type == GGML_BF16) preload(TypeTag<GGML_BF16>());
    else preload(TypeTag<GGML_Q8_0>());
    for (int i = threadIdx.x; i < T * L; i += blockDim.x) low[i] = silu_f(dn[(i64)(i / L) * n_dn + i % L]);
    if (blockIdx.x == 0 && inj != nullptr) {
        for (int i = threadIdx.x; i < T * n_inj; i += blockDim.x)
            inj[i] = 2.0f * sigmoid_f(dn[(i64)(i / n_inj) * n_dn + L + i % n_inj]);
    }
    __syncthreads();
    if (!col) return;  // a whole warp: no barrier follows
    float mix[GEMV_MAXT];
#pragma unroll
    for (int t = 0; t < GEMV_MAXT; ++t) mix[t] = 0.0f;
    // stream c's gates for every row, from its weights w(j) (registers or raw_at), added into mix
    auto stream_gates = [&](int c, auto&& w_at, float x_row0) {
        const u8* row = up_w + (i64)(c * D + d) * up_stride;
        float acc[GEMV_MAXT];
#pragma unroll
        for (int t = 0; t < GEMV_MAXT; ++t) acc[t] = 0.0f;
#pragma unroll
        for (int j = 0; j < UP_MAXJ; ++j) {
            const int l = lane + WARP * j;
            if (l < L) {
                const float w = w_at(j);
#pragma unroll
                for (int t = 0; t < GEMV_MAXT; ++t)
                    if (t < T) acc[t] += w * low[t * L + l];
            }
        }
        for (int l = lane + WARP * UP_MAXJ; l < L; l += WARP) {  // rows longer than the registers hold
            const float w = raw_at(row, up_type, l);
#pragma unroll
            for (int t = 0; t < GEMV_MAXT; ++t)
                if (t < T) acc[t] += w * low[t * L + l];
        }
        const i64 colx = (i64)c * D + d;
#pragma unroll
        for (int t = 0; t < GEMV_MAXT; ++t) {
            if (t < T) {  // T is uniform: every lane meets the shuffles
                const float g = sigmoid_f(warp_sum(acc[t]));
                mix[t] += g * (t == 0 ? x_row0 : xn[(i64)t * C * D + colx]);
            }
        }
    };
#pragma unroll
    for (int c = 0; c < UP_MAXC; ++c)
        if (c < C) stream_gates(c, [&](int j) { return wr[c][j]; }, x0[c]);
    for (int c = UP_MAXC; c < C; ++c) {
        const u8* row = up_w + (i64)(c * D + d) * up_stride;
        stream_gates(c, [&](int j) { return raw_at(row, up_type, lane + WARP * j); }, xn[(i64)c * D + d]);
    }
    if (lane != 0) return;
#pragma unroll
    for (int t = 0; t < GEMV_MAXT; ++t)
        if (t < T) mixed[(i64)t * D + d] = mix[t] / (float)C;
}

// R [T, C, D] <- emb [T, D] on every stream. One thread per element: grid ceil(T*C*D / 256), block 256.
extern "C" __global__ void broadcast_streams(const float* __restrict__ emb, float* __restrict__ R,
                                             int T, int C, int D) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n = (long)T * C * D;
    if (i >= n) return;
    int d = (int)(i % D);
    int t = (int)(i / ((long)C * D));
    R[i] = emb[(long)t * D + d];
}
