// common.cuh: device helpers shared by the kernel families. Uses no CUDA headers, so NVRTC needs no include path
// beyond kernels/ (fp16 goes through one PTX cvt; bf16 is the high half of a float32).
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// GGML type ids, as in strata_cli/model/quants.py.
#define GGML_F32 0
#define GGML_F16 1
#define GGML_Q8_0 8
#define GGML_BF16 30

// Q8_0 block: fp16 scale d (2 bytes, little endian) then 32 int8 q; value = d * q. 34 bytes, so only 2-byte aligned.
#define QK8_0 32
#define Q8_0_BYTES 34

#define WARP 32
#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define QNAN __int_as_float(0x7fc00000)
#define BIG_ID 0x7fffffff

// GEMV launch geometry shared by gemv.cu and gemv_q8r.cu (strata_cli/gpu/launch_util.py mirrors it): warps per
// block, and window rows per block along grid y (also the most entries an expert group holds).
#define GEMV_WARPS 8
#define GEMV_MAXT 16

// GEMV epilogues (strata_cli/gpu/launch_util.py mirrors these ids).
#define ACT_NONE 0
#define ACT_SILU 1
#define ACT_SIGMOID 2
#define ACT_2SIGMOID 3

__device__ __forceinline__ float f16_bits_to_float(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// bf16 subnormals become float32 denormals, which -ftz=true then flushes: they do not occur in real weights.
__device__ __forceinline__ float bf16_bits_to_float(u16 b) { return __uint_as_float((u32)b << 16); }

// Byte-wise read: a Q8_0 block start is only 2-byte aligned and views may start anywhere.
__device__ __forceinline__ float q8_0_scale(const u8* blk) {
    return f16_bits_to_float((u16)(blk[0] | (blk[1] << 8)));
}

// Same formulas as strata_cli/ops/basic.py (1 / (1 + exp(-x)), x * sigmoid(x)).
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }

__device__ __forceinline__ float apply_act(float v, int act) {
    switch (act) {
        case ACT_SILU: return silu_f(v);
        case ACT_SIGMOID: return sigmoid_f(v);
        case ACT_2SIGMOID: return 2.0f * sigmoid_f(v);
        default: return v;
    }
}

// The GEMV epilogue of gemv.cu and gemv_q8r.cu: act(acc / div), times mul[mul_idx] when mul is given.
__device__ __forceinline__ float gemv_epilogue(float acc, int act, float div, const float* mul, i64 mul_idx) {
    const float v = apply_act(acc / div, act);
    return mul ? v * mul[mul_idx] : v;
}

// The entries of expert group u (moe.cu's moe_group): output rows[t] and input rows xr[t] = rows[t] / x_div for
// t < nt; the rest 0.
template <int NT>
__device__ __forceinline__ void expert_group_rows(const int* g_entries, int u, int nt, int x_div, int (&rows)[NT],
                                                  int (&xr)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        rows[t] = t < nt ? g_entries[u * GEMV_MAXT + t] : 0;
        xr[t] = rows[t] / x_div;
    }
}

// Split-K inside a block (gemv.cu, gemv_q8r.cu): the ksplit warps of a set add their accumulators through shared
// memory. Each warp stores its own (cell(r, t) = its shared slot; `writer` false skips the store), then the set's
// first warp (kslice 0) adds the others' slots other(s, r, t), s = 1..ksplit-1. Returns whether this warp goes on
// to write y (kslice 0). Every warp of the block must call it (it holds a barrier when ksplit > 1).
template <int ROWS, int NT, typename Cell, typename Other>
__device__ __forceinline__ bool ksplit_reduce(float (&acc)[ROWS][NT], int ksplit, int kslice, bool writer, Cell cell,
                                              Other other) {
    if (ksplit == 1) return true;
    if (writer) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) cell(r, t) = acc[r][t];
    }
    __syncthreads();
    if (kslice != 0) return false;
    for (int s = 1; s < ksplit; ++s)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[r][t] += other(s, r, t);
    return true;
}

// The accumulate-and-store tail of the grouped expert GEMVs (gemv.cu, gemv_q8r.cu). Most groups hold one entry:
// such a group (uniform per block) runs one accumulator per output row instead of NT. dot(acc, xr, n) adds this
// warp's K slice of the n window rows into acc [ROWS][n] (zeroed here); store(acc, rows, n) adds up the warps and
// writes y rows rows[0..n-1]. Every warp of the block must call it (store holds a barrier).
template <int NT, int ROWS, typename Dot, typename Store>
__device__ __forceinline__ void grouped_dot_store(int nt, const int (&xr)[NT], const int (&rows)[NT], Dot dot,
                                                  Store store) {
    if (NT > 1 && nt == 1) {
        float acc1[ROWS][1];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc1[r][0] = 0.0f;
        const int xr1[1] = {xr[0]}, rows1[1] = {rows[0]};
        dot(acc1, xr1, 1);
        store(acc1, rows1, 1);
        return;
    }
    float acc[ROWS][NT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    dot(acc, xr, nt);
    store(acc, rows, nt);
}

// Split-K across the blocks of grid z, finished inside the same launch (no reduce kernel, one graph node less).
// Every block of a tile (blockIdx.x, blockIdx.y) has written raw sums of rows o0..o0+n_rows-1, window rows
// t0..t0+nt-1 to partial[z][t][o] (slices of T * n_out). The block counted last in tile_done[tile] adds the z
// slices in order (the same sum in every run: replays stay bit-identical), applies the epilogue and resets the
// counter for the next launch. Every thread of the block calls it.
__device__ __forceinline__ void zsplit_finish(const float* partial, unsigned* tile_done, float* y, int n_out, int T,
                                              int t0, int nt, int o0, int n_rows, int act, float div,
                                              const float* mul, int mul_st, int mul_so) {
    __shared__ int last;
    __threadfence();  // this block's partial sums are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* counter = tile_done + blockIdx.y * gridDim.x + blockIdx.x;
        last = atomicAdd(counter, 1u) == gridDim.z - 1;
        if (last) atomicExch(counter, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const i64 slice = (i64)T * n_out;
    for (int i = threadIdx.x; i < n_rows * nt; i += blockDim.x) {
        const int t = t0 + i / n_rows, o = o0 + i % n_rows;
        if (o >= n_out) continue;
        const i64 at = (i64)t * n_out + o;
        float s = 0.0f;
        for (int z = 0; z < (int)gridDim.z; ++z) s += __ldcg(partial + z * slice + at);  // L2: other SMs wrote it
        y[at] = gemv_epilogue(s, act, div, mul, (i64)t * mul_st + (i64)o * mul_so);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Higher value wins; equal values go to the lower id (numpy's argmax / stable argsort order). NaN never wins.
__device__ __forceinline__ bool arg_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, v, o);
        const int oi = __shfl_xor_sync(FULL_MASK, i, o);
        if (arg_better(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

struct WarpSum {
    __device__ __forceinline__ float operator()(float v) const { return warp_sum(v); }
};
struct WarpMax {
    __device__ __forceinline__ float operator()(float v) const { return warp_max(v); }
};

// Block reductions: blockDim.x a multiple of 32 (<= 1024), every thread calls them, sh holds >= 32 entries.
// The leading barrier lets callers reuse sh back to back. Warps reduce with op, then warp 0 reduces the warps'
// results (lanes past the last warp contribute the identity).
template <typename WarpOp>
__device__ __forceinline__ float block_reduce(float v, float* sh, float identity, WarpOp op) {
    const int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = op(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = op(lane < nw ? sh[lane] : identity);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float block_sum(float v, float* sh) { return block_reduce(v, sh, 0.0f, WarpSum()); }

__device__ __forceinline__ float block_max(float v, float* sh) { return block_reduce(v, sh, NEG_INF, WarpMax()); }

// (v, i) in, the block's best pair out (to every thread). Start threads with (NEG_INF, BIG_ID).
__device__ __forceinline__ void block_argmax(float& v, int& i, float* shv, int* shi) {
    const int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    warp_argmax(v, i);
    __syncthreads();
    if (lane == 0) { shv[w] = v; shi[w] = i; }
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? shv[lane] : NEG_INF;
        i = lane < nw ? shi[lane] : BIG_ID;
        warp_argmax(v, i);
        if (lane == 0) { shv[0] = v; shi[0] = i; }
    }
    __syncthreads();
    v = shv[0];
    i = shi[0];
}
