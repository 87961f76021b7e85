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

// Programmatic dependent launch (sm_90+; strata_cli/gpu/pdl.py turns a window graph's kernel -> kernel edges
// programmatic): a dependent grid may start while its predecessor finishes, so the inter-kernel drain and cold start
// overlap. pdl_wait blocks until every prerequisite grid has completed and its memory is visible (a no-op in a launch
// with no programmatic predecessor, and below sm_90); pdl_launch_dependents lets the next grid be scheduled once
// every block of this one has issued it or exited. Triggering at once is safe: the dependent's own pdl_wait still
// waits for this whole grid. Every kernel but the doorbell pair (tiers.cu) and stamp_globaltimer starts with
// pdl_begin (tests/test_pdl_sources.py holds it); before it a kernel may only prefetch its weights (pdl_prefetch_rows).
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents();
    pdl_wait();
}

#define PDL_PREFETCH_LINES 2  // 128-byte L2 lines a thread prefetches per range: the block's first weight stages

// L2 prefetch of a block's weights while its predecessor still runs: rows [row0, row0 + rows) of a matrix of n_rows
// rows of row_bytes each (a Q8_0_R32 group of 32 rows counts as one row), reps times, rep_rows rows apart (hyper.cu's
// per-stream rows). The blocks along y (window-row tiles) read the same rows, so only y = 0 prefetches; the blocks
// along z (K split) take a share each. Weights only: nothing a previous kernel writes may be touched before pdl_wait.
// A row0 outside 0..n_rows-1 prefetches nothing. Not inlined: inlined, its address math stayed live into the main
// loop of gemv_q8r_gateup_dense_t1 (80 -> 84 registers: 3 -> 2 blocks an SM; ptxas -v, sm_90); called, every
// kernel keeps its register count of before (within its allocation step) and no stack.
__device__ __noinline__ void pdl_prefetch_rows(const void* W, i64 row_bytes, i64 row0, i64 rows, i64 n_rows,
                                                  int reps = 1, i64 rep_rows = 0) {
    if (blockIdx.y != 0 || row0 < 0 || row0 >= n_rows) return;
    const i64 bytes = (min(row0 + rows, n_rows) - row0) * row_bytes;
    const i64 share = (bytes + gridDim.z - 1) / gridDim.z, lo = share * blockIdx.z;
    const i64 lines = min((min(share, bytes - lo) + 127) / 128, (i64)blockDim.x * PDL_PREFETCH_LINES);
    for (int r = 0; r < reps; ++r) {
        const u8* base = (const u8*)W + (row0 + r * rep_rows) * row_bytes + lo;
        for (i64 i = threadIdx.x; i < lines; i += blockDim.x)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + i * 128));
    }
}

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

// Element i of a raw weight row of type F32, F16, BF16 or Q8_0, read element-wise: for the small matrices that
// hyper.cu (inject) and gdn.cu (alpha/beta) fuse into other kernels (the GEMV files stream the big ones).
// raw_at_t: the same with the type fixed at compile time (a caller that unrolls many reads dispatches on the type
// once, so each unrolled body is one straight-line block whose loads the scheduler can issue together).
template <int TYPE>
__device__ __forceinline__ float raw_at_t(const u8* __restrict__ row, i64 i) {
    if (TYPE == GGML_F32) return __ldg(reinterpret_cast<const float*>(row) + i);
    if (TYPE == GGML_F16) return f16_bits_to_float(__ldg(reinterpret_cast<const u16*>(row) + i));
    if (TYPE == GGML_BF16) return bf16_bits_to_float(__ldg(reinterpret_cast<const u16*>(row) + i));
    const u8* blk = row + (i / QK8_0) * Q8_0_BYTES;
    return q8_0_scale(blk) * (float)(signed char)__ldg(blk + 2 + i % QK8_0);
}

__device__ __forceinline__ float raw_at(const u8* __restrict__ row, int type, i64 i) {
    if (type == GGML_F32) return raw_at_t<GGML_F32>(row, i);
    if (type == GGML_F16) return raw_at_t<GGML_F16>(row, i);
    if (type == GGML_BF16) return raw_at_t<GGML_BF16>(row, i);
    return raw_at_t<GGML_Q8_0>(row, i);
}

// Element i of a gathered table row of type F32, F16, BF16 or Q8_0 (embed.cu gather_rows, ple.cu ple_gather):
// plain loads, since the table may be mapped host memory.
__device__ __forceinline__ float table_at(const u8* src, int type, int i) {
    if (type == GGML_F32) return reinterpret_cast<const float*>(src)[i];
    if (type == GGML_F16) return f16_bits_to_float(reinterpret_cast<const u16*>(src)[i]);
    if (type == GGML_BF16) return bf16_bits_to_float(reinterpret_cast<const u16*>(src)[i]);
    const u8* blk = src + (i64)(i / QK8_0) * Q8_0_BYTES;  // GGML_Q8_0
    return q8_0_scale(blk) * (float)(signed char)blk[2 + i % QK8_0];
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

// Whether this block is the last of the n blocks counted in *counter (a zeroed counter, reset by that block): its
// global writes made before the call are visible device-wide first, and the last block sees every block's (the CUDA
// threadFenceReduction pattern: no block waits for another). Every thread of the block calls it.
__device__ __forceinline__ bool arrived_last(unsigned* counter, unsigned n) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == n - 1;
        if (last) atomicExch(counter, 0u);
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// Split-K across the blocks of grid z, finished inside the same launch (no reduce kernel, one graph node less).
// Every block of a tile (blockIdx.x, blockIdx.y) has written raw sums of rows o0..o0+n_rows-1, window rows
// t0..t0+nt-1 to partial[z][t][o] (slices of T * n_out). The block counted last in tile_done[tile] adds the z
// slices in order (the same sum in every run: replays stay bit-identical), applies the epilogue and resets the
// counter for the next launch. Every thread of the block calls it.
// Whether this block is the last of its tile's gridDim.z blocks to arrive (tile_done[tile] counts them and is reset
// by that block). Every thread of the block calls it.
__device__ __forceinline__ bool zsplit_last(unsigned* tile_done) {
    return arrived_last(tile_done + blockIdx.y * gridDim.x + blockIdx.x, gridDim.z);
}

// sum over z < nz of p[z * slice], added in z order (the same bits as one load and add a slice), the loads issued
// ZSPLIT_BATCH at a time: a finish pays one L2 round trip per batch of slices, not one per slice (the small
// matrices' launches split 10-32 ways: launch_util.q8r_split's fill).
#define ZSPLIT_BATCH 8
__device__ __forceinline__ float zsplit_sum(const float* p, i64 slice, int nz) {
    float s = 0.0f;
    for (int z0 = 0; z0 < nz; z0 += ZSPLIT_BATCH) {
        float v[ZSPLIT_BATCH];
#pragma unroll
        for (int k = 0; k < ZSPLIT_BATCH; ++k) v[k] = z0 + k < nz ? __ldcg(p + (i64)(z0 + k) * slice) : 0.0f;
#pragma unroll
        for (int k = 0; k < ZSPLIT_BATCH; ++k)
            if (z0 + k < nz) s += v[k];
    }
    return s;
}

__device__ __forceinline__ void zsplit_finish(const float* partial, unsigned* tile_done, float* y, int n_out, int T,
                                              int t0, int nt, int o0, int n_rows, int act, float div,
                                              const float* mul, int mul_st, int mul_so) {
    if (!zsplit_last(tile_done)) return;
    const i64 slice = (i64)T * n_out;
    for (int i = threadIdx.x; i < n_rows * nt; i += blockDim.x) {
        const int t = t0 + i / n_rows, o = o0 + i % n_rows;
        if (o >= n_out) continue;
        const i64 at = (i64)t * n_out + o;
        const float s = zsplit_sum(partial + at, slice, (int)gridDim.z);  // L2: other SMs wrote it
        y[at] = gemv_epilogue(s, act, div, mul, (i64)t * mul_st + (i64)o * mul_so);
    }
}

// Tensor-core helpers (gemv_q8r.cu's dense and gemv_quant.cu's grouped expert GEMVs on mma.sync).
// (a, b) -> f16x2 hi = (f16(a), f16(b)) and lo = (f16(a - hi_a), f16(b - hi_b)), a in the low half.
__device__ __forceinline__ void split_f16x2(float a, float b, u32& hi, u32& lo) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(b), "f"(a));  // the first source goes to the high half
    const float ha = f16_bits_to_float((u16)(hi & 0xffffu)), hb = f16_bits_to_float((u16)(hi >> 16));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(b - hb), "f"(a - ha));
}

// The B fragments of the tensor-core GEMVs from each lane's 8 x values xv[nn] of column tile nn: k tile kt, register
// p holds the pair (4kt + 2p, +1) (INTERLEAVED: (4kt + p, +2), for A words decoded as bytes 0 and 2 of a word),
// split hi + lo; scaled[nn]: this lane's column of tile nn is taken x 2^-16 first (its |x| in the block or span
// reaches 2^15, where f16 overflows).
template <int NN, bool INTERLEAVED>
__device__ __forceinline__ void split_b_frags(const float (&xv)[NN][8], const bool (&scaled)[NN], u32 (&bh)[NN][2][2],
                                              u32 (&bl)[NN][2][2]) {
#pragma unroll
    for (int nn = 0; nn < NN; ++nn)
#pragma unroll
        for (int kt = 0; kt < 2; ++kt)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const int k0 = INTERLEAVED ? 4 * kt + p : 4 * kt + 2 * p;
                float a = xv[nn][k0], c = xv[nn][k0 + (INTERLEAVED ? 2 : 1)];
                if (scaled[nn]) { a *= 1.52587890625e-05f; c *= 1.52587890625e-05f; }  // 2^-16
                split_f16x2(a, c, bh[nn][kt][p], bl[nn][kt][p]);
            }
}

// Which columns of the B tiles are scaled, per column: big[nn] says this lane's 8 x values of its column g (lane =
// 4 g + t) reach 2^15; scaled[nn] = any of the 4 lanes of column g (the B split), unscale[nn][c] = 2^16 or 1 for
// the C fragment's column 2t + c (the sums' scale back). Per column, not per warp: a column scaled for another
// row's size would lose its small values to f16 subnormals (a window row of 1e5 next to rows of 1).
template <int NN>
__device__ __forceinline__ void column_scales(const bool (&big)[NN], bool (&scaled)[NN], float (&unscale)[NN][2]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
        int b = big[nn] ? 1 : 0;
        b |= __shfl_xor_sync(FULL_MASK, b, 1);
        b |= __shfl_xor_sync(FULL_MASK, b, 2);
        scaled[nn] = b != 0;
#pragma unroll
        for (int c = 0; c < 2; ++c) unscale[nn][c] = __shfl_sync(FULL_MASK, b, 4 * (2 * t + c)) ? 65536.0f : 1.0f;
    }
}

__device__ __forceinline__ void mma_f16_16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int N>
__device__ __forceinline__ int pick(const int (&v)[N], int i) {  // v[i] without a local-memory array
    int r = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) r = k == i ? v[k] : r;
    return r;
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

// Sum each warp's lanes, then the ksplit warps of each row group into the group's first warp (kslice 0, every lane
// holding the sums); true for that warp, false for the others. Every warp of the block must call it.
template <int ROWS, int NT>
__device__ __forceinline__ bool ksplit_sums(float (&acc)[ROWS][NT], int ksplit, int kslice, int group) {
    __shared__ float part[GEMV_WARPS][ROWS][NT];
    const int lane = threadIdx.x & (WARP - 1);
    const int warp = threadIdx.x / WARP;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
    return ksplit_reduce(acc, ksplit, kslice, lane == 0, [&](int r, int t) -> float& { return part[warp][r][t]; },
                         [&](int s, int r, int t) { return part[group * ksplit + s][r][t]; });
}

// Sum the ksplit warps of each row group, then the group's first warp writes its ROWS rows o0.. of every window
// row (gemv.cu and gemv_quant.cu: lane (r * NT + t) % 32 writes row r of window row t). y_rows[t] is the output
// row of window row t (dense: t0 + t; expert: the entry). Every warp of the block must call it.
template <int ROWS, int NT>
__device__ __forceinline__ void reduce_store(float (&acc)[ROWS][NT], int o0, int n_out, int nt, int ksplit,
                                             int kslice, int group, float* y, const int* y_rows, int act,
                                             float div, const float* mul, int mul_st, int mul_so) {
    if (!ksplit_sums(acc, ksplit, kslice, group)) return;
    const int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int o = o0 + r;
            if (lane == (r * NT + t) % WARP && o < n_out && t < nt) {
                const i64 row = y_rows[t];
                y[row * n_out + o] = gemv_epilogue(acc[r][t], act, div, mul, row * mul_st + (i64)o * mul_so);
            }
        }
}

// The dense GEMV driver (gemv.cu, gemv_q8r.cu, gemv_quant.cu): the block's window rows are t0 = blockIdx.y *
// GEMV_MAXT onwards (nt of them). dot(acc, xr, nt, t0) adds this warp's K slice into acc [ROWS][NT] (zeroed here);
// store(acc, rows, nt, dst, act, div, mul, mul_st, mul_so) adds up the warps and writes dst. With gridDim.z > 1 the
// raw sums go to partial[blockIdx.z] and the tile's last block finishes rows [tile_row0, tile_row0 + tile_rows)
// (zsplit_finish). Every thread of the block must call it.
template <int NT, int ROWS, typename Dot, typename Store>
__device__ __forceinline__ void dense_dot_store(int T, float* y, int n_out, int tile_row0, int tile_rows, int act,
                                                float div, const float* mul, int mul_st, int mul_so, float* partial,
                                                unsigned* tile_done, Dot dot, Store store) {
    const int t0 = blockIdx.y * GEMV_MAXT;
    const int nt = min(NT, T - t0);
    float acc[ROWS][NT];
    int rows[NT], xr[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        rows[t] = t0 + t;
        xr[t] = t;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r][t] = 0.0f;
    }
    dot(acc, xr, nt, t0);
    if (gridDim.z > 1) {  // raw partial sums of this z slice, then the tile's last block finishes
        store(acc, rows, nt, partial + (i64)blockIdx.z * T * n_out, ACT_NONE, 1.0f, nullptr, 0, 0);
        zsplit_finish(partial, tile_done, y, n_out, T, t0, nt, tile_row0, tile_rows, act, div, mul, mul_st, mul_so);
    } else {
        store(acc, rows, nt, y, act, div, mul, mul_st, mul_so);
    }
}

// The dense GEMV of gemv.cu and gemv_quant.cu (R output rows per warp): grid (ceil(n_out / (R * GEMV_WARPS /
// ksplit)), ceil(T / GEMV_MAXT), zsplit); the GEMV_WARPS / ksplit row groups of a block take R rows each, the
// ksplit warps of a group and the blocks along z interleaved K slices. dot(o0, kslice, kstride, acc, xr, n, t0) adds
// this warp's slice of rows o0.. for window rows t0.. into acc.
template <int NT, int R, typename Dot>
__device__ __forceinline__ void dense_rows(int T, float* y, int n_out, int ksplit, int act, float div,
                                           const float* mul, int mul_st, int mul_so, float* partial,
                                           unsigned* tile_done, Dot dot) {
    const int warp = threadIdx.x / WARP;
    const int group = warp / ksplit;
    const int kslice = warp % ksplit + blockIdx.z * ksplit, kstride = ksplit * gridDim.z;
    const int rows_per_block = R * (GEMV_WARPS / ksplit);
    const int o0 = blockIdx.x * rows_per_block + group * R;
    dense_dot_store<NT, R>(
        T, y, n_out, blockIdx.x * rows_per_block, rows_per_block, act, div, mul, mul_st, mul_so, partial, tile_done,
        [&](auto& acc, const auto& xs, int n, int t0) { dot(o0, kslice, kstride, acc, xs, n, t0); },
        [&](auto& acc, const auto& ys, int n, float* dst, int a, float d, const float* m, int mst, int mso) {
            reduce_store(acc, o0, n_out, n, ksplit, warp % ksplit, group, dst, ys, a, d, m, mst, mso);
        });
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

// The grouped expert GEMVs of gemv.cu and gemv_quant.cu (R output rows per warp, ROWS accumulator rows: R per
// matrix read): group u = blockIdx.y holds up to NT (row, slot) entries routed to expert g_expert[u] (moe.cu's
// moe_group), whose rows the block reads once for all of them; entry j reads x row j / x_div and writes y row j.
// Unused groups (count 0) leave at once; an expert id outside 0..E-1 writes NaN to its entries' rows instead of
// reading stray memory. dot(e, o0, kslice, acc, xr, n) adds this warp's K slice of expert e's rows o0.. into acc;
// store(acc, o0, kslice, group, rows, n) adds up the warps and writes y rows rows[0..n-1].
template <int NT, int R, int ROWS, typename Dot, typename Store>
__device__ __forceinline__ void grouped_entries(int n_expert, const int* g_expert, const int* g_count,
                                                const int* g_entries, int x_div, float* y, int n_out, int ksplit,
                                                Dot dot, Store store) {
    const int u = blockIdx.y;
    const int nt = min(g_count[u], NT);
    if (nt == 0) return;  // the whole block leaves: no barrier is left waiting
    const int e = g_expert[u];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const int group = warp / ksplit, kslice = warp % ksplit;
    const int o0 = (blockIdx.x * (GEMV_WARPS / ksplit) + group) * R;
    int rows[NT], xr[NT];
    expert_group_rows<NT>(g_entries, u, nt, x_div, rows, xr);
    if (e < 0 || e >= n_expert) {
        if (kslice == 0 && lane < R && o0 + lane < n_out)
            for (int t = 0; t < nt; ++t) y[(i64)rows[t] * n_out + o0 + lane] = QNAN;
        return;
    }
    grouped_dot_store<NT, ROWS>(
        nt, xr, rows, [&](auto& acc, const auto& xs, int n) { dot(e, o0, kslice, acc, xs, n); },
        [&](auto& acc, const auto& ys, int n) { store(acc, o0, kslice, group, ys, n); });
}

// One matrix's grouped GEMV: experts W + e * expert_stride, dot(We, o0, kslice, acc, xr, n); epilogue as
// reduce_store.
template <int NT, int R, typename Dot>
__device__ __forceinline__ void grouped_rows(const u8* W, i64 expert_stride, int n_expert, const int* g_expert,
                                             const int* g_count, const int* g_entries, int x_div, float* y,
                                             int n_out, int ksplit, int act, float div, const float* mul, int mul_st,
                                             int mul_so, Dot dot) {
    grouped_entries<NT, R, R>(
        n_expert, g_expert, g_count, g_entries, x_div, y, n_out, ksplit,
        [&](int e, int o0, int kslice, auto& acc, const auto& xs, int n) {
            dot(W + (i64)e * expert_stride, o0, kslice, acc, xs, n);
        },
        [&](auto& acc, int o0, int kslice, int group, const auto& ys, int n) {
            reduce_store(acc, o0, n_out, n, ksplit, kslice, group, y, ys, act, div, mul, mul_st, mul_so);
        });
}

// The dense and grouped GEMVs of one file's K-slice dot product over raw rows: slice(W, row_stride, o0, n_out, x,
// xr, nt, n_in, kslice, kstride, acc) adds this warp's slice of rows o0.. of W times window rows xr of x into acc
// (gemv.cu's slice_dot, gemv_quant.cu's QSlice). R rows per warp; grids as dense_rows and
// grouped_rows say.
template <int NT, int R, typename Slice>
__device__ __forceinline__ void slice_dense(Slice slice, const u8* W, i64 row_stride, const float* x, int n_in,
                                            float* y, int n_out, int T, int ksplit, int act, float div,
                                            const float* mul, int mul_st, int mul_so, float* partial,
                                            unsigned* tile_done) {
    dense_rows<NT, R>(T, y, n_out, ksplit, act, div, mul, mul_st, mul_so, partial, tile_done,
                      [&](int o0, int kslice, int kstride, auto& acc, const auto& xs, int n, int t0) {
                          slice(W, row_stride, o0, n_out, x + (i64)t0 * n_in, xs, n, n_in, kslice, kstride, acc);
                      });
}

template <int NT, int R, typename Slice>
__device__ __forceinline__ void slice_grouped(Slice slice, const u8* W, i64 expert_stride, i64 row_stride,
                                              int n_expert, const int* g_expert, const int* g_count,
                                              const int* g_entries, const float* x, int x_div, int n_in, float* y,
                                              int n_out, int ksplit, int act, float div, const float* mul,
                                              int mul_st, int mul_so) {
    grouped_rows<NT, R>(W, expert_stride, n_expert, g_expert, g_count, g_entries, x_div, y, n_out, ksplit, act, div,
                        mul, mul_st, mul_so, [&](const u8* We, int o0, int kslice, auto& acc, const auto& xs, int n) {
                            slice(We, row_stride, o0, n_out, x, xs, n, n_in, kslice, ksplit, acc);
                        });
}

// Groups J entries by key for the grouped GEMVs (moe.cu's moe_group by expert id, tiers.cu's tier_group by
// residency slot): sid [J] holds the keys in shared memory, is_leader >= blockDim.x ints of shared scratch. Group u
// gets up to max_rows entries (ascending, written as j0 + index) of key g_expert[u]; an entry leads a group when
// the number of earlier entries with its key is a multiple of max_rows. With negative_is_none a negative key
// forms no group (its entries belong to none); otherwise it is a key like any other. g_expert / g_count of the
// slots past the last group are -1 / 0. One block of >= J threads (J <= blockDim.x); every thread calls it.
__device__ __forceinline__ void group_by_key(const int* sid, int* is_leader, int j0, int J, int max_rows,
                                             bool negative_is_none, int* __restrict__ g_expert,
                                             int* __restrict__ g_count, int* __restrict__ g_entries) {
    const int j = threadIdx.x;
    int key = -1, before = 0;
    if (j < J) {
        key = sid[j];
        for (int i = 0; i < j; ++i) before += sid[i] == key;
    }
    const bool leader = j < J && (!negative_is_none || key >= 0) && before % max_rows == 0;
    is_leader[j] = leader;
    __syncthreads();
    int rank = 0, total = 0;
    for (int i = 0; i < J; ++i) {
        rank += i < j ? is_leader[i] : 0;
        total += is_leader[i];
    }
    if (leader) {
        int n = 0;
        for (int i = j; i < J && n < max_rows; ++i)
            if (sid[i] == key) g_entries[rank * max_rows + n++] = j0 + i;
        g_expert[rank] = key;
        g_count[rank] = n;
    }
    if (j < J && j >= total) {
        g_expert[j] = -1;
        g_count[j] = 0;
    }
}

// The block output a pending write of the hyper-connections adds (hyper.cu hc_write / hc_write_norm, ple.cu
// ple_mix_norm), bo[t, d]: given (bo != null), or parts != null: the MoE's combine,
// sum_k w[t, k] * parts[t*K + k, d] (+ shared[t, d] when shared is not null), moe.cu moe_combine's arithmetic
// (slot order), so the window has no combine node after its routed experts.
#define PENDING_UNROLL 17  // the routed experts' top-k (<= 16) plus the shared expert's slot
#define PENDING_LOADS 32   // parts loads a thread issues together (elements x slots of one chunk)

struct Pending {
    const float* bo;
    const float* parts;
    const float* w;
    const float* shared;
    int K;

    // p[e] = pending(t, d0 + e * stride) for the N elements below D (0 past it). The combine goes through the
    // slots in chunks of KC (a runtime loop, one copy of its body): a chunk's weight and parts loads (N x KC <=
    // PENDING_LOADS, predicated) are issued together, then added in slot order (moe_combine's sum: the same
    // bits), so K = 11 slots cost ceil(11 / KC) round trips (N = 1: KC = 17, one; hc_write_norm's N = 5: KC = 6,
    // two). shared is loaded with the first chunk and added last. (Unrolling all 17 slots into each of N
    // elements, the latency1 version, made hc_write_norm ~7500 instructions, instruction-fetch bound.)
    template <int N>
    __device__ __forceinline__ void at_n(int t, int d0, int stride, int D, float (&p)[N]) const {
        if (parts == nullptr) {
#pragma unroll
            for (int e = 0; e < N; ++e) {
                const int d = d0 + e * stride;
                p[e] = d < D ? bo[(i64)t * D + d] : 0.0f;
            }
            return;
        }
        constexpr int KC = PENDING_LOADS / N < 1 ? 1 : (PENDING_LOADS / N > PENDING_UNROLL ? PENDING_UNROLL
                                                                                         : PENDING_LOADS / N);
        const float* wt = w + (i64)t * K;
        const float* rows = parts + (i64)t * K * D;  // entry t*K + k at rows[k * D]
        float sh[N];
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const int d = d0 + e * stride;
            p[e] = 0.0f;
            sh[e] = shared != nullptr && d < D ? shared[(i64)t * D + d] : 0.0f;
        }
#pragma unroll 1
        for (int k0 = 0; k0 < K; k0 += KC) {
            float wk[KC], pk[KC][N];  // the chunk's loads before its first product
#pragma unroll
            for (int i = 0; i < KC; ++i) {
                const bool slot = k0 + i < K;
                wk[i] = slot ? wt[k0 + i] : 0.0f;
#pragma unroll
                for (int e = 0; e < N; ++e) {
                    const int d = d0 + e * stride;
                    pk[i][e] = slot && d < D ? rows[(i64)(k0 + i) * D + d] : 0.0f;
                }
            }
#pragma unroll
            for (int i = 0; i < KC; ++i)
                if (k0 + i < K) {
#pragma unroll
                    for (int e = 0; e < N; ++e) p[e] += wk[i] * pk[i][e];
                }
        }
        if (shared != nullptr) {
#pragma unroll
            for (int e = 0; e < N; ++e) p[e] += sh[e];
        }
    }

    __device__ __forceinline__ float at(int t, int d, int D) const {
        float p[1];
        at_n<1>(t, d, 1, D, p);
        return p[0];
    }

    // The pending write onto a register tile: v[e] += fl(pending(t, d0 + e * stride) * g) for the elements below D
    // (the layer's residual stream update as hc_write computes it: one rounding of the product, then the add), and
    // r[d] = v[e] where r is given (the write's result back to the residual row; nullptr where nothing reads it
    // again). hc_write_norm and ple_mix_norm apply it before their norms.
    template <int N>
    __device__ __forceinline__ void add_n(int t, int d0, int stride, int D, float g, float (&v)[N], float* r) const {
        float p[N];
        at_n<N>(t, d0, stride, D, p);
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const int d = d0 + e * stride;
            if (d < D) {
                v[e] = v[e] + __fmul_rn(p[e], g);
                if (r != nullptr) r[d] = v[e];
            }
        }
    }
};
