// seq_common.cuh: helpers of the sequence-mixer kernels (gdn.cu, qsa.cu, ple.cu) on top of common.cuh.
#pragma once
#include "common.cuh"

// numpy's logaddexp(0, x) = max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|.
__device__ __forceinline__ float softplus_f(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// A row count that a commit graph reads from device memory (n_dev) or, eagerly, takes as a scalar (n), clamped to
// 0..limit (the rows the window stored) so a bad value can never read past them.
__device__ __forceinline__ int count_from(int n, const int* n_dev, int limit) {
    return min(max(n_dev ? *n_dev : n, 0), limit);
}

// Window commit of a rolling history of S rows: state [S, width] <- rows [n, n + S) of [state | rows] (rows: row
// stride ld >= width). Called by the thread owning column c. Row r reads row r + n >= r, which is not yet
// overwritten when rows go in ascending order, so the update is safe in place. Requires 0 <= n <= (rows of `rows`).
template <typename V>
__device__ __forceinline__ void shift_commit_column(V* state, const V* rows, int S, i64 width, i64 c, int n,
                                                    i64 ld) {
    for (int r = 0; r < S; ++r) {
        const int src = r + n;
        state[(i64)r * width + c] = src < S ? state[(i64)src * width + c] : rows[(i64)(src - S) * ld + c];
    }
}

// A rolling-history commit over a grid of threads, one per column (gdn_conv_commit, ple_history_commit):
// state [S, W] <- rows [n, n + S) of [state | rows [T, W] (row stride ld)] with n = count_from(n_keep, n_keep_dev, T).
__device__ __forceinline__ void rolling_commit(float* state, const float* __restrict__ rows, int T, int S, int W,
                                               int ld, int n_keep, const int* n_keep_dev) {
    const int n = count_from(n_keep, n_keep_dev, T);
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < W; c += (i64)gridDim.x * blockDim.x)
        shift_commit_column(state, rows, S, (i64)W, c, n, (i64)ld);
}

// Block-wide exclusive prefix sum of one int per thread (blockDim.x <= 1024); `total` gets the block's sum.
// sh holds >= blockDim.x ints. Every thread must call it.
__device__ __forceinline__ int block_exclusive_scan(int v, int* sh, int* total) {
    const int tid = threadIdx.x, n = blockDim.x;
    __syncthreads();  // sh may still be read by a previous call
    sh[tid] = v;
    __syncthreads();
    for (int off = 1; off < n; off <<= 1) {  // Hillis-Steele inclusive scan
        const int add = tid >= off ? sh[tid - off] : 0;
        __syncthreads();
        sh[tid] += add;
        __syncthreads();
    }
    *total = sh[n - 1];
    return sh[tid] - v;
}
