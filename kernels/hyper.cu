// hyper.cu: the elementwise and norm parts of the hyper-connection read and write (strata_cli/ops/hyper.py).
// The projections (down, up, inject) are gemv.cu launches with fused epilogues, ordered by the launcher:
//   xn    = hc_norm(R)                                  [T, C*D]
//   low   = silu((W_down . xn) / C)                     [T, L]      gemv, ACT_SILU, div C
//   gates = sigmoid(W_up . low)                         [T, C*D]    gemv, ACT_SIGMOID
//   mixed = hc_mix(gates, xn)                           [T, D]
//   inj   = 2 * sigmoid((W_inject . xn) / C)            [T, C]      gemv, ACT_2SIGMOID, div C
//   R'    = hc_write(R, bo, inj)                        [T, C, D]
// A window's residual stack starts as C copies of its embedding rows (broadcast_streams).
// The fused read (launch_hyper.hc_read_fused, windows of T >= 4) has two kernels of its own around the same two
// GEMVs, 4 nodes instead of 5 plus the write's 1:
//   R, xn, injp = hc_write_norm(R, bo, inj_prev)      [T, C, D], [T, C*D], [T, C, C]   (the pending write of the
//                                                      previous block, if any, applied in place before the norm)
//   low, gates  = the down and up GEMVs as above
//   mixed, inj  = hc_mix_inject(xn, gates, injp)       [T, D], [T, C]   inj = 2 * sigmoid(sum_c injp[t, c, :] / C)
// injp[t, c, j] = W_inject[j, c*D : (c+1)*D] . xn[t, c, :] (per-stream partial dots: the inject GEMV reassociated).
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

// mixed[t, d] = (sum_c gates[t, c, d] * xn[t, c, d]) / C, summed in stream order. Grid-stride over T*D.
__device__ __forceinline__ void mix_streams(const float* __restrict__ xn, const float* __restrict__ gates,
                                            float* __restrict__ mixed, int T, int C, int D) {
    const i64 n = (i64)T * D;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 t = idx / D, d = idx % D;
        const i64 row = t * C * D + d;
        float s = 0.0f;
        for (int c = 0; c < C; ++c) s += gates[row + (i64)c * D] * xn[row + (i64)c * D];
        mixed[idx] = s / (float)C;
    }
}

// mix_streams as a kernel. Grid-stride over T*D, block 256.
extern "C" __global__ void __launch_bounds__(256)
    hc_mix(const float* __restrict__ xn, const float* __restrict__ gates, float* __restrict__ mixed, int T, int C,
           int D) {
    mix_streams(xn, gates, mixed, T, C, D);
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

// The first kernel of the fused read. grid T*C (block b = t*C + c: stream c of row t), block 256.
//   bo != null: R[t, c, :] += bo[t, :] * inj_prev[t, c] in place first (hc_write's rounding: product, then add);
//   xn[t, c*D + d] = R[t, c, d] / sqrt(mean_d R[t, c, :]^2 + eps) * norm_w[c*D + d] (hc_norm's expression);
//   inj_w != null: injp[t, c, j] = sum_d W_inject[j, c*D + d] * xn[t, c*D + d] for j < C (row stride inj_stride
//   bytes, type inj_type, read element-wise by common.cuh's raw_at). Each block owns its stream's elements, so
//   the in-place update races with nothing.
extern "C" __global__ void __launch_bounds__(256)
    hc_write_norm(float* R, const float* __restrict__ bo, const float* __restrict__ inj_prev,
                  const float* __restrict__ norm_w, float* __restrict__ xn, const u8* __restrict__ inj_w,
                  i64 inj_stride, int inj_type, float* __restrict__ injp, int C, int D, float eps) {
    __shared__ float sh[WARP];
    const int b = blockIdx.x, c = b % C, t = b / C;
    const i64 base = (i64)b * D;
    float* r = R + base;
    float ss = 0.0f;
    if (bo != nullptr) {
        const float g = inj_prev[b];
        const float* bt = bo + (i64)t * D;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            const float v = r[d] + __fmul_rn(bt[d], g);
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
    if (inj_w == nullptr) return;
    for (int j = 0; j < C; ++j) {
        const u8* wj = inj_w + (i64)j * inj_stride;
        float p = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) p += raw_at(wj, inj_type, (i64)c * D + d) * xn[base + d];
        p = block_sum(p, sh);
        if (threadIdx.x == 0) injp[(i64)b * C + j] = p;
    }
}

// The last kernel of the fused read: hc_mix, plus (injp != null) inj[t, j] = 2 * sigmoid((sum_c injp[t, c, j]) / C)
// summed in stream order (deterministic). Grid-stride over T*D (and T*C), block 256.
extern "C" __global__ void __launch_bounds__(256)
    hc_mix_inject(const float* __restrict__ xn, const float* __restrict__ gates, float* __restrict__ mixed,
                  const float* __restrict__ injp, float* __restrict__ inj, int T, int C, int D) {
    mix_streams(xn, gates, mixed, T, C, D);
    if (injp == nullptr) return;
    const i64 m = (i64)T * C;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < m; idx += (i64)gridDim.x * blockDim.x) {
        const i64 t = idx / C, j = idx % C;
        float s = 0.0f;
        for (int c = 0; c < C; ++c) s += injp[(t * C + c) * C + j];
        inj[idx] = 2.0f * sigmoid_f(s / (float)C);
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
