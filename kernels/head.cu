// head.cu: greedy ids from the head's logits (numpy: logits.argmax(axis=1)).
// Legend: T window rows, V vocabulary. logits [T, V] f32 -> ids [T] int32.
#include "common.cuh"

// Per-row argmax, ties -> lower id. grid T, block 512 (any multiple of 32 up to 1024).
// NaN logits are never picked (numpy would return the first NaN); a NaN-only row gives id -1.
extern "C" __global__ void __launch_bounds__(1024)
    argmax_rows(const float* __restrict__ logits, int V, int* __restrict__ ids) {
    __shared__ float shv[WARP];
    __shared__ int shi[WARP];
    const float* z = logits + (i64)blockIdx.x * V;
    float bv = NEG_INF;
    int bi = BIG_ID;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        if (arg_better(z[v], v, bv, bi)) { bv = z[v]; bi = v; }
    block_argmax(bv, bi, shv, shi);
    if (threadIdx.x == 0) ids[blockIdx.x] = bi == BIG_ID ? -1 : bi;
}
