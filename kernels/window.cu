// Window-level kernels: embedding broadcast to the hyper-connection streams and position-keyed sampling.
// Legend: T window rows, C streams, D hidden, V vocabulary.
#include "common.cuh"

// R [T, C, D] <- emb [T, D] on every stream (the residual stack starts as C copies of the embedding).
extern "C" __global__ void broadcast_streams(const float* __restrict__ emb, float* __restrict__ R,
                                             int T, int C, int D) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n = (long)T * C * D;
    if (i >= n) return;
    int d = (int)(i % D);
    int t = (int)(i / ((long)C * D));
    R[i] = emb[(long)t * D + d];
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
