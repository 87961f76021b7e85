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

// The first kernel of the read. grid T*C (block b = t*C + c: stream c of row t), block 256.
//   bo or parts != null: R[t, c, :] += pending(t, :) * inj_prev[t, c] in place first (hc_write's rounding:
//   product, then add; pending as Pending::at); ple_gated != null instead: the PLE's last step (ple_conv_out's
//   arithmetic, PleConv) in place first, the PLE layer's read;
//   xn[t, c*D + d] = R[t, c, d] / sqrt(mean_d R[t, c, :]^2 + eps) * norm_w[c*D + d] (ops/basic.grouped_rms_norm).
// Each block owns its stream's elements, so the in-place update races with nothing.
extern "C" __global__ void __launch_bounds__(256)
    hc_write_norm(float* R, const float* __restrict__ bo, const float* __restrict__ parts,
                  const float* __restrict__ route_w, const float* __restrict__ shared, int K,
                  const float* __restrict__ inj_prev, const float* __restrict__ norm_w, float* __restrict__ xn,
                  int C, int D, float eps, const float* __restrict__ ple_gated, const float* __restrict__ ple_history,
                  const float* __restrict__ ple_normed, const float* __restrict__ ple_conv_w, int ple_kc,
                  int ple_dil) {
    __shared__ float sh[WARP];
    const int b = blockIdx.x, c = b % C, t = b / C;
    const i64 base = (i64)b * D;
    float* r = R + base;
    float ss = 0.0f;
    if (ple_gated != nullptr) {  // the PLE layer's last step (PleConv): R += gated + silu(conv) in place
        const PleConv ple{ple_gated, ple_history, ple_normed, ple_conv_w, C * D, ple_kc, ple_dil};
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            const float v = ple.add_to(r[d], t, (i64)c * D + d);
            r[d] = v;
            ss += v * v;
        }
    } else if (bo != nullptr || parts != nullptr) {
        const Pending pend{bo, parts, route_w, shared, K};
        const float g = inj_prev[b];
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            const float v = r[d] + __fmul_rn(pend.at(t, d, D), g);
            r[d] = v;
            ss += v * v;
        }
    } else {
        for (int d = threadIdx.x; d < D; d += blockDim.x) ss += r[d] * r[d];
    }
    ss = block_sum(ss, sh);
    const float s = sqrtf(ss / (float)D + eps);
    const float* w = norm_w + (i64)c * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) xn[base + d] = r[d] / s * w[d];  // r[d]: this thread's own
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
extern "C" __global__ void __launch_bounds__(256)
    hc_up_mix(const float* __restrict__ xn, const float* __restrict__ dn, int n_dn, int L,
              const u8* __restrict__ up_w, i64 up_stride, int up_type, float* __restrict__ mixed,
              float* __restrict__ inj, int n_inj, int T, int C, int D) {
    extern __shared__ float low[];  // [T][L]
    for (int i = threadIdx.x; i < T * L; i += blockDim.x) low[i] = silu_f(dn[(i64)(i / L) * n_dn + i % L]);
    if (blockIdx.x == 0 && inj != nullptr) {
        for (int i = threadIdx.x; i < T * n_inj; i += blockDim.x)
            inj[i] = 2.0f * sigmoid_f(dn[(i64)(i / n_inj) * n_dn + L + i % n_inj]);
    }
    __syncthreads();
    const int lane = threadIdx.x & (WARP - 1), d = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (d >= D) return;  // a whole warp: no barrier follows
    float mix[GEMV_MAXT];
#pragma unroll
    for (int t = 0; t < GEMV_MAXT; ++t) mix[t] = 0.0f;
    for (int c = 0; c < C; ++c) {
        const u8* row = up_w + (i64)(c * D + d) * up_stride;
        float acc[GEMV_MAXT];
#pragma unroll
        for (int t = 0; t < GEMV_MAXT; ++t) acc[t] = 0.0f;
        for (int l = lane; l < L; l += WARP) {
            const float w = raw_at(row, up_type, l);
#pragma unroll
            for (int t = 0; t < GEMV_MAXT; ++t)
                if (t < T) acc[t] += w * low[t * L + l];
        }
        const i64 col = (i64)c * D + d;
#pragma unroll
        for (int t = 0; t < GEMV_MAXT; ++t) {
            if (t < T) {  // T is uniform: every lane meets the shuffles
                const float g = sigmoid_f(warp_sum(acc[t]));
                mix[t] += g * xn[(i64)t * C * D + col];
            }
        }
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
