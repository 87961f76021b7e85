// sampling.cu: ids from the head's logits (strata_cli/ops/sampling.py): greedy (argmax_partial + argmax_rows)
// and temperature sampling keyed by absolute position (sample_rows).
// Legend: T window rows, V vocabulary. logits [T, V] f32 -> ids [T] int32.
#include "common.cuh"

// Per-row argmax in two stages, ties -> lower id: a 248k-entry row read by one block is latency-bound.
// Stage 1, grid (P, T): block p scans columns [p*chunk, (p+1)*chunk) of row t into part_v/part_i/part_bad [T, P].
// Stage 2, grid T: one block reduces the row's P partials. NaN logits are never picked (numpy would return the
// first NaN); a NaN-only row gives id -1. Blocks of any multiple of 32 threads up to 1024.
// The same pass flags non-finite rows (ops/sampling.py nonfinite_rows): nonfinite[t] = 1 when row t holds a NaN
// or +-Inf anywhere, else 0. The engine points nonfinite at mapped host memory, so the host reads it after the
// window without a copy: the device-side "did this window go NaN" check costs no extra launch or read of V.
// Latency at T = 1 (V ~ 248k: ~61 blocks of 256 threads, chunk 4096): a thread's 16 logits are loaded in one trip
// (was a loop: several dependent trips), then the block argmax; the winner does not depend on the scan order
// (arg_better is a total order on (value, id)), so the ids are the same.
#define ARGMAX_EPT 16  // logits a thread holds: the launcher's chunk 4096 / 256 threads
extern "C" __global__ void __launch_bounds__(1024)
    argmax_partial(const float* __restrict__ logits, int V, int chunk, float* __restrict__ part_v,
                   int* __restrict__ part_i, int* __restrict__ part_bad) {
    pdl_begin();
    __shared__ float shv[WARP];
    __shared__ int shi[WARP];
    const float* z = logits + (i64)blockIdx.y * V;
    const int end = min(V, (blockIdx.x + 1) * chunk);
    float bv = NEG_INF;
    int bi = BIG_ID;
    int bad = 0;
    const int v0 = blockIdx.x * chunk + threadIdx.x;
    float xs[ARGMAX_EPT];  // the thread's first ARGMAX_EPT logits loaded together (one trip, not one a logit)
#pragma unroll
    for (int e = 0; e < ARGMAX_EPT; ++e) xs[e] = v0 + e * (int)blockDim.x < end ? z[v0 + e * blockDim.x] : NEG_INF;
#pragma unroll
    for (int e = 0; e < ARGMAX_EPT; ++e) {
        const int v = v0 + e * blockDim.x;
        if (v < end) {
            bad |= !isfinite(xs[e]);
            if (arg_better(xs[e], v, bv, bi)) { bv = xs[e]; bi = v; }
        }
    }
    for (int v = v0 + ARGMAX_EPT * blockDim.x; v < end; v += blockDim.x) {  // chunks past the registers
        const float x = z[v];
        bad |= !isfinite(x);
        if (arg_better(x, v, bv, bi)) { bv = x; bi = v; }
    }
    bad = __syncthreads_or(bad);
    block_argmax(bv, bi, shv, shi);
    if (threadIdx.x == 0) {
        part_v[(i64)blockIdx.y * gridDim.x + blockIdx.x] = bv;
        part_i[(i64)blockIdx.y * gridDim.x + blockIdx.x] = bi;
        part_bad[(i64)blockIdx.y * gridDim.x + blockIdx.x] = bad;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    argmax_rows(const float* __restrict__ part_v, const int* __restrict__ part_i, const int* __restrict__ part_bad,
                int P, int* __restrict__ ids, int* __restrict__ nonfinite) {
    pdl_begin();
    __shared__ float shv[WARP];
    __shared__ int shi[WARP];
    float bv = NEG_INF;
    int bi = BIG_ID;
    int bad = 0;
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const float v = part_v[(i64)blockIdx.x * P + p];
        const int i = part_i[(i64)blockIdx.x * P + p];
        bad |= part_bad[(i64)blockIdx.x * P + p];
        if (i != BIG_ID && arg_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    bad = __syncthreads_or(bad);
    block_argmax(bv, bi, shv, shi);
    if (threadIdx.x == 0) {
        ids[blockIdx.x] = bi == BIG_ID ? -1 : bi;
        nonfinite[blockIdx.x] = bad != 0;
    }
}

// Philox4x32-10, first output word for counter (c0, c1, 0, 0) and a 64-bit key (matches ops/sampling.py).
__device__ __forceinline__ unsigned philox_first(unsigned c0, unsigned c1, unsigned long long key) {
    unsigned x0 = c0, x1 = c1, x2 = 0u, x3 = 0u;
    unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);
    for (int r = 0; r < 10; ++r) {
        unsigned long long p0 = (unsigned long long)x0 * 0xD2511F53ull;
        unsigned long long p1 = (unsigned long long)x2 * 0xCD9E8D57ull;
        unsigned hi0 = (unsigned)(p0 >> 32), lo0 = (unsigned)p0;
        unsigned hi1 = (unsigned)(p1 >> 32), lo1 = (unsigned)p1;
        x0 = hi1 ^ x1 ^ k0; x1 = lo1; x2 = hi0 ^ x3 ^ k1; x3 = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    return x0;
}

// One block per row: out[t] = argmax_v logits[t, v] * inv_temp + gumbel(seed, positions[t], v), in double so
// the draw equals the numpy reference; ties -> lower id.
extern "C" __global__ void __launch_bounds__(256) sample_rows(const float* __restrict__ logits, int V,
        const int* __restrict__ positions, double inv_temp, unsigned long long seed, int* __restrict__ out) {
    pdl_begin();
    __shared__ double best_v[256];
    __shared__ int best_i[256];
    int t = blockIdx.x;
    unsigned pos = (unsigned)positions[t];
    double bv = -1e300; int bi = 0x7fffffff;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        double u = ((double)philox_first((unsigned)v, pos, seed) + 0.5) / 4294967296.0;
        double s = (double)logits[(long)t * V + v] * inv_temp - log(-log(u));
        if (s > bv || (s == bv && v < bi)) { bv = s; bi = v; }
    }
    best_v[threadIdx.x] = bv; best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            double ov = best_v[threadIdx.x + stride]; int oi = best_i[threadIdx.x + stride];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov; best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[t] = best_i[0];
}
