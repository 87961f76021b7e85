// hyper.cu: the elementwise and norm parts of the hyper-connection read and write (strata_cli/ops/hyper.py).
// The projections (down, up, inject) are gemv.cu launches with fused epilogues, ordered by the launcher:
//   xn    = hc_norm(R)                                  [T, C*D]
//   low   = silu((W_down . xn) / C)                     [T, L]      gemv, ACT_SILU, div C
//   gates = sigmoid(W_up . low)                         [T, C*D]    gemv, ACT_SIGMOID
//   mixed = hc_mix(gates, xn)                           [T, D]
//   inj   = 2 * sigmoid((W_inject . xn) / C)            [T, C]      gemv, ACT_2SIGMOID, div C
//   R'    = hc_write(R, bo, inj)                        [T, C, D]
// A window's residual stack starts as C copies of its embedding rows (broadcast_streams).
// Legend: T window rows, C streams, D hidden, L low rank. All f32, C-contiguous.
#include "common.cuh"

// Per-stream RMS norm with gamma: xn[t, c*D + d] = R[t, c, d] / sqrt(mean_d R[t, c, :]^2 + eps) * w[c*D + d].
// grid T*C (one block per stream of a row), block 256; R and xn share the [T, C*D] layout.
extern "C" __global__ void __launch_bounds__(256)
    hc_norm(const float* __restrict__ R, const float* __restrict__ norm_w, float* __restrict__ xn, int C, int D,
            float eps) {
    __shared__ float sh[WARP];
    const i64 base = (i64)blockIdx.x * D;
    const float* r = R + base;
    const float* w = norm_w + (i64)(blockIdx.x % C) * D;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) ss += r[d] * r[d];
    ss = block_sum(ss, sh);
    const float s = sqrtf(ss / (float)D + eps);
    for (int d = threadIdx.x; d < D; d += blockDim.x) xn[base + d] = r[d] / s * w[d];
}

// mixed[t, d] = (sum_c gates[t, c, d] * xn[t, c, d]) / C. Grid-stride over T*D, block 256.
extern "C" __global__ void __launch_bounds__(256)
    hc_mix(const float* __restrict__ xn, const float* __restrict__ gates, float* __restrict__ mixed, int T, int C,
           int D) {
    const i64 n = (i64)T * D;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 t = idx / D, d = idx % D;
        const i64 row = t * C * D + d;
        float s = 0.0f;
        for (int c = 0; c < C; ++c) s += gates[row + (i64)c * D] * xn[row + (i64)c * D];
        mixed[idx] = s / (float)C;
    }
}

// out[t, c, d] = R[t, c, d] + bo[t, d] * inj[t, c]. out may be R (in place: each element read then written once).
// The product is rounded before the add (no FMA contraction), as numpy does. Grid-stride over T*C*D, block 256.
extern "C" __global__ void __launch_bounds__(256)
    hc_write(const float* R, const float* __restrict__ bo, const float* __restrict__ inj, float* out, int T, int C,
             int D) {
    const i64 n = (i64)T * C * D;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 d = idx % D, tc = idx / D;  // tc = t * C + c
        const i64 t = tc / C;
        out[idx] = R[idx] + __fmul_rn(bo[t * D + d], inj[tc]);
    }
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
