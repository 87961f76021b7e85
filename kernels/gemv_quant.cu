// gemv_quant.cu: GEMVs and row gathers that read GGUF K-quant / i-quant / legacy / FP4 blocks directly (no
// dequantized copy of a weight on the device). Compiled once per block type: strata_cli/gpu/quant_source.py puts
// `#define QTYPE <id>` and the type's tables before this file (launch_quant.py launches it).
//
//   y[t, o] = act(sum_i W[o, i] * x[t, i] / div) * (mul ? mul[t * mul_st + o * mul_so] : 1)     qgemv_*, qgemv_expert_*
//   y[j, o] = silu(W_gate[e] . x[j / x_div])[o] * (W_up[e] . x[j / x_div])[o]                   qgemv_gateup_*
//
// Legend: T window rows, n_in input width (a multiple of the type's block), n_out output rows, J = T*K (row, slot)
// entries of the MoE, E experts, QK elements per block.
//   W      raw rows of row_stride bytes (n_in / QK blocks each); experts expert_stride bytes apart; every row and
//          expert starts at the block's natural alignment (QAl: launch_quant checks the base)
//   x      [T, n_in] f32 (dense) or [J / x_div, n_in] f32 (grouped experts: entry j reads row j / x_div), rows
//          16-byte aligned (read as float4)
//   y      [T, n_out] or [J, n_out] f32; mul may alias y (as in gemv.cu)
//
// Every weight is decoded exactly (quant_decode.cuh: the float gguf.quants gives) and multiplied by the float32
// activation; sums are float32. The activations are never quantized. Work split as in gemv.cu: the input axis is cut
// in steps of 256 elements, lane l decoding elements 8l .. 8l+7 of a step (a 256-block, or 256/QK smaller blocks);
// a warp owns QROWS(NT) output rows (the gate/up kernel QROWS(NT)/2 rows of each matrix) and reuses each x load for
// all of them; the warps of a row group (ksplit) and the blocks along grid z (zsplit, dense only) take interleaved
// steps and add up in shared memory / zsplit_finish.
#include "quant_decode.cuh"

#ifndef QTYPE
#error "gemv_quant.cu is compiled per type: strata_cli/gpu/quant_source.py defines QTYPE"
#endif

#define QSTEP 256
// output rows per warp by window bucket (launch_quant.QROWS mirrors it): fewer rows when NT accumulators grow
#define QROWS(NT) ((NT) >= 8 ? 2 : 4)

typedef QBlock<QTYPE> QB;

// x[row, i .. i+8) as two 16-byte loads (i a multiple of 8; the launcher checks x's 16-byte alignment)
__device__ __forceinline__ void load_x8(const float* __restrict__ x, int row, int n_in, int i, float4& a, float4& b) {
    const float4* xp = reinterpret_cast<const float4*>(x + (i64)row * n_in + i);
    a = __ldg(xp);
    b = __ldg(xp + 1);
}

// 8 zero weights (a row past n_out)
__device__ __forceinline__ void zero8(float (&w)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = 0.0f;
}

// The staged dot product (every kernel of this file).
//
// Why: a lane that fetches its own 8 weights with narrow loads straight from global memory and rounds each weight
// (__fmul_rn chains, ~12 instructions a weight) is instruction- and latency-bound (7-20 % of the H200's bandwidth,
// the per-lane decoder this replaced). Here streaming and decoding are separate:
//   copy  a warp fetches the raw bytes of its next stage with aligned 16-byte loads (coalesced: consecutive lanes
//         read consecutive 16 bytes of one row), all of them issued before it decodes the current stage, so a
//         whole stage (~QSTAGE_BYTES) per warp stays in flight; then it parks them in its shared-memory slot.
//   dot   lane l decodes elements 8l .. 8l+7 of each 256-element step from shared memory in q-form (qdec8:
//         w_k = d q_k + m, q_k exact small floats made without I2F) and adds d * sum_k q_k x_k (+ m * sum_k x_k)
//         per window row: one scale multiply per 8 weights instead of two roundings per weight. The decoded
//         weights are gguf's (tests/test_quant_decode_host.py checks fl(fl(d q) + m) bit for bit); only the
//         float32 sum is reassociated. x stays float32, read as float4 from L1 and reused for all R rows.
//         No cross-lane shuffles until the final warp_sum of reduce_store.
//
// Shape legend (one warp; R rows row(0) .. row(R-1), NT window rows):
//   step s      256 input elements of a row = QSTEP_BYTES raw bytes (256 / QK blocks); the warp takes steps
//               s = kslice, kslice + kstride, ... (split-K: the block's ksplit warps and grid z)
//   stage st    QSB consecutive steps of the warp (its steps j = st*QSB .. st*QSB+QSB-1) for all R rows:
//               U = R * QSB units, unit u = r * QSB + j = one contiguous byte range of row r
//   chunk       a unit widened to 16-byte boundaries is at most QCHUNKS aligned 16-byte chunks (every loaded chunk
//               holds at least one byte of its unit, so no load leaves the weight's pages); chunk c = u * QCHUNKS
//               + k of a stage is loaded by lane c % 32 into register slot c / 32 and stored at stage[warp][c].
//               A range's bytes keep their address mod 16 in shared memory, so each block keeps its alignment
//               (the launcher only sends weights whose base has the block's natural alignment, QAl).
//   partial step (n_in % 256 != 0): its range is shorter; lanes past n_in decode nothing.
#define QSTEP_BYTES (QSTEP / QB::qk * QB::bytes)
#define QCHUNKS ((QSTEP_BYTES + 30) / 16)
#ifndef QSTAGE_BYTES  // raw bytes per warp and stage: what one warp keeps in flight (bench/quant_gemv_bench.py)
#define QSTAGE_BYTES 2048
#endif
// steps per stage for R rows: about QSTAGE_BYTES, 1..8
constexpr int qstage_steps(int R) {
    return QSTAGE_BYTES / (R * QSTEP_BYTES) < 1   ? 1
           : QSTAGE_BYTES / (R * QSTEP_BYTES) > 8 ? 8
                                                  : QSTAGE_BYTES / (R * QSTEP_BYTES);
}

// sum_k q_k x_k of one group of 8 (x = a, c)
__device__ __forceinline__ float qdot8(const float (&q)[8], float4 a, float4 c) {
    float v = q[0] * a.x;
    v = fmaf(q[1], a.y, v);
    v = fmaf(q[2], a.z, v);
    v = fmaf(q[3], a.w, v);
    v = fmaf(q[4], c.x, v);
    v = fmaf(q[5], c.y, v);
    v = fmaf(q[6], c.z, v);
    return fmaf(q[7], c.w, v);
}

// This warp's shared-memory stage (one array per R, shared by the NT and single-entry paths of a kernel).
template <int R>
__device__ __forceinline__ int4* qstage_slot() {
    __shared__ int4 stage[GEMV_WARPS][R * qstage_steps(R) * QCHUNKS];
    return stage[threadIdx.x / WARP];
}

// acc[r][t] += this warp's K slice of row(r) . x[xr[t]], r < R, t < nt; row(r) is the start of weight row r, asked
// only where live(r) (false: a row past n_out, never loaded, never stored; an integer test, so that the R row
// pointers need not stay in registers).
template <int R, int NT, typename Row, typename Live>
__device__ __forceinline__ void qslice_rows(Row row, Live live, const float* __restrict__ x, const int (&xr)[NT],
                                            int nt, int n_in, int kslice, int kstride, float (&acc)[R][NT]) {
    constexpr int SB = qstage_steps(R), NCHUNK = R * SB * QCHUNKS, NCH = (NCHUNK + WARP - 1) / WARP;
    const int lane = threadIdx.x & (WARP - 1);
    const int n_steps = (n_in + QSTEP - 1) / QSTEP;
    const i64 row_bytes = (i64)(n_in / QB::qk) * QB::bytes;
    const int my_steps = kslice < n_steps ? (n_steps - kslice + kstride - 1) / kstride : 0;
    const int n_stages = (my_steps + SB - 1) / SB;
    if (n_stages == 0) return;  // warp-uniform
    int4* stage = qstage_slot<R>();
    int4 ring[NCH];
#pragma unroll
    for (int i = 0; i < NCH; ++i) ring[i] = make_int4(0, 0, 0, 0);

    auto load = [&](int st) {  // stage st's chunks into registers (loads left in flight)
#pragma unroll
        for (int i = 0; i < NCH; ++i) {
            const int c = lane + i * WARP;
            const int u = c / QCHUNKS, k = c - u * QCHUNKS;
            const int r = u / SB, j = u - r * SB;
            const int s = kslice + (st * SB + j) * kstride;
            if (c < NCHUNK && live(r) && s < n_steps) {
                const u8* start = row(r) + (i64)s * QSTEP_BYTES;
                const int len = (int)min((i64)QSTEP_BYTES, row_bytes - (i64)s * QSTEP_BYTES);
                const int head = (int)((size_t)start & 15);
                if (16 * k < head + len) ring[i] = __ldg(reinterpret_cast<const int4*>(start - head) + k);
            }
        }
    };
    auto park = [&]() {
#pragma unroll
        for (int i = 0; i < NCH; ++i)
            if (lane + i * WARP < NCHUNK) stage[lane + i * WARP] = ring[i];
    };
    auto dot = [&](int st) {
#pragma unroll 1
        for (int j = 0; j < SB; ++j) {
            const int s = kslice + (st * SB + j) * kstride;
            if (s >= n_steps) break;  // warp-uniform
            const int i = s * QSTEP + lane * 8;
            if (i >= n_in) continue;  // the partial last step
            const int blk = lane * 8 / QB::qk, g = lane * 8 % QB::qk / 8;
            auto slot = [&](int r) {  // this lane's block of row o0 + r in the stage
                const size_t head = (size_t)(row(r) + (i64)s * QSTEP_BYTES) & 15;
                return reinterpret_cast<const u8*>(stage + (r * SB + j) * QCHUNKS) + head + blk * QB::bytes;
            };
            if constexpr (NT <= 4) {
                // few window rows: their x in registers, one row decoded at a time (fewer live registers)
                float4 xa[NT], xb[NT];
                float sx[NT];
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t < nt) {
                        load_x8(x, xr[t], n_in, i, xa[t], xb[t]);
                        if (QHasMin<QTYPE>::v)
                            sx[t] = ((xa[t].x + xa[t].y) + (xa[t].z + xa[t].w)) +
                                    ((xb[t].x + xb[t].y) + (xb[t].z + xb[t].w));
                    }
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (!live(r)) continue;  // rows past the end are never stored
                    float q[8], d, m = 0.0f;
                    qdec8<QTYPE>(slot(r), g, q, d, m);
#pragma unroll
                    for (int t = 0; t < NT; ++t) {
                        if (t < nt) {
                            float v = fmaf(d, qdot8(q, xa[t], xb[t]), acc[r][t]);
                            if (QHasMin<QTYPE>::v) v = fmaf(m, sx[t], v);
                            acc[r][t] = v;
                        }
                    }
                }
            } else {
                // many window rows: the R rows decoded first, then each x row loaded once for all of them
                float q[R][8], d[R], m[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    d[r] = 0.0f;
                    m[r] = 0.0f;
                    if (live(r)) {
                        qdec8<QTYPE>(slot(r), g, q[r], d[r], m[r]);
                    } else {
                        zero8(q[r]);
                    }
                }
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t < nt) {
                        float4 a, c;
                        load_x8(x, xr[t], n_in, i, a, c);
                        float sx = 0.0f;
                        if (QHasMin<QTYPE>::v) sx = ((a.x + a.y) + (a.z + a.w)) + ((c.x + c.y) + (c.z + c.w));
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            float v = fmaf(d[r], qdot8(q[r], a, c), acc[r][t]);
                            if (QHasMin<QTYPE>::v) v = fmaf(m[r], sx, v);
                            acc[r][t] = v;
                        }
                    }
                }
            }
        }
    };

    load(0);
    park();
    __syncwarp();
    for (int st = 0; st < n_stages; ++st) {
        if (st + 1 < n_stages) load(st + 1);  // in flight while this stage is decoded
        dot(st);
        __syncwarp();  // every lane is done reading the slot
        if (st + 1 < n_stages) {
            park();
            __syncwarp();
        }
    }
}

// This warp's K slice of rows o0 .. o0+R-1 of one matrix as a value for common.cuh's slice_dense / slice_grouped.
// Grids: QROWS(NT) rows per warp, as gemv.cu's; grouped experts as gemv.cu's (an id outside 0..E-1 writes NaN to
// its entries' rows).
struct QSlice {
    template <int R, int NT>
    __device__ __forceinline__ void operator()(const u8* __restrict__ W, i64 row_stride, int o0, int n_out,
                                               const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                               int kslice, int kstride, float (&acc)[R][NT]) const {
        qslice_rows([&](int r) { return W + (i64)(o0 + r) * row_stride; }, [&](int r) { return o0 + r < n_out; }, x,
                    xr, nt, n_in, kslice, kstride, acc);
    }
};

// Sum the ksplit warps (as reduce_store), then y[y_rows[t], o0 + r] = silu(gate row r) * (up row r) for r < ROWS / 2
// (acc rows 0..ROWS/2-1 gate, the rest up; N accumulator columns: NT, or 1 for a one-entry group).
template <int ROWS, int N>
__device__ __forceinline__ void gateup_store(float (&acc)[ROWS][N], int o0, int n_out, int nt, int ksplit,
                                             int kslice, int group, float* y, const int* y_rows) {
    constexpr int R = ROWS / 2;
    if (!ksplit_sums(acc, ksplit, kslice, group)) return;
    const int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < N; ++t)
            if (lane == (r * N + t) % WARP && o0 + r < n_out && t < nt)
                y[(i64)y_rows[t] * n_out + o0 + r] = apply_act(acc[r][t], ACT_SILU) * acc[R + r][t];
}

// The gate and up projections of the grouped experts in one pass (grid as qgemv_expert_*'s with R rows per warp
// of each matrix): acc rows 0..R-1 are gate rows o0.., rows R..2R-1 the same up rows, all staged together, so an
// expert's gate and up bytes are in flight at once and read once for all its entries; y[j, o] = silu(gate) * up.
template <int NT, int R>
__device__ __forceinline__ void gateup_grouped(const u8* Wg, const u8* Wu, i64 expert_stride, i64 row_stride,
                                               int n_expert, const int* g_expert, const int* g_count,
                                               const int* g_entries, const float* x, int x_div, int n_in, float* y,
                                               int n_out, int ksplit) {
    grouped_entries<NT, R, 2 * R>(
        n_expert, g_expert, g_count, g_entries, x_div, y, n_out, ksplit,
        [&](int e, int o0, int kslice, auto& acc, const auto& xs, int n) {
            const u8* G = Wg + (i64)e * expert_stride;
            const u8* U = Wu + (i64)e * expert_stride;
            qslice_rows([&](int r) { return (r < R ? G : U) + (i64)(o0 + (r < R ? r : r - R)) * row_stride; },
                        [&](int r) { return o0 + (r < R ? r : r - R) < n_out; }, x, xs, n, n_in, kslice, ksplit, acc);
        },
        [&](auto& acc, int o0, int kslice, int group, const auto& ys, int n) {
            gateup_store(acc, o0, n_out, n, ksplit, kslice, group, y, ys);
        });
}

// blocks per SM the register allocation must allow, by window bucket (3 at 256 threads: <= 85 registers; 2:
// <= 128): resident warps are what keeps enough stages in flight (ptxas -v, sm_90, q2_k: T = 1 at 80 registers
// spills 36-64 bytes a thread to L1-cached local memory, as before the gate/up kernel)
#define QMIN_BLOCKS(NT) ((NT) == 1 ? 3 : 2)

#define QGEMV_KERNELS(NT)                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP, QMIN_BLOCKS(NT))                                   \
        qgemv_t##NT(const u8* W, i64 row_stride, const float* x, int n_in, float* y, int n_out, int T, int ksplit,     \
                    int act, float div, const float* mul, int mul_st, int mul_so, float* partial,                      \
                    unsigned* tile_done) {                                                                             \
        slice_dense<NT, QROWS(NT)>(QSlice{}, W, row_stride, x, n_in, y, n_out, T, ksplit, act, div, mul, mul_st,       \
                                   mul_so, partial, tile_done);                                                        \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP, QMIN_BLOCKS(NT))                                   \
        qgemv_expert_t##NT(const u8* W, i64 expert_stride, i64 row_stride, int n_expert, const int* g_expert,          \
                           const int* g_count, const int* g_entries, const float* x, int x_div, int n_in,              \
                           float* y, int n_out, int ksplit, int act, float div, const float* mul, int mul_st,          \
                           int mul_so) {                                                                               \
        slice_grouped<NT, QROWS(NT)>(QSlice{}, W, expert_stride, row_stride, n_expert, g_expert, g_count, g_entries,   \
                                     x, x_div, n_in, y, n_out, ksplit, act, div, mul, mul_st, mul_so);                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP, QMIN_BLOCKS(NT))                                   \
        qgemv_gateup_t##NT(const u8* Wg, const u8* Wu, i64 expert_stride, i64 row_stride, int n_expert,                \
                           const int* g_expert, const int* g_count, const int* g_entries, const float* x, int x_div,   \
                           int n_in, float* y, int n_out, int ksplit) {                                                \
        gateup_grouped<NT, QROWS(NT) / 2>(Wg, Wu, expert_stride, row_stride, n_expert, g_expert, g_count, g_entries,  \
                                          x, x_div, n_in, y, n_out, ksplit);                                           \
    }

QGEMV_KERNELS(1)
QGEMV_KERNELS(2)
QGEMV_KERNELS(4)
QGEMV_KERNELS(8)
QGEMV_KERNELS(16)

// emb[n, :] = dequantized table row rows[n] (embed.cu's gather_rows for block types; bit-identical to gguf.quants).
// rows [N] int64; table raw rows of row_bytes; emb [N, hd] f32, hd a multiple of QK. grid N, block 256. The table
// may be mapped host memory.
extern "C" __global__ void __launch_bounds__(256)
    qgather_rows(const i64* __restrict__ rows, const u8* __restrict__ table, i64 row_bytes, float* __restrict__ emb,
                 int hd) {
    const u8* src = table + rows[blockIdx.x] * row_bytes;
    float* dst = emb + (i64)blockIdx.x * hd;
    for (int j = threadIdx.x; j < hd / 8; j += blockDim.x) {
        const int i = j * 8;
        float w[8];
        decode8<QTYPE>(src + (i64)(i / QB::qk) * QB::bytes, (i % QB::qk) / 8, w);
#pragma unroll
        for (int k = 0; k < 8; ++k) dst[i + k] = w[k];
    }
}
