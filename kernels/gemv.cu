// gemv.cu: multi-row GEMV over GGUF raw weights, with a fused epilogue. Memory-bound: built to stream W once.
//
//   y[t, o] = act(sum_i W[o, i] * x[t, i] / div) * (mul ? mul[t * mul_st + o * mul_so] : 1)
//
// Legend: T window rows, n_in input width, n_out output rows, J = T*K (row, slot) entries of the MoE, E experts.
//   W      raw rows of row_stride bytes: F32, F16 / BF16 (uint16 bits), Q8_0 (n_in/32 blocks of 34 bytes)
//   x      [T, n_in] f32 (dense) or [J / x_div, n_in] f32 (grouped experts: entry j reads row j / x_div)
//   y      [T, n_out] or [J, n_out] f32
//   gate-up (gemv_gateup_<type>_t<NT>, grouped experts of the float types): h[j, o] = silu(Wg[e] . x[j / x_div])[o]
//          * (Wu[e] . x[j / x_div])[o], both matrices' rows read in one pass over x
//   mul    optional f32 multiplier; it may alias y (the one thread that writes y[t, o] reads mul there first),
//          which is how h = silu(gate . x) * (up . x) reuses the up buffer.
//
// Work split. The input axis is cut in steps (two Q8_0 blocks, or 32 elements of the float types); the lanes of a
// warp read a step's weights and x coalesced, and d * q equals the numpy dequantization exactly. A warp owns GEMV_RPW output
// rows: each x value it loads serves all of them (x is re-read from L1 once per GEMV_RPW rows, not per row).
// The GEMV_WARPS warps of a block form GEMV_WARPS / ksplit row groups of ksplit warps; the warps of a group take
// interleaved chunks (split-K, so a 1-row or 320-row matrix still fills the GPU) and add up in shared memory.
// NT, the bucket of window rows (1, 2, 4, 8, 16), is a template parameter so accumulators stay in registers.
#include "common.cuh"

#define GEMV_RPW 4  // output rows per warp (launch_util.GEMV_RPW mirrors it)
#define GEMV_UNROLL 2  // loop unroll depth of the K steps
constexpr int kGemvUnroll = GEMV_UNROLL;

template <int TYPE>
__device__ __forceinline__ float weight_at(const u8* row, int c, int lane, int n_in) {
    const int i = c * QK8_0 + lane;
    if constexpr (TYPE == GGML_Q8_0) {
        const u8* blk = row + (i64)c * Q8_0_BYTES;
        return q8_0_scale(blk) * (float)(signed char)__ldg(blk + 2 + lane);
    } else {
        if (i >= n_in) return 0.0f;
        if constexpr (TYPE == GGML_F32) return __ldg(reinterpret_cast<const float*>(row) + i);
        if constexpr (TYPE == GGML_F16) return f16_bits_to_float(__ldg(reinterpret_cast<const u16*>(row) + i));
        return bf16_bits_to_float(__ldg(reinterpret_cast<const u16*>(row) + i));
    }
}

// xv[t] = x[xr[t], i] of a float-type step's lane (element i of each live row t < nt; 0 past n_in or nt): the one x
// load of slice_dot and slice_dot_pair.
template <int NT>
__device__ __forceinline__ void load_x_lane(const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in, int i,
                                            float (&xv)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) xv[t] = (t < nt && i < n_in) ? __ldg(x + (i64)xr[t] * n_in + i) : 0.0f;
}

// acc[r][t] = (this warp's K slice of) W[o0 + r] . x[t] for r < GEMV_RPW (rows >= n_out skipped), t < nt.
// Q8_0: a step covers two blocks (64 elements): lane l reads quants 2*(l%16), +1 of block 2*step + l/16 as one
// u16 (the 34-byte blocks keep quants 2-byte aligned), so a warp load moves 64 bytes; x comes as float2.
// Other types: a step covers 32 elements, one per lane. Steps are dealt to the kstride warps of a row group.
// x row of window row t is xr[t] (dense: t; grouped experts: the entry's token row).
template <int TYPE, int NT>
__device__ __forceinline__ void slice_dot(const u8* __restrict__ W, i64 row_stride, int o0, int n_out,
                                          const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                          int kslice, int kstride, float (&acc)[GEMV_RPW][NT]) {
    const int lane = threadIdx.x & (WARP - 1);
    if constexpr (TYPE == GGML_Q8_0) {
        const int n_blocks = n_in / QK8_0;
        const int n_steps = (n_blocks + 1) / 2;
        const int half = lane >> 4, pair = (lane & 15) * 2;
#pragma unroll kGemvUnroll
        for (int s = kslice; s < n_steps; s += kstride) {
            const int c = 2 * s + half;
            const bool live = c < n_blocks;  // an odd block count leaves the upper half-warp idle on the last step
            const int i = c * QK8_0 + pair;
            float2 xv[NT];
#pragma unroll
            for (int t = 0; t < NT; ++t)
                xv[t] = (t < nt && live) ? __ldg(reinterpret_cast<const float2*>(x + (i64)xr[t] * n_in + i))
                                         : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int r = 0; r < GEMV_RPW; ++r) {
                if (o0 + r < n_out && live) {
                    const u8* blk = W + (i64)(o0 + r) * row_stride + (i64)c * Q8_0_BYTES;
                    // the launcher checks 2-byte alignment, so the fp16 scale is one load
                    const float d = f16_bits_to_float(__ldg(reinterpret_cast<const u16*>(blk)));
                    const u16 q2 = __ldg(reinterpret_cast<const u16*>(blk + 2 + pair));
                    const float w0 = d * (float)(signed char)(q2 & 0xff), w1 = d * (float)(signed char)(q2 >> 8);
#pragma unroll
                    for (int t = 0; t < NT; ++t) acc[r][t] += w0 * xv[t].x + w1 * xv[t].y;
                }
            }
        }
    } else {
        const int n_chunks = (n_in + QK8_0 - 1) / QK8_0;
#pragma unroll kGemvUnroll
        for (int c = kslice; c < n_chunks; c += kstride) {
            const int i = c * QK8_0 + lane;
            float xv[NT];
            load_x_lane(x, xr, nt, n_in, i, xv);
#pragma unroll
            for (int r = 0; r < GEMV_RPW; ++r) {
                if (o0 + r < n_out) {
                    const float w = weight_at<TYPE>(W + (i64)(o0 + r) * row_stride, c, lane, n_in);
#pragma unroll
                    for (int t = 0; t < NT; ++t) acc[r][t] += w * xv[t];
                }
            }
        }
    }
}

// slice_dot's float-type loop over two matrices of one geometry at once (the experts' gate Wg and up Wu): acc rows
// 0..GEMV_RPW-1 take Wg's rows o0.., rows GEMV_RPW.. the same rows of Wu; each x value a lane loads serves both,
// and every row's sum runs in slice_dot's order (the same bits as a launch per matrix).
template <int TYPE, int NT>
__device__ __forceinline__ void slice_dot_pair(const u8* __restrict__ Wg, const u8* __restrict__ Wu, i64 row_stride,
                                               int o0, int n_out, const float* __restrict__ x, const int (&xr)[NT],
                                               int nt, int n_in, int kslice, int kstride,
                                               float (&acc)[2 * GEMV_RPW][NT]) {
    static_assert(TYPE != GGML_Q8_0, "Q8_0 experts are repacked (gemv_q8r.cu gemv_q8r_gateup_t<NT>)");
    const int lane = threadIdx.x & (WARP - 1);
    const int n_chunks = (n_in + QK8_0 - 1) / QK8_0;
#pragma unroll kGemvUnroll
    for (int c = kslice; c < n_chunks; c += kstride) {
        const int i = c * QK8_0 + lane;
        float xv[NT];
        load_x_lane(x, xr, nt, n_in, i, xv);
#pragma unroll
        for (int r = 0; r < 2 * GEMV_RPW; ++r) {
            const int o = o0 + r % GEMV_RPW;
            if (o < n_out) {
                const float w = weight_at<TYPE>((r < GEMV_RPW ? Wg : Wu) + (i64)o * row_stride, c, lane, n_in);
#pragma unroll
                for (int t = 0; t < NT; ++t) acc[r][t] += w * xv[t];
            }
        }
    }
}

// reduce_store's tail for slice_dot_pair's rows: y row of entry t, column o0 + r = silu(gate) * up, as the gate
// launch's epilogue (ACT_SILU, div 1, mul = the up launch's output) computed it. Every warp of the block calls it.
template <int ROWS, int NT>
__device__ __forceinline__ void gateup_store(float (&acc)[ROWS][NT], int o0, int n_out, int nt, int ksplit,
                                             int kslice, int group, float* y, const int* y_rows) {
    if (!ksplit_sums(acc, ksplit, kslice, group)) return;
    constexpr int R = ROWS / 2;
    const int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int o = o0 + r;
            if (lane == (r * NT + t) % WARP && o < n_out && t < nt)
                y[(i64)y_rows[t] * n_out + o] = gemv_epilogue(acc[r][t], ACT_SILU, 1.0f, nullptr, 0) * acc[R + r][t];
        }
}

// slice_dot<TYPE> as a value: common.cuh's slice_dense / slice_grouped take the slice this way.
template <int TYPE>
struct SliceDot {
    template <typename... A>
    __device__ __forceinline__ void operator()(A&&... a) const { slice_dot<TYPE>(a...); }
};

// grid (ceil(n_out / (GEMV_RPW * GEMV_WARPS / ksplit)), ceil(T / GEMV_MAXT), zsplit), block GEMV_WARPS * 32.
// With zsplit > 1 the blocks along z take interleaved chunks too and write raw sums to partial[z][t][o]; the last
// block of each tile adds them and applies the epilogue (zsplit_finish; a 4-row x 10240 matrix needs many SMs).
#define GEMV_DENSE_KERNEL(NAME, TYPE, NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                                    \
        NAME(const u8* W, i64 row_stride, const float* x, int n_in, float* y, int n_out, int T, int ksplit,            \
             int act, float div, const float* mul, int mul_st, int mul_so, float* partial, unsigned* tile_done) {      \
        pdl_prefetch_rows(W, row_stride, (i64)blockIdx.x * GEMV_RPW * (GEMV_WARPS / ksplit),                           \
                          GEMV_RPW * (GEMV_WARPS / ksplit), n_out);                                                    \
        pdl_begin();                                                                                                   \
        slice_dense<NT, GEMV_RPW>(SliceDot<TYPE>{}, W, row_stride, x, n_in, y, n_out, T, ksplit, act, div, mul,        \
                                  mul_st, mul_so, partial, tile_done);                                                 \
    }

// One kernel per window-row bucket (launch_util.nt_bucket): NAME_t1, NAME_t2, NAME_t4, NAME_t8, NAME_t16.
#define NT_FAMILY(KERNEL, NAME, TYPE)                                                                                  \
    KERNEL(NAME##_t1, TYPE, 1) KERNEL(NAME##_t2, TYPE, 2) KERNEL(NAME##_t4, TYPE, 4) KERNEL(NAME##_t8, TYPE, 8)        \
    KERNEL(NAME##_t16, TYPE, 16)

#define GEMV_DENSE_FAMILY(SUFFIX, TYPE) NT_FAMILY(GEMV_DENSE_KERNEL, gemv_##SUFFIX, TYPE)

// Grouped experts: group u = blockIdx.y holds up to GEMV_MAXT (row, slot) entries routed to one expert
// (moe.cu's moe_group). The block reads that expert's rows (W + e * expert_stride) once for all its entries:
// entry j reads x row j / x_div and writes y row j. Unused groups (count 0) leave at once; a group whose id is
// outside 0..E-1 writes NaN to its entries' rows instead of reading stray memory.
#define GEMV_GROUPED_KERNEL(NAME, TYPE, NT)                                                                            \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                                    \
        NAME(const u8* W, i64 expert_stride, i64 row_stride, int n_expert, const int* g_expert,                        \
             const int* g_count, const int* g_entries, const float* x, int x_div, int n_in, float* y, int n_out,       \
             int ksplit, int act, float div, const float* mul, int mul_st, int mul_so) {                               \
        pdl_begin();                                                                                                   \
        slice_grouped<NT, GEMV_RPW>(SliceDot<TYPE>{}, W, expert_stride, row_stride, n_expert, g_expert, g_count,       \
                                    g_entries, x, x_div, n_in, y, n_out, ksplit, act, div, mul, mul_st, mul_so);       \
    }

#define GEMV_GROUPED_FAMILY(SUFFIX, TYPE) NT_FAMILY(GEMV_GROUPED_KERNEL, gemv_expert_##SUFFIX, TYPE)

// Grouped gate + up of the float types (the routed experts' first half, one launch): groups, grid and block as
// the grouped kernels (GEMV_RPW rows of each matrix per warp); Wg, Wu [E, n_out, n_in] raw, expert e's rows at
// W + e * expert_stride; y [J, n_out] = silu(gate) * up, an out-of-range expert's entries NaN.
#define GEMV_GATEUP_KERNEL(NAME, TYPE, NT)                                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                                    \
        NAME(const u8* Wg, const u8* Wu, i64 expert_stride, i64 row_stride, int n_expert, const int* g_expert,        \
             const int* g_count, const int* g_entries, const float* x, int x_div, int n_in, float* y, int n_out,       \
             int ksplit) {                                                                                             \
        pdl_begin();                                                                                                   \
        grouped_entries<NT, GEMV_RPW, 2 * GEMV_RPW>(                                                                   \
            n_expert, g_expert, g_count, g_entries, x_div, y, n_out, ksplit,                                           \
            [&](int e, int o0, int kslice, auto& acc, const auto& xs, int n) {                                         \
                slice_dot_pair<TYPE>(Wg + (i64)e * expert_stride, Wu + (i64)e * expert_stride, row_stride, o0, n_out,  \
                                     x, xs, n, n_in, kslice, ksplit, acc);                                             \
            },                                                                                                         \
            [&](auto& acc, int o0, int kslice, int group, const auto& ys, int n) {                                     \
                gateup_store(acc, o0, n_out, n, ksplit, kslice, group, y, ys);                                         \
            });                                                                                                        \
    }

#define GEMV_GATEUP_FAMILY(SUFFIX, TYPE) NT_FAMILY(GEMV_GATEUP_KERNEL, gemv_gateup_##SUFFIX, TYPE)

// Compiled once per weight type (strata_cli/gpu/compile.py: module "gemv.<suffix>" puts `#define GEMV_<SUFFIX>`
// first): the 40 kernels of all four types in one NVRTC program took ~100 s, longer than every other module.
// Dense kernels: grid as above. Grouped: grid (ceil(n_out / (GEMV_RPW * GEMV_WARPS / ksplit)), J groups), block
// GEMV_WARPS * 32.
#if defined(GEMV_F32)
GEMV_DENSE_FAMILY(f32, GGML_F32)
GEMV_GROUPED_FAMILY(f32, GGML_F32)
GEMV_GATEUP_FAMILY(f32, GGML_F32)
#elif defined(GEMV_F16)
GEMV_DENSE_FAMILY(f16, GGML_F16)
GEMV_GROUPED_FAMILY(f16, GGML_F16)
GEMV_GATEUP_FAMILY(f16, GGML_F16)
#elif defined(GEMV_BF16)
GEMV_DENSE_FAMILY(bf16, GGML_BF16)
GEMV_GROUPED_FAMILY(bf16, GGML_BF16)
GEMV_GATEUP_FAMILY(bf16, GGML_BF16)
#elif defined(GEMV_Q8_0)
GEMV_DENSE_FAMILY(q8_0, GGML_Q8_0)
GEMV_GROUPED_FAMILY(q8_0, GGML_Q8_0)
#else
#error "gemv.cu is compiled per weight type: strata_cli/gpu/compile.py defines GEMV_<SUFFIX>"
#endif
