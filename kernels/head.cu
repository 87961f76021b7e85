// head.cu: greedy ids from the head's logits (numpy: logits.argmax(axis=1)).
// Legend: T window rows, V vocabulary. logits [T, V] f32 -> ids [T] int32.
#include "common.cuh"

// Per-row argmax in two stages, ties -> lower id: a 248k-entry row read by one block is latency-bound.
// Stage 1, grid (P, T): block p scans columns [p*chunk, (p+1)*chunk) of row t into part_v/part_i [T, P].
// Stage 2, grid T: one block reduces the row's P partials. NaN logits are never picked (numpy would return the
// first NaN); a NaN-only row gives id -1. Blocks of any multiple of 32 threads up to 1024.
extern "C" __global__ void __launch_bounds__(1024)
    argmax_partial(const float* __restrict__ logits, int V, int chunk, float* __restrict__ part_v,
                   int* __restrict__ part_i) {
    __shared__ float shv[WARP];
    __shared__ int shi[WARP];
    const float* z = logits + (i64)blockIdx.y * V;
    const int end = min(V, (blockIdx.x + 1) * chunk);
    float bv = NEG_INF;
    int bi = BIG_ID;
    for (int v = blockIdx.x * chunk + threadIdx.x; v < end; v += blockDim.x)
        if (arg_better(z[v], v, bv, bi)) { bv = z[v]; bi = v; }
    block_argmax(bv, bi, shv, shi);
    if (threadIdx.x == 0) {
        part_v[(i64)blockIdx.y * gridDim.x + blockIdx.x] = bv;
        part_i[(i64)blockIdx.y * gridDim.x + blockIdx.x] = bi;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    argmax_rows(const float* __restrict__ part_v, const int* __restrict__ part_i, int P, int* __restrict__ ids) {
    __shared__ float shv[WARP];
    __shared__ int shi[WARP];
    float bv = NEG_INF;
    int bi = BIG_ID;
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const float v = part_v[(i64)blockIdx.x * P + p];
        const int i = part_i[(i64)blockIdx.x * P + p];
        if (i != BIG_ID && arg_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    block_argmax(bv, bi, shv, shi);
    if (threadIdx.x == 0) ids[blockIdx.x] = bi == BIG_ID ? -1 : bi;
}
