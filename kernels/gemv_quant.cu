// gemv_quant.cu: GEMVs and row gathers that read GGUF K-quant / i-quant / legacy / FP4 blocks directly (no
// dequantized copy of a weight on the device). Compiled once per block type: strata_cli/gpu/quant_source.py puts
// `#define QTYPE <id>` and the type's tables before this file (launch_quant.py launches it).
//
//   y[t, o] = act(sum_i W[o, i] * x[t, i] / div) * (mul ? mul[t * mul_st + o * mul_so] : 1)     qgemv_*, qtc_expert_*
//   y[j, o] = silu(W_gate[e] . x[j / x_div])[o] * (W_up[e] . x[j / x_div])[o]                   qtc_gateup_*
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
// activation; sums are float32. The activations are never quantized. Dense work split as in gemv.cu: the input axis
// is cut in steps of 256 elements, lane l decoding elements 8l .. 8l+7 of a step (a 256-block, or 256/QK smaller
// blocks); a warp owns QROWS(NT) output rows and reuses each x load for all of them; the warps of a row group
// (ksplit) and the blocks along grid z (zsplit) take interleaved steps and add up in shared memory / zsplit_finish.
// The grouped expert GEMVs (qtc_*, below) run on tensor cores.
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

// This warp's K slice of rows o0 .. o0+R-1 of one matrix as a value for common.cuh's slice_dense. Grid: QROWS(NT)
// rows per warp, as gemv.cu's.
struct QSlice {
    template <int R, int NT>
    __device__ __forceinline__ void operator()(const u8* __restrict__ W, i64 row_stride, int o0, int n_out,
                                               const float* __restrict__ x, const int (&xr)[NT], int nt, int n_in,
                                               int kslice, int kstride, float (&acc)[R][NT]) const {
        qslice_rows([&](int r) { return W + (i64)(o0 + r) * row_stride; }, [&](int r) { return o0 + r < n_out; }, x,
                    xr, nt, n_in, kslice, kstride, acc);
    }
};

// blocks per SM the register allocation must allow, by window bucket (3 at 256 threads: <= 85 registers; 2:
// <= 128): resident warps are what keeps enough stages in flight (ptxas -v, sm_90, q2_k: T = 1 at 80 registers
// spills 36-64 bytes a thread to L1-cached local memory, as before the gate/up kernel)
#define QMIN_BLOCKS(NT) ((NT) == 1 ? 3 : 2)

#define QGEMV_KERNELS(NT)                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * WARP, QMIN_BLOCKS(NT))                                   \
        qgemv_t##NT(const u8* W, i64 row_stride, const float* x, int n_in, float* y, int n_out, int T, int ksplit,     \
                    int act, float div, const float* mul, int mul_st, int mul_so, float* partial,                      \
                    unsigned* tile_done) {                                                                             \
        pdl_prefetch_rows(W, row_stride, (i64)blockIdx.x * QROWS(NT) * (GEMV_WARPS / ksplit),                          \
                          QROWS(NT) * (GEMV_WARPS / ksplit), n_out);                                                   \
        pdl_begin();                                                                                                   \
        slice_dense<NT, QROWS(NT)>(QSlice{}, W, row_stride, x, n_in, y, n_out, T, ksplit, act, div, mul, mul_st,       \
                                   mul_so, partial, tile_done);                                                        \
    }

QGEMV_KERNELS(1)
QGEMV_KERNELS(2)
QGEMV_KERNELS(4)
QGEMV_KERNELS(8)
QGEMV_KERNELS(16)

// =====================================================================================================================
// Tensor-core grouped expert GEMVs: qtc_expert_t<NT> (one matrix, the dense epilogue) and qtc_gateup_t<NT> (silu(gate)
// * up), the routed experts' only path at every T (launch_quant.launch_expert_gemv_quant / launch_gateup_quant).
//
// Why: a CUDA-core grouped kernel (as qgemv_* above) spends per weight a q-form decode (~3 lane-instructions) plus T
// FMAs, and a warp fetches one stage into registers, then decodes it with nothing in flight: a routed-expert launch
// (10 experts at T = 1, ~75 at T = 8, 0.5-1 MB each) ran at 6-7 % of the H200's HBM rate at every T (issue 18); the
// CUDA-core qgemv_expert_* / qgemv_gateup_* went at 35b700f (they tied these at T = 1 and lost at every other T).
// Here:
//   * the window is the N side of mma.sync m16n8k16 (f16 in, f32 accumulate): the T products per weight cost no
//     instruction, so the lane-instructions per weight are the decode's, whatever T <= 8 is (T <= 16: two
//     column tiles);
//   * weights are exact: the A operand is the folded q-form a = s q of quant_decode.cuh qtc8 (small integers or
//     dyadics, exact in f16; Q6_K's up to 4096 as hi + lo), the span scale D and the min m are applied per 32
//     elements in float32 (w = D a + m, as gguf's fl(fl(D a) + m) up to the sum's order);
//   * x is split x = hi + lo in f16 (hi = f16(x), lo = f16(x - hi)): f16 products are exact in the f32
//     accumulator, so a span's sum is sum a (hi + lo) with |x - hi - lo| <= 2^-22 |x| + 2^-25; a span whose |x|
//     reaches 2^15 (f16 would overflow) is split from x 2^-16 and its sum scaled back by 2^16 (as gemv_q8r.cu's
//     tensor-core kernel);
//   * the weights stream through a ring of qtc_nstage shared-memory stages per warp filled by cp.async (16-byte
//     copies, no registers held while in flight), qtc_nstage - 1 stages of every warp in flight while it decodes
//     one: 2-4 stages of 5-15 KB, so the 12-16 warps an SM holds keep ~60-120 KB of HBM reads in flight (about
//     4.4 TB/s x 1-2 us of latency / 132 SMs = 33-66 KB is what the copy rate needs).
// T = 1 is short work, so the grid decides as much as the loop: gate/up of Flash-Next's 10 experts is 10.75 MB
// (Q2_K), 2.5 us at the H200's measured copy rate (4.26 TB/s), and a launch costs ~2-3 us of its own. One launch
// covers every (expert, row set) of the layer. Measured at f2de868 (bench/quant_gemv_bench.py, the real shapes):
// T = 1 gate/up 377 GB/s (28.5 us, 8.9 % of the copy rate), Q4_0 down 644 GB/s (14.3 us); T = 8 689 / 998 GB/s.
// Issue 18 asks >= 60 %: ~4.2 us for T = 1 gate/up.
//   Occupancy at T = 1 (then: QTC_WARPS 4, Q2_K 4 m tiles, a ring of 2 stages of 7 KB): 10 x 20 row sets
//   of 32 rows of each matrix, split over ksplit = 4 warps (10 steps: 3, 3, 2, 2) = 800 warps in 200 blocks on 132
//   SMs: 68 SMs hold 2 blocks, 64 hold 1 (1.5 warps a scheduler on average; the 2-block SMs set the time). Down
//   (Q4_0, 2.5 steps): 10 x 80 row sets of 32 rows x ksplit 2 = 1600 warps in 400 blocks.
//   Bytes in flight: with 2 stages a warp has one step (64 rows x 84 B = 5.4 KB) in flight while it decodes the
//   other: ~32-43 KB an SM, about what 4.3 TB/s x ~1-1.5 us of loaded latency / 132 SMs asks (33-50 KB). But the
//   whole layer is only 81 KB an SM (two round trips), so each warp's serial chain (wait, decode 8 spans with
//   their MMAs, wait) sets the time, not the bytes in flight.
//   Issue bound (SASS of the span loop: NVRTC sm_90 cubin, nvdisasm, the unscaled path): at 5cd26f8 Q2_K gate/up
//   444 instructions per span of 64 rows (2048 weights, 0.22 a weight; 552 in PTX) plus ~614 a step (8 spans)
//   outside it (the cp.async issue, the unit addresses); Q4_0 down 192 per span of 32 rows (0.19). T = 1 gate/up
//   is 32.8 M weights = 8.9 M warp-instructions (PTX count) = 16.8 K clocks of 132 SMs x 4 schedulers issuing one
//   a clock: 8.5 us at full issue, 3.4x the bytes' 2.5 us; the measured 28.5 us is 3.4x that again (too few warps
//   to hide each one's latency). T = 8: 244 M weights, 63 us at full issue, 116 us measured, 31 us at 60 %.
//   The decode now (same counting): Q2_K 293 a span (0.14 a weight) + ~777 a step, Q4_0 162 (0.16), by
//     * Q2_K's scale words S = sc 4^-k, B = -1024 S made in f16x2 (LOP3, IMAD, HFMA2, HMUL2), not a float
//       rounded into two packed words; its min's sign folded into an exact subtraction;
//     * Q2_K's mins once a step: one MMA of k = the 16 sub-blocks (quant_decode.cuh qtc_min_frag, the x sums of
//       each sub-block as B), instead of a min per group, 8 shuffles and 32 FMAs a span;
//     * Q4_0's split16 k-order (QTcFrag): a group is one 32-bit word of codes (2 loads instead of 4, constant
//       masks and S, B);
//     * a lane's units as one base register per matrix (even block sizes: every unit of a lane has the same
//       address mod 16), so a span's loads take immediates, not a 3-input add each;
//     * spans with no scaled column (warp-uniform) skip the x and C rescaling (8 + 4 MT FMUL).
// Measured at 35b700f (bench/quant_gemv_bench.py, gemv-tune of the 2026-12-02 call): T = 1 Q2_K gate/up 436 GB/s
// (24.6 us), its decode-free probe 1216; Q4_0 down 593, probe 1261; T = 8 822 / 1010 (probes 2382 / 2364): the
// streaming alone reaches 28-56 % and the decode costs 1.6-2.8x on top. The sweep's one winner became code (2 m tiles
// a warp at T <= 2: +9 % at T = 1). Then, counted in SASS (NVRTC sm_90 cubin, nvdisasm) for Q2_K qtc_gateup_t1:
//   * the issue of a step's copies was ~37 instructions a chunk (the unit's division by QCHUNKS, 64-bit row
//     products, a shared-window conversion and two branches, per step and chunk): the lane's chunk geometry is now
//     computed once before the loop (roff / kq), the ring's shared address once, and a chunk outside its unit is a
//     zero-fill cp.async (no branch): 125 instructions a step for the lane's 7 chunks (was ~290 at 2 m tiles);
//   * the ring filled all NS slots deep before the first wait (it was NS - 1): at T = 1 every warp's whole slice is
//     in flight at once (gate/up: 10.75 MB in 1600 warps of 2-3 steps, 3 slots; down: 1-2 steps, 2 slots), one
//     round trip instead of two for the warps with the most steps; the steady state keeps NS - 1 in flight;
//   * Q2_K's span scale D (the block's, QTcStepD) once a step a unit, not a load and conversion each span;
//   * the column scales' 4 shuffles only in the scaled branch (the usual span has no scaled column);
//   * at 2 m tiles and one column tile (T <= 2, and the 4-bit types' warps to T = 8) the spans 4 at a time:
//     compile-time span constants and four independent decode + MMA chains to interleave (no spills: 115-121
//     registers of 128 for Q2_K at T = 1, 2).
// A T = 1 step (32 rows x 256) is now ~1840 instructions (0.22 a weight, ~0.27 before at 2 m tiles). The T = 1 bound
// left is issue: 8192 weights a step at 0.23 is ~1.9 K warp-instructions, 12-16 warps an SM at ~2 a clock, so gate/up
// of 10.75 MB (Q2_K) needs ~8 us where 60 % of the copy rate is 4.2 us: >= 60 % at T = 1 needs <= ~0.12 instructions
// a weight, about half of what the exact f16 split of x (~70 a span) and the per-unit decode (~36 a 16-row unit and
// span) cost today. --probe (QTC_PROBE: the same grids and rings decoding nothing) keeps showing the streaming's
// share of each launch.
//   Then (same counting, per step of the unscaled path, the span's vote or mask load included; 2026-12-02 xsplit):
//   at T <= 2 (qtc_xs) the x split is done once per warp and step into shared memory (lane 4 sp + t splits span sp,
//   group t of each live column: one pass at T = 1 where every lane used to split all 8 columns, 7 of them empty,
//   in every span) and the spans load ready B words; Q2_K's crumb masks come from constant memory (ptxas had
//   rematerialized a mask register for every field). Q2_K gate/up T = 1 ~1875 -> ~1336 instructions a step (0.229
//   -> 0.163 a weight, 118 -> 106 registers), Q4_0 down T = 1 ~1413 -> ~1138 (0.172 -> 0.139, 121 -> 114). T >= 4
//   keeps the split in registers (a pass per live column there costs ~100 where a span splits all 8 at ~36, and a
//   step's copy would cost T = 8 its third block an SM): Q2_K gate/up T = 8 ~2670 a step of 16 K weights (0.163),
//   Q4_0 down ~1385 (0.169), as before. What is left at T = 1 is the per-unit decode (~33 a 16-row unit and span)
//   and ~450 a step outside the spans (the copies' issue, the step's mins MMA, unit addresses, the split).
// Shape legend (NT window bucket, NN = 1 column tile of 8 entries, 2 for NT = 16; lane = 4 g + t):
//   grid (ceil(n_out / (ROWS * QTC_WARPS / ksplit)), J groups), block QTC_WARPS * 32; group u = blockIdx.y holds
//   up to NT (row, slot) entries of expert g_expert[u] (moe_group), entry n reads x row xr[n] and writes y row
//   rows[n] (as grouped_entries). The QTC_WARPS / ksplit row sets of a block take ROWS rows each (expert: 16 MT
//   = MT m tiles of 16, MT = qtc_mt(NT); gate/up: 8 MT rows of each matrix, m tiles 0 .. MT/2 - 1 gate, the rest
//   the same rows of up); the ksplit warps of a set take
//   interleaved 256-element steps s = kslice, kslice + ksplit, ... and add up in shared memory (ksplit_reduce).
//   unit       one row's range of a step: 16 MT units per stage (row mt * 16 + r of the warp), as in
//              qslice_rows (QCHUNKS aligned 16-byte chunks, each byte at its address mod 16)
//   span sp    32 elements 32 sp .. 32 sp + 31 of a step; lane (g, t) decodes group t (elements 8t .. 8t+7;
//              split16 types 4t .. 4t+3, 16+4t .. 16+4t+3) of rows g and g + 8 of each m tile (quant_decode.cuh
//              qtc_frag), k tile kt of the MMA holds the group's elements 4kt + {0, 1} (a0 / b0) and
//              4kt + {2, 3} (a2 / b1) of every lane t (interleaved types, QTcFrag: {0, 2} and {1, 3});
//              B column g = entry 8 nn + g
//   step mins  (QTcStepMins: Q2_K) k = sub-block 0..15 of the step's block: A = the rows' 4-bit mins, B = column
//              g's sub-block sums of x (lane t: sub-blocks 2t, 2t+1 from span t, 2t+8, 2t+9 from span t + 4)
//   C          c0, c1 = (row g, entries 2t, 2t+1), c2, c3 = (row g + 8, same entries); acc[mt * NN + nn][e]
// Reductions are fixed-order (MMA, span FMAs, the ksplit sum): graph replays are bit-identical to eager.
//
// The geometry below (launch_quant.py mirrors it and says what the H200 measured for each choice at 35b700f):
#define QTC_WARPS 4  // warps per block (ksplit divides it)
// m tiles of 16 rows per warp and stage: 2 at T <= 2 (twice the warps of the short launches), else 4 where a 64-row
// stage is at most QTC_MT4_BYTES (the types of <= 3.5 bits per weight), else 2. More rows per warp share each
// span's x split (~35 instructions per span); fewer make more row sets (warps) of the same bytes.
#define QTC_MT4_BYTES 8192
constexpr int qtc_mt(int nt) { return nt <= 2 ? 2 : 64 * QCHUNKS * 16 <= QTC_MT4_BYTES ? 4 : 2; }
constexpr int qtc_stage_int4(int nt) { return qtc_mt(nt) * 16 * QCHUNKS; }  // one stage of a warp, 16-byte chunks
#define QTC_RING_BYTES 12288  // about this much shared memory per warp: 2 .. 4 stages
constexpr int qtc_nstage(int nt) {
    return QTC_RING_BYTES / (qtc_stage_int4(nt) * 16) < 2   ? 2
           : QTC_RING_BYTES / (qtc_stage_int4(nt) * 16) > 4 ? 4
                                                            : QTC_RING_BYTES / (qtc_stage_int4(nt) * 16);
}
// The x split of a step, once per warp (after the QTC_WARPS rings) where the window bucket has <= 2 columns (T <= 2:
// one pass of all 32 lanes per live column). With more columns the spans split their x in registers as before: a
// pass per column costs ~100 instructions where a span's split of all 8 columns at once costs ~36 (SASS), so the
// split in shared memory wins only below ~3 live columns, and a step's copy (1 KB a column) would cost the T = 8
// launches their third block an SM. For each of the bucket's NT columns c (QTC_XCOL_BYTES each): hi [8 spans][4
// groups] as uint4 (a lane's B words of k tiles 0, 1), lo the same at +512, the step's 16-element sums X[16] at
// +1024 (the mins' types); then one u32 a span: the bit set of its scaled columns. (1088 = 8.5 x 128 bytes: columns g
// and g + 1 of one LDS.128 phase fall in different banks.)
constexpr bool qtc_xs(int nt) { return nt <= 2; }
#define QTC_XCOL_BYTES 1088
constexpr int qtc_xs_bytes(int nt) { return qtc_xs(nt) ? nt * QTC_XCOL_BYTES + 32 : 0; }
constexpr int qtc_smem_bytes(int nt) {
    return QTC_WARPS * (qtc_nstage(nt) * qtc_stage_int4(nt) * 16 + qtc_xs_bytes(nt));
}
#ifndef QTC_PROBE  // bench/quant_gemv_bench.py --probe: stream the weights, decode nothing (launch_quant.PROBE_DEFINES)
#define QTC_PROBE 0
#endif
#define QTC_BIG 32768.0f  // |x| from which a span is split from x * 2^-16

constexpr int qtc_nn(int nt) { return nt > 8 ? 2 : 1; }
template <bool B> struct QBool { static constexpr bool v = B; };  // compile-time values passed to a generic lambda
template <int V> struct QInt { static constexpr int v = V; };

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
// 16 bytes global -> shared (dst a shared-window address, smem_u32), of which the first n (16 or 0) are read and
// the rest zero-filled: a chunk outside its unit costs no branch and reads nothing
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// NaN into rows o0 .. o0 + n_rows - 1 of the group's entries (a bad expert id, or too little shared memory)
template <int NT>
__device__ __forceinline__ void qtc_nan_rows(float* y, int n_out, int o0, int n_rows, int nt, const int (&rows)[NT],
                                             int kslice) {
    const int lane = threadIdx.x & (WARP - 1);
    if (kslice != 0) return;
    for (int i = lane; i < n_rows; i += WARP)
        if (o0 + i < n_out)
#pragma unroll
            for (int n = 0; n < NT; ++n)
                if (n < nt) y[(i64)rows[n] * n_out + o0 + i] = QNAN;
}

// The grouped expert GEMV on tensor cores (both kernels; GATEUP: W0 gate, W1 up, y = silu(gate) * up).
template <int NT, bool GATEUP>
__device__ __forceinline__ void qtc_grouped(const u8* W0, const u8* W1, i64 expert_stride, i64 row_stride,
                                            int n_expert, const int* g_expert, const int* g_count,
                                            const int* g_entries, const float* x, int x_div, int n_in, float* y,
                                            int n_out, int ksplit, int act, float div, const float* mul, int mul_st,
                                            int mul_so) {
    constexpr int MT = qtc_mt(NT), NN = qtc_nn(NT), F = MT * NN, HALF = MT / 2, NS = qtc_nstage(NT);
    constexpr int STAGE = qtc_stage_int4(NT), ROWS = GATEUP ? 16 * HALF : 16 * MT;
    constexpr int NCH = STAGE / WARP;
    static_assert(STAGE % WARP == 0, "16 MT units a stage (MT even): every lane has NCH chunks of it");
    static_assert(QCHUNKS <= 16, "a chunk's k fits 4 bits");
    extern __shared__ int4 qtc_ring[];
    static_assert(F * 4 * WARP * 4 <= NS * STAGE * 16, "the ksplit sums live in the warp's ring");
    const int u = blockIdx.y;
    const int nt = min(g_count[u], NT);
    if (nt == 0) return;  // the whole block leaves: no barrier is left waiting
    const int e = g_expert[u];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1), g = lane >> 2, t = lane & 3;
    const int set = warp / ksplit, kslice = warp % ksplit;
    const int o0 = (blockIdx.x * (QTC_WARPS / ksplit) + set) * ROWS;
    int rows[NT], xr[NT];
    expert_group_rows<NT>(g_entries, u, nt, x_div, rows, xr);
    u32 dyn_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    if (e < 0 || e >= n_expert || dyn_smem < qtc_smem_bytes(NT)) {  // block-uniform
        qtc_nan_rows(y, n_out, o0, ROWS, nt, rows, kslice);
        return;
    }
    // unit uu = mt * 16 + r: row o0 + uu of the one matrix, or row o0 + (mt % HALF) * 16 + r of gate (mt < HALF)
    // / up (mt >= HALF)
    const u8* W0e = W0 + (i64)e * expert_stride;
    const u8* W1e = (GATEUP ? W1 : W0) + (i64)e * expert_stride;
    auto unit_o = [&](int uu) { return o0 + (GATEUP ? uu % (16 * HALF) : uu); };
    auto unit_row = [&](int uu) -> const u8* {
        return (GATEUP && uu >= 16 * HALF ? W1e : W0e) + (i64)unit_o(uu) * row_stride;
    };
    auto unit_live = [&](int uu) { return unit_o(uu) < n_out; };
    const int n_steps = (n_in + QSTEP - 1) / QSTEP;
    const i64 row_bytes = (i64)(n_in / QB::qk) * QB::bytes;
    const int my_steps = kslice < n_steps ? (n_steps - kslice + ksplit - 1) / ksplit : 0;
    int4* ring = qtc_ring + warp * NS * STAGE;

    // This lane's chunks of a stage are the same units at every step, so their geometry is computed once here, not
    // per step and chunk (it was ~37 instructions a chunk: the unit's division, 64-bit row products, a shared-window
    // conversion and two branches; ~12 now, no branch): chunk c = lane + 32 i of a stage is chunk k of unit
    // uu = c / QCHUNKS; roff[i] = the unit row's byte offset in its matrix (bit 31: the up matrix of gate/up;
    // QTC_DEAD: a row past n_out), kq the chunks' k, 4 bits each. (launch_quant keeps an expert matrix < 2^31 bytes.)
    constexpr u32 QTC_DEAD = 0xffffffffu;
    u32 roff[NCH], kq[(NCH + 7) / 8];
#pragma unroll
    for (int i = 0; i < (NCH + 7) / 8; ++i) kq[i] = 0u;
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
        const int c = lane + i * WARP, uu = c / QCHUNKS, k = c - uu * QCHUNKS;
        const u32 up = GATEUP && uu >= 16 * HALF ? 0x80000000u : 0u;
        roff[i] = unit_live(uu) ? (u32)((i64)unit_o(uu) * row_stride) | up : QTC_DEAD;
        kq[i / 8] |= (u32)k << (4 * (i % 8));
    }
    const u32 lane_smem = smem_u32(ring) + 16 * lane;

    auto issue = [&](int j) {  // this warp's j-th step into slot j % NS; one commit group per call, even if empty
        if (j < my_steps) {
            const int s = kslice + j * ksplit;
            const u8* m0 = W0e + (i64)s * QSTEP_BYTES;
            const u8* m1 = W1e + (i64)s * QSTEP_BYTES;
            const u32 dst = lane_smem + (u32)((j % NS) * STAGE * 16);
            const u32 len = (u32)min((i64)QSTEP_BYTES, row_bytes - (i64)s * QSTEP_BYTES);
#pragma unroll
            for (int i = 0; i < NCH; ++i) {
                const u32 r = roff[i], k = (kq[i / 8] >> (4 * (i % 8))) & 15u;
                const u8* start = (r & 0x80000000u ? m1 : m0) + (r & 0x7fffffffu);
                const u32 head = (u32)(size_t)start & 15u;
                // every loaded chunk holds a byte of its unit (no load leaves the weight's pages); a chunk past the
                // unit, or of a dead unit, reads nothing from the step's first byte and is zero-filled
                const bool ok = r != QTC_DEAD && 16 * k < head + len;
                cp_async16(dst + 16 * WARP * i, ok ? start - head + 16 * k : m0, ok ? 16u : 0u);
            }
        }
        cp_async_commit();
    };

    float acc[F][4];
#pragma unroll
    for (int f = 0; f < F; ++f) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.0f;
    // B column g of column tile nn: entry 8 nn + g's x row, from this lane's first element of a span: 8t, or 4t
    // for the split16 types (quant_decode.cuh QTcFrag: their groups take the float4 at 4t and 16 + 4t)
    constexpr bool SPLIT16 = QTcFrag<QTYPE>::split16;
    // the mins' term: once a step by an MMA (QTcStepMins: Q2_K, a block per step), else per span and half
    constexpr bool STEP_MINS = QTcStepMins<QTYPE>::v && QB::qk == QSTEP, SPAN_MINS = QHasMin<QTYPE>::v && !STEP_MINS;
    static_assert(!(SPLIT16 && QHasMin<QTYPE>::v), "the mins' x sums assume a lane's 8 elements in one half");
    constexpr bool STEP_D = QTcStepD<QTYPE>::v && QB::qk == QSTEP;
    // This warp's x split (XS; qtc_xs_bytes): column c's B words of span sp, group t at xs + c XCOL + 64 sp + 16 t. A B column past nt reads column NT - 1's (or stale) words: the MMA keeps columns apart, and those C
    // columns are never stored; the span masks hold live columns only.
    u8* xs = reinterpret_cast<u8*>(qtc_ring + QTC_WARPS * NS * STAGE) + warp * qtc_xs_bytes(NT);
    constexpr bool XS = qtc_xs(NT);
    constexpr int XCOL = QTC_XCOL_BYTES;
    const float* xrow[NN];  // !XS: B column g of column tile nn: entry 8 nn + g's x row, from this lane's first element
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
        const int n = nn * 8 + g;
        xrow[nn] = !XS && n < nt ? x + (i64)pick(xr, n) * n_in + (SPLIT16 ? 4 : 8) * t : nullptr;
    }
    const u32* xs_mask = reinterpret_cast<const u32*>(xs + NT * XCOL);
    int xcol[NN];  // B column g of tile nn: its column's offset
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) xcol[nn] = min(8 * nn + g, NT - 1) * XCOL;
    // Step s's x split (XS), once per warp instead of once per span in every lane for all 8 columns (~36
    // instructions a span, 7/8 of them for empty columns at T = 1): lane L = 4 sp + t splits group t of span sp of
    // each live column (the group qtc_frag's lane t pairs with: SPLIT16's float4 at 4t and 16 + 4t), the column
    // scale per (column, span) as column_scales had it (any of the span's 4 lanes reaches 2^15; the x 2^-16 only in
    // a pass with a scaled column), and the mins' 16-sums.
    auto split_x = [&](int s, int n_sp) {
        const int sp = g;
        u32 cm = 0u;
#pragma unroll
        for (int c = 0; c < NT; ++c) {
            if (c >= nt) break;  // block-uniform
            float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q = p;
            if (sp < n_sp) {  // (n_in is a multiple of 32: a span is whole or past the row)
                const float4* xp = reinterpret_cast<const float4*>(x + (i64)xr[c] * n_in + s * QSTEP + sp * 32 +
                                                                   (SPLIT16 ? 4 : 8) * t);
                p = __ldg(xp);
                q = __ldg(xp + (SPLIT16 ? 4 : 1));
            }
            float xv[1][8] = {{p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w}};
            const float mx = fmaxf(fmaxf(fmaxf(fabsf(p.x), fabsf(p.y)), fmaxf(fabsf(p.z), fabsf(p.w))),
                                   fmaxf(fmaxf(fabsf(q.x), fabsf(q.y)), fmaxf(fabsf(q.z), fabsf(q.w))));
            int b = mx >= QTC_BIG ? 1 : 0;  // (fmaxf drops a NaN x: its products are NaN on either path)
            b |= __shfl_xor_sync(FULL_MASK, b, 1);
            b |= __shfl_xor_sync(FULL_MASK, b, 2);
            u32 bh[1][2][2], bl[1][2][2];
            if (__any_sync(FULL_MASK, b)) {  // (warp-uniform: the usual pass has no scaled column)
                const bool sc[1] = {b != 0};
                split_b_frags<1, QTcFrag<QTYPE>::interleaved>(xv, sc, bh, bl);
            } else {
                const bool sc[1] = {false};
                split_b_frags<1, QTcFrag<QTYPE>::interleaved>(xv, sc, bh, bl);
            }
            float s8 = 0.0f;
            if (QHasMin<QTYPE>::v) {  // X[2 sp + t / 2]: the sum of elements 16 (2 sp + t / 2) .. +15 of the step
                s8 = ((p.x + p.y) + (p.z + p.w)) + ((q.x + q.y) + (q.z + q.w));
                s8 += __shfl_xor_sync(FULL_MASK, s8, 1);
            }
            u8* col = xs + c * XCOL;
            *reinterpret_cast<uint4*>(col + 16 * lane) = make_uint4(bh[0][0][0], bh[0][0][1], bh[0][1][0], bh[0][1][1]);
            *reinterpret_cast<uint4*>(col + 512 + 16 * lane) =
                make_uint4(bl[0][0][0], bl[0][0][1], bl[0][1][0], bl[0][1][1]);
            if (QHasMin<QTYPE>::v && (t & 1) == 0) reinterpret_cast<float*>(col + 1024)[2 * sp + (t >> 1)] = s8;
            cm |= (u32)b << c;
        }
        if (t == 0) reinterpret_cast<u32*>(xs + NT * XCOL)[sp] = cm;
    };

    // All NS slots are filled before the first wait, so a warp's whole slice is in flight at once where it has at
    // most NS steps (T = 1: Q2_K gate/up 2-3 steps a warp in 3 slots, Q4_0 down 1-2 in 2; a ring filled NS - 1 deep
    // left the last of them a second round trip behind); from step 1 on each step refills the slot step j - 1 used,
    // so NS - 1 steps stay in flight while one is decoded. Groups: NS committed first, then one a step from j = 1:
    // step j's is done when at most NS - 1 (j = 0) or NS - 2 (j >= 1) later ones are pending.
#pragma unroll
    for (int j = 0; j < NS; ++j) issue(j);
#pragma unroll 1
    for (int j = 0; j < my_steps; ++j) {
        if (j == 0)  // step j's group landed (this lane's copies) ...
            cp_async_wait<NS - 1>();
        else
            cp_async_wait<NS - 2>();
        __syncwarp();                  // ... and every lane's; every lane is also done reading step j - 1's slot
        if (j > 0) issue(j - 1 + NS);  // into the slot step j - 1 used
        const int s = kslice + j * ksplit;
        // (n_in is a multiple of 32, the block's; QTC_PROBE decodes nothing: launch_quant.PROBE_DEFINES)
        const int n_sp = QTC_PROBE ? 0 : min(QSTEP, n_in - s * QSTEP) / 32;
        const int4* slot = ring + (j % NS) * STAGE;
        const u8* ub[MT][2];  // this lane's units (rows g, g + 8 of each m tile) in the slot
        // An even block size makes the row stride even, so a lane's units (rows g + 8 j of one matrix) all have
        // the address mod 16 of row g: each unit is one base register per matrix plus a constant, and every load
        // of a span is [base + span offset + immediate] (no per-unit address add: ~3 instructions a qtc_frag)
        const u8* base[2];
#pragma unroll
        for (int mx = 0; mx < 2; ++mx) {
            const int uu = mx * 16 * HALF + g;  // (matrix 1: the up rows of gate/up)
            base[mx] = reinterpret_cast<const u8*>(slot + g * QCHUNKS) +
                       ((size_t)(unit_row(uu) + (i64)s * QSTEP_BYTES) & 15);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int uu = mt * 16 + g + 8 * h;
                if (QB::bytes % 2 == 0)
                    ub[mt][h] = base[GATEUP && mt >= HALF] + (uu - g) * QCHUNKS * 16;
                else
                    ub[mt][h] = reinterpret_cast<const u8*>(slot + uu * QCHUNKS) +
                                ((size_t)(unit_row(uu) + (i64)s * QSTEP_BYTES) & 15);
            }
        // STEP_D: the span scale D is the block's (QTcStepD: one 256-element block a step), loaded and converted once
        // a step for each of this lane's units instead of once a span (qtc_frag's own D is then dead code)
        float Ds[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) Ds[mt][h] = STEP_D ? qtc_step_d<QTYPE>(ub[mt][h]) : 0.0f;
        // The spans 4 at a time where a warp holds 2 m tiles and one column tile (with 4 m tiles the unrolled spans
        // spill): sp = sp0 + i with sp0 a multiple of 4 and i compile-time, so a span's crumb plane (sp % 4), its
        // scale constants and offsets fold into immediates, and the four spans' independent decode + MMA chains
        // interleave (the T <= 2 launches are latency-bound: 12-16 warps an SM)
        constexpr int SPAN_UNROLL = MT == 2 && NN == 1 ? 4 : 1;
        if (XS && n_sp > 0) {
            __syncwarp();  // (the one above: every lane is also done with step j - 1's split and mins)
            split_x(s, n_sp);
            __syncwarp();
        }
        // STEP_MINS without XS: the sub-block sums X_{2t}, X_{2t+1}, X_{2t+8}, X_{2t+9} of column g (B of the step's
        // mins MMA), gathered over the spans
        float xsb[NN][4];
#pragma unroll
        for (int nn = 0; nn < NN; ++nn) xsb[nn][0] = xsb[nn][1] = xsb[nn][2] = xsb[nn][3] = 0.0f;
        // Q2_K with the spans 4 at a time: the four spans of a quad (sp0 = 4 q) read the same 8 qs bytes of each unit
        // (crumb planes 0..3) and 4 of its 8 scale bytes 8 q ..: loaded once a quad (quant_decode.cuh qtc_q2k_quad),
        // not once a span (SASS of qtc_gateup_t1, NVCC 13.0 sm_90: a span's decode of its 4 units 68 -> ~52
        // instructions). (Q2_K's n_in is a multiple of its 256-element block, so a quad is never partial, and its
        // bytes are the unit's own: a dead unit reads its zero-filled chunks.)
        constexpr bool Q2K_QUAD = QTYPE == T_Q2_K && SPAN_UNROLL == 4;
#pragma unroll 1
        for (int sp0 = 0; sp0 < n_sp; sp0 += SPAN_UNROLL) {
        QTcQ2KQuad quad[Q2K_QUAD ? MT : 1][2];
        if constexpr (Q2K_QUAD) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) quad[mt][h] = qtc_q2k_quad(ub[mt][h], sp0 >> 2, t);
        }
#pragma unroll
        for (int i = 0; i < SPAN_UNROLL; ++i) {
            const int sp = sp0 + i;
            if (sp >= n_sp) break;  // warp-uniform: the partial last step
            const int el = sp * 32 + 8 * t;  // this lane's group in the step
            const int blk = el / QB::qk, gi = el % QB::qk / 8;
            const u8* xsp = xs + 64 * sp + 16 * t;       // XS: this lane's B words of span sp in column 0
            const u32 cmask = XS ? xs_mask[sp] : 0u;      // XS: the span's scaled columns (one word for all lanes)
            // !XS: this lane's 8 x of column g of each column tile, and whether they reach 2^15
            float xv[NN][8];
            bool big[NN];
            if constexpr (!XS) {
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q = p;
                    if (xrow[nn]) {
                        const float4* xp = reinterpret_cast<const float4*>(xrow[nn] + s * QSTEP + sp * 32);
                        p = __ldg(xp);
                        q = __ldg(xp + (SPLIT16 ? 4 : 1));  // the lane's elements 4 .. 7 (split16: 16 + 4t ..)
                    }
                    xv[nn][0] = p.x; xv[nn][1] = p.y; xv[nn][2] = p.z; xv[nn][3] = p.w;
                    xv[nn][4] = q.x; xv[nn][5] = q.y; xv[nn][6] = q.z; xv[nn][7] = q.w;
                    const float mx = fmaxf(fmaxf(fmaxf(fabsf(xv[nn][0]), fabsf(xv[nn][1])),
                                                 fmaxf(fabsf(xv[nn][2]), fabsf(xv[nn][3]))),
                                           fmaxf(fmaxf(fabsf(xv[nn][4]), fabsf(xv[nn][5])),
                                                 fmaxf(fabsf(xv[nn][6]), fabsf(xv[nn][7]))));
                    big[nn] = mx >= QTC_BIG;  // (fmaxf drops a NaN x: its products are NaN on either path)
                }
            }
            // the x sums of the span's halves (elements 0..15, 16..31) for C's entries 2t, 2t+1 (the mins' term):
            // sx[nn][0] the half of this lane's own groups (t / 2), sx[nn][1] the other half (lane t ^ 2's), so
            // that each row's own min and its partner's need no select
            float sx[NN][2][2];
            if (SPAN_MINS) {
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    float s8 = 0.0f;
                    if constexpr (!XS) {
                        s8 = ((xv[nn][0] + xv[nn][1]) + (xv[nn][2] + xv[nn][3])) +
                             ((xv[nn][4] + xv[nn][5]) + (xv[nn][6] + xv[nn][7]));
                        s8 += __shfl_xor_sync(FULL_MASK, s8, 1);  // lanes t = 0, 1: half 0 of entry g; 2, 3: half 1
                    }
#pragma unroll
                    for (int c = 0; c < 2; ++c)
#pragma unroll
                        for (int hf = 0; hf < 2; ++hf)
                            sx[nn][hf][c] = XS ? reinterpret_cast<const float*>(
                                                     xs + min(8 * nn + 2 * t + c, NT - 1) * XCOL + 1024)[2 * sp + ((t >> 1) ^ hf)]
                                               : __shfl_sync(FULL_MASK, s8, 4 * (2 * t + c) + 2 * ((t >> 1) ^ hf));
                }
            }
            if (STEP_MINS && !XS) {  // lanes t = 0, 1 of column g sum sub-block 2 sp, lanes 2, 3 sub-block 2 sp + 1
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    float s8 = ((xv[nn][0] + xv[nn][1]) + (xv[nn][2] + xv[nn][3])) +
                               ((xv[nn][4] + xv[nn][5]) + (xv[nn][6] + xv[nn][7]));
                    s8 += __shfl_xor_sync(FULL_MASK, s8, 1);
                    const float v0 = __shfl_sync(FULL_MASK, s8, lane & ~3);
                    const float v1 = __shfl_sync(FULL_MASK, s8, (lane & ~3) + 2);
                    // sub-blocks 2t, 2t+1 (span t) and 2t+8, 2t+9 (span t + 4) are this lane's (no run-time index)
                    const bool mine = (sp & 3) == t, first = sp < 4;
                    xsb[nn][0] = mine && first ? v0 : xsb[nn][0];
                    xsb[nn][1] = mine && first ? v1 : xsb[nn][1];
                    xsb[nn][2] = mine && !first ? v0 : xsb[nn][2];
                    xsb[nn][3] = mine && !first ? v1 : xsb[nn][3];
                }
            }
            // the B words and the m tiles, compiled twice: SC says some column of the span is scaled (its x split
            // from x 2^-16, C times D unscale: 4 MT FMUL); the usual span has none (a warp-uniform branch), and
            // (!XS) needs no column scales either (their 4 shuffles a span are in the scaled branch only)
            auto mtiles = [&](auto sc_tag) {
                constexpr bool SC = decltype(sc_tag)::v;
                float unscale[NN][2];  // per B column, so one entry's size costs the others no precision
                u32 bh[NN][2][2], bl[NN][2][2];  // [column tile][k tile][b0 / b1]
                if constexpr (XS) {
#pragma unroll
                    for (int nn = 0; nn < NN; ++nn) {
#pragma unroll
                        for (int c = 0; c < 2; ++c)
                            unscale[nn][c] = SC && (cmask >> (8 * nn + 2 * t + c)) & 1u ? 65536.0f : 1.0f;
                        const uint4 h = *reinterpret_cast<const uint4*>(xsp + xcol[nn]);
                        const uint4 l = *reinterpret_cast<const uint4*>(xsp + xcol[nn] + 512);
                        bh[nn][0][0] = h.x, bh[nn][0][1] = h.y, bh[nn][1][0] = h.z, bh[nn][1][1] = h.w;
                        bl[nn][0][0] = l.x, bl[nn][0][1] = l.y, bl[nn][1][0] = l.z, bl[nn][1][1] = l.w;
                    }
                } else {
                    bool sc_cols[NN];
#pragma unroll
                    for (int nn = 0; nn < NN; ++nn) sc_cols[nn] = false, unscale[nn][0] = unscale[nn][1] = 1.0f;
                    if constexpr (SC) column_scales<NN>(big, sc_cols, unscale);
                    split_b_frags<NN, QTcFrag<QTYPE>::interleaved>(xv, sc_cols, bh, bl);
                }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                u32 A[2][4], L[2][4];
                float D[2], m[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    m[h] = 0.0f;
                    if constexpr (Q2K_QUAD) {  // (span 4 q + i of the quad; D is Ds, the mins the step's MMA)
                        D[h] = 0.0f;
                        qtc_q2k_quad_frag(quad[mt][h], i, A[h]);
                    } else {
                        qtc_frag<QTYPE>(ub[mt][h] + blk * QB::bytes, gi, A[h], L[h], D[h], m[h]);
                    }
                }
                float c[NN][4];
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) c[nn][0] = c[nn][1] = c[nn][2] = c[nn][3] = 0.0f;
#pragma unroll
                for (int kt = 0; kt < 2; ++kt)
#pragma unroll
                    for (int nn = 0; nn < NN; ++nn) {
                        mma_f16_16816(c[nn], A[0][2 * kt], A[1][2 * kt], A[0][2 * kt + 1], A[1][2 * kt + 1],
                                      bl[nn][kt][0], bl[nn][kt][1]);
                        mma_f16_16816(c[nn], A[0][2 * kt], A[1][2 * kt], A[0][2 * kt + 1], A[1][2 * kt + 1],
                                      bh[nn][kt][0], bh[nn][kt][1]);
                        if (QTcLo<QTYPE>::v)  // (lo x lo is below float32's rounding of the sum)
                            mma_f16_16816(c[nn], L[0][2 * kt], L[1][2 * kt], L[0][2 * kt + 1], L[1][2 * kt + 1],
                                          bh[nn][kt][0], bh[nn][kt][1]);
                    }
                float mo[2];  // the min of the other half of the span (lane t ^ 2's), rows g and g + 8
                if (SPAN_MINS) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) mo[h] = __shfl_xor_sync(FULL_MASK, m[h], 2);
                }
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    float* a = acc[mt * NN + nn];
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const float Dk = STEP_D ? Ds[mt][k >> 1] : D[k >> 1];
                        a[k] = fmaf(SC ? Dk * unscale[nn][k & 1] : Dk, c[nn][k], a[k]);
                        if (SPAN_MINS) {
                            const int h = k >> 1, col = k & 1;
                            a[k] = fmaf(m[h], sx[nn][0][col], a[k]);
                            a[k] = fmaf(mo[h], sx[nn][1][col], a[k]);
                        }
                    }
                }
            }
            };
            bool any_big = cmask != 0u;
            if constexpr (!XS) {
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) any_big |= big[nn];
                any_big = __any_sync(FULL_MASK, any_big);
            }
            if (any_big)
                mtiles(QBool<true>{});
            else
                mtiles(QBool<false>{});
        }
        }
        // (a generic lambda of the type: qtc_min_frag exists for the QTcStepMins types only)
        auto step_mins = [&](auto ty) {
            constexpr int TY = decltype(ty)::v;
            // acc += -dmin sum_sb mn_sb X_sb per row: one MMA of k = the 16 sub-blocks (quant_decode.cuh
            // qtc_min_frag); the sums are split hi + lo as x is, x 2^-20 for a column whose sums reach 2^15 (a sum
            // of 16 is up to 16 times x's range: 2^-20 keeps the f16 range of x's 2^-16 for every x below 2^32)
            bool bigx[NN], scx[NN];
            float unx[NN][2];
            if constexpr (XS) {  // the sub-block sums X_{2t}, X_{2t+1}, X_{2t+8}, X_{2t+9} of column g from the split
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    const float* X = reinterpret_cast<const float*>(xs + xcol[nn] + 1024);
                    const float2 lo = *reinterpret_cast<const float2*>(X + 2 * t);
                    const float2 hi = *reinterpret_cast<const float2*>(X + 2 * t + 8);
                    xsb[nn][0] = lo.x, xsb[nn][1] = lo.y, xsb[nn][2] = hi.x, xsb[nn][3] = hi.y;
                }
            }
#pragma unroll
            for (int nn = 0; nn < NN; ++nn)
                bigx[nn] = fmaxf(fmaxf(fabsf(xsb[nn][0]), fabsf(xsb[nn][1])),
                                 fmaxf(fabsf(xsb[nn][2]), fabsf(xsb[nn][3]))) >= QTC_BIG;
            column_scales<NN>(bigx, scx, unx);
            u32 xh[NN][2], xl[NN][2];
#pragma unroll
            for (int nn = 0; nn < NN; ++nn)
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    float a = xsb[nn][2 * p], c = xsb[nn][2 * p + 1];
                    if (scx[nn]) { a *= 9.5367431640625e-07f; c *= 9.5367431640625e-07f; }  // 2^-20
                    split_f16x2(a, c, xh[nn][p], xl[nn][p]);
                }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                u32 M[2][2];
                float nd[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) qtc_min_frag<TY>(ub[mt][h], t, M[h][0], M[h][1], nd[h]);
#pragma unroll
                for (int nn = 0; nn < NN; ++nn) {
                    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_f16_16816(c, M[0][0], M[1][0], M[0][1], M[1][1], xl[nn][0], xl[nn][1]);
                    mma_f16_16816(c, M[0][0], M[1][0], M[0][1], M[1][1], xh[nn][0], xh[nn][1]);
                    float* a = acc[mt * NN + nn];
#pragma unroll
                    for (int k = 0; k < 4; ++k)  // (unx: 2^16 for a scaled column, whose sums took 2^-20)
                        a[k] = fmaf(nd[k >> 1] * (unx[nn][k & 1] > 1.0f ? 1048576.0f : 1.0f), c[k], a[k]);
                }
            }
        };
        if constexpr (STEP_MINS)
            if (n_sp > 0) step_mins(QInt<QTYPE>{});
    }
    cp_async_wait<0>();  // (only empty groups are left: every step's copies landed before it was decoded)
    __syncwarp();        // every lane is done with the ring: the ksplit sums [F][4][32] of warp w reuse w's ring
    auto part = [&](int w, int f, int k) -> float& {
        return reinterpret_cast<float*>(qtc_ring + w * NS * STAGE)[(f * 4 + k) * WARP + lane];
    };
    if (!ksplit_reduce(acc, ksplit, kslice, true, [&](int f, int k) -> float& { return part(warp, f, k); },
                       [&](int sl, int f, int k) { return part(set * ksplit + sl, f, k); }))
        return;
#pragma unroll
    for (int f = 0; f < F; ++f) {
        const int mt = f / NN, nn = f % NN;
        if (GATEUP && mt >= HALF) continue;  // (up m tile mt + HALF goes with gate m tile mt)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int o = o0 + 16 * mt + g + 8 * (k >> 1);
            const int col = 8 * nn + 2 * t + (k & 1);
            if (col < nt && o < n_out) {
                const i64 row = pick(rows, col);
                if (GATEUP)
                    y[row * n_out + o] = apply_act(acc[f][k], ACT_SILU) * acc[f + HALF * NN][k];
                else
                    y[row * n_out + o] = gemv_epilogue(acc[f][k], act, div, mul, row * mul_st + (i64)o * mul_so);
            }
        }
    }
}

// blocks per SM the registers must allow: at 4 warps a block, 4 (<= 128 registers, 16 warps) for 2 m tiles per warp;
// 3 (<= 168) for 4, whose ~57-64 KB rings fit only 3 blocks per SM anyway (128 registers would spill 30-220 bytes
// a thread). ptxas -v (NVRTC, sm_90, no spills): see launch_quant.py's notes at the commit that measured them.
#define QTC_MIN_BLOCKS(NT) ((qtc_mt(NT) == 4 ? 12 : 16) / QTC_WARPS)
static_assert(qtc_mt(1) == 2 && (qtc_mt(4) == 2 || qtc_mt(4) == 4), "the gate/up kernel takes half its m tiles of each");
#define QTC_KERNELS(NT)                                                                                                \
    extern "C" __global__ void __launch_bounds__(QTC_WARPS * WARP, QTC_MIN_BLOCKS(NT))                                 \
        qtc_expert_t##NT(const u8* W, i64 expert_stride, i64 row_stride, int n_expert, const int* g_expert,            \
                         const int* g_count, const int* g_entries, const float* x, int x_div, int n_in, float* y,      \
                         int n_out, int ksplit, int act, float div, const float* mul, int mul_st, int mul_so) {        \
        pdl_begin();                                                                                                   \
        qtc_grouped<NT, false>(W, W, expert_stride, row_stride, n_expert, g_expert, g_count, g_entries, x, x_div,     \
                               n_in, y, n_out, ksplit, act, div, mul, mul_st, mul_so);                                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(QTC_WARPS * WARP, QTC_MIN_BLOCKS(NT))                                 \
        qtc_gateup_t##NT(const u8* Wg, const u8* Wu, i64 expert_stride, i64 row_stride, int n_expert,                  \
                         const int* g_expert, const int* g_count, const int* g_entries, const float* x, int x_div,     \
                         int n_in, float* y, int n_out, int ksplit) {                                                  \
        pdl_begin();                                                                                                   \
        qtc_grouped<NT, true>(Wg, Wu, expert_stride, row_stride, n_expert, g_expert, g_count, g_entries, x, x_div,    \
                              n_in, y, n_out, ksplit, ACT_NONE, 1.0f, nullptr, 0, 0);                                  \
    }

QTC_KERNELS(1)
QTC_KERNELS(2)
QTC_KERNELS(4)
QTC_KERNELS(8)
QTC_KERNELS(16)

// emb[n, :] = dequantized table row rows[n] (embed.cu's gather_rows for block types; bit-identical to gguf.quants).
// rows [N] int64; table raw rows of row_bytes; emb [N, hd] f32, hd a multiple of QK. grid N, block 256. The table
// may be mapped host memory.
extern "C" __global__ void __launch_bounds__(256)
    qgather_rows(const i64* __restrict__ rows, const u8* __restrict__ table, i64 row_bytes, float* __restrict__ emb,
                 int hd) {
    pdl_begin();
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
