// gemv.cu: multi-row GEMV over GGUF raw weights, with a fused epilogue.
//
//   y[t, o] = act(sum_i W[o, i] * x[t, i] / div) * (mul ? mul[t * mul_st + o * mul_so] : 1)
//
// Legend: T window rows, n_in input width, n_out output rows, J = T*K (row, slot) entries of the MoE, E experts.
//   W      raw rows of row_stride bytes: F32, F16 / BF16 (uint16 bits), Q8_0 (n_in/32 blocks of 34 bytes)
//   x      [T, n_in] f32 (dense) or [J / x_div, n_in] f32 (expert: entry j reads row j / x_div)
//   y      [T, n_out] or [J, n_out] f32
//   mul    optional f32 multiplier; it may alias y (each element is read, then written, by the same thread),
//          which is how h = silu(gate . x) * (up . x) reuses the up buffer.
//
// One warp per output row; a block holds GEMV_WARPS rows. Dense: blockIdx.y picks a chunk of GEMV_MAXT window
// rows, so each W row is read once per chunk for all its rows; x stays in L1/L2 (staging T x n_in in shared
// memory would not fit at n_in = 10240). Accumulation is float32 per row.
#include "common.cuh"

#define GEMV_WARPS 8
#define GEMV_MAXT 16

template <int TYPE>
__device__ __forceinline__ float load_weight(const u8* row, int i) {
    if constexpr (TYPE == GGML_F32) return reinterpret_cast<const float*>(row)[i];
    if constexpr (TYPE == GGML_F16) return f16_bits_to_float(reinterpret_cast<const u16*>(row)[i]);
    if constexpr (TYPE == GGML_BF16) return bf16_bits_to_float(reinterpret_cast<const u16*>(row)[i]);
    return 0.0f;
}

// acc[t] += (this lane's share of) W_row . x[t] for t < nt; x rows are n_in apart.
template <int TYPE, int MAXT>
__device__ __forceinline__ void row_dot(const u8* __restrict__ row, const float* __restrict__ x, int nt, int n_in,
                                        float (&acc)[MAXT]) {
    const int lane = threadIdx.x & (WARP - 1);
    if constexpr (TYPE == GGML_Q8_0) {
        // Lane l takes element l of every block: its x reads are coalesced, d*q equals the numpy dequant exactly.
        const int nb = n_in / QK8_0;
        for (int b = 0; b < nb; ++b) {
            const u8* blk = row + (i64)b * Q8_0_BYTES;
            const float w = q8_0_scale(blk) * (float)(signed char)blk[2 + lane];
            const float* xb = x + b * QK8_0 + lane;
#pragma unroll
            for (int t = 0; t < MAXT; ++t)
                if (t < nt) acc[t] += w * __ldg(xb + (i64)t * n_in);
        }
    } else {
        for (int i = lane; i < n_in; i += WARP) {
            const float w = load_weight<TYPE>(row, i);
#pragma unroll
            for (int t = 0; t < MAXT; ++t)
                if (t < nt) acc[t] += w * __ldg(x + (i64)t * n_in + i);
        }
    }
}

__device__ __forceinline__ float epilogue(float acc, int act, float div, const float* mul, i64 mul_idx) {
    const float v = apply_act(acc / div, act);
    return mul ? v * mul[mul_idx] : v;
}

template <int TYPE>
__device__ __forceinline__ void gemv_dense(const u8* W, i64 row_stride, const float* x, int n_in, float* y,
                                           int n_out, int T, int act, float div, const float* mul, int mul_st,
                                           int mul_so) {
    const int o = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (o >= n_out) return;  // whole warps leave; nothing below synchronises the block
    const int lane = threadIdx.x & (WARP - 1);
    const int t0 = blockIdx.y * GEMV_MAXT;
    const int nt = min(GEMV_MAXT, T - t0);
    float acc[GEMV_MAXT];
#pragma unroll
    for (int t = 0; t < GEMV_MAXT; ++t) acc[t] = 0.0f;
    row_dot<TYPE, GEMV_MAXT>(W + (i64)o * row_stride, x + (i64)t0 * n_in, nt, n_in, acc);
#pragma unroll
    for (int t = 0; t < GEMV_MAXT; ++t) {
        if (t < nt) {
            const float s = warp_sum(acc[t]);  // every lane holds the sum; lane t stores row t
            if (lane == t) {
                const i64 row = t0 + t;
                y[row * n_out + o] = epilogue(s, act, div, mul, row * mul_st + (i64)o * mul_so);
            }
        }
    }
}

// Entry j multiplies expert ids[j]'s matrix (W + ids[j] * expert_stride) by x row j / x_div.
// Each entry re-reads its expert's rows: reading an expert once for all rows routed to it is a later optimisation.
template <int TYPE>
__device__ __forceinline__ void gemv_expert(const u8* W, i64 expert_stride, i64 row_stride, int n_expert,
                                            const int* ids, const float* x, int x_div, int n_in, float* y,
                                            int n_out, int act, float div, const float* mul, int mul_st,
                                            int mul_so) {
    const int o = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (o >= n_out) return;
    const int lane = threadIdx.x & (WARP - 1);
    const int j = blockIdx.y;
    const int e = ids[j];
    const i64 out_idx = (i64)j * n_out + o;
    if (e < 0 || e >= n_expert) {  // a bad id shows up as NaN in the output, never as a stray read
        if (lane == 0) y[out_idx] = QNAN;
        return;
    }
    float acc[1] = {0.0f};
    row_dot<TYPE, 1>(W + (i64)e * expert_stride + (i64)o * row_stride, x + (i64)(j / x_div) * n_in, 1, n_in, acc);
    const float s = warp_sum(acc[0]);
    if (lane == 0) y[out_idx] = epilogue(s, act, div, mul, (i64)j * mul_st + (i64)o * mul_so);
}

#define GEMV_DENSE_KERNEL(NAME, TYPE)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                                \
        NAME(const u8* W, i64 row_stride, const float* x, int n_in, float* y, int n_out, int T, int act,          \
             float div, const float* mul, int mul_st, int mul_so) {                                                \
        gemv_dense<TYPE>(W, row_stride, x, n_in, y, n_out, T, act, div, mul, mul_st, mul_so);                     \
    }

#define GEMV_EXPERT_KERNEL(NAME, TYPE)                                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP)                                                \
        NAME(const u8* W, i64 expert_stride, i64 row_stride, int n_expert, const int* ids, const float* x,        \
             int x_div, int n_in, float* y, int n_out, int act, float div, const float* mul, int mul_st,          \
             int mul_so) {                                                                                         \
        gemv_expert<TYPE>(W, expert_stride, row_stride, n_expert, ids, x, x_div, n_in, y, n_out, act, div, mul,   \
                          mul_st, mul_so);                                                                         \
    }

// grid (ceil(n_out / GEMV_WARPS), ceil(T / GEMV_MAXT)), block GEMV_WARPS * 32
GEMV_DENSE_KERNEL(gemv_f32, GGML_F32)
GEMV_DENSE_KERNEL(gemv_f16, GGML_F16)
GEMV_DENSE_KERNEL(gemv_bf16, GGML_BF16)
GEMV_DENSE_KERNEL(gemv_q8_0, GGML_Q8_0)

// grid (ceil(n_out / GEMV_WARPS), J), block GEMV_WARPS * 32
GEMV_EXPERT_KERNEL(gemv_expert_f32, GGML_F32)
GEMV_EXPERT_KERNEL(gemv_expert_f16, GGML_F16)
GEMV_EXPERT_KERNEL(gemv_expert_bf16, GGML_BF16)
GEMV_EXPERT_KERNEL(gemv_expert_q8_0, GGML_Q8_0)
