// hyper.cu: the hyper-connection read and write (strata_cli/ops/hyper.py). A read is 3 launches
// (launch_hyper.hc_read; reference ops/hyper.hc_write_read_raw):
//   R, xn   = hc_write_norm(R, bo, inj_prev)            [T, C, D], [T, C*D]   the previous block's pending write
//                                                       R += bo * inj_prev (if any) in place, then the norm; after
//                                                       the routed experts bo is their combine, computed here; at
//                                                       the PLE layer the PLE's conv step (PleConv) instead
//   dn      = (W_dn . xn) / C                           [T, n_dn]   one gemv.cu / gemv_q8r.cu launch (ACT_NONE,
//                                                       div C) over W_dn = [W_down; W_inject; zero rows]: the down
//                                                       and inject projections read the same xn
//   mixed, inj = hc_up_mix(xn, dn, W_up)                [T, D], [T, C]   low = silu(dn[:, :L]),
//                                                       gates = sigmoid(W_up . low), mixed = mean_c gates * xn,
//                                                       inj = 2 * sigmoid(dn[:, L:L+C])
// hc_write applies a write on its own (before the PLE mix, which reads R, and at a layer-split hand-off).
// A window's residual stack starts as C copies of its embedding rows (broadcast_streams).
// Legend: T window rows, C streams, D hidden, L low rank, n_dn the rows of W_dn (>= L + C). All f32, C-contiguous.
#include "common.cuh"

// Pending (common.cuh): the block output a pending write adds (bo, or the MoE combine of parts).

// out[t, c, d] = R[t, c, d] + pending(t, d) * inj[t, c] (bo, or the MoE's combine of parts: Pending::at). out may
// be R (in place: each element read then written once). The product is rounded before the add (no FMA
// contraction), as numpy does. Grid-stride over T*C*D, block 256.
extern "C" __global__ void __launch_bounds__(256)
    hc_write(const float* R, const float* __restrict__ bo, const float* __restrict__ parts,
             const float* __restrict__ route_w, const float* __restrict__ shared, int K,
             const float* __restrict__ inj, float* out, int T, int C, int D) {
    const Pending pend{bo, parts, route_w, shared, K};
    const i64 n = (i64)T * C * D;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 d = idx % D, tc = idx / D;  // tc = t * C + c
        const int t = (int)(tc / C);
        out[idx] = R[idx] + __fmul_rn(pend.at(t, (int)d, D), inj[tc]);
    }
}

// The first kernel of the read. grid T*C (block b = t*C + c: stream c of row t), block HC_NORM_THREADS or fewer
// (launch_hyper.norm_threads: ceil(D / 4) rounded up to whole warps, at most 512).
//   bo or parts != null: R[t, c, :] += pending(t, :) * inj_prev[t, c] in place first (hc_write's rounding:
//   product, then add; pending as Pending::at_n); ple_gated != null instead: the PLE's last step (ple_conv_out's
//   arithmetic, PleConv) in place first, the PLE layer's read;
//   xn[t, c*D + d] = R[t, c, d] / sqrt(mean_d R[t, c, :]^2 + eps) * norm_w[c*D + d] (ops/basic.grouped_rms_norm).
// Each block owns its stream's elements, so the in-place update races with nothing. The row goes in passes of
// HC_NORM_EPT * blockDim.x elements (a runtime loop; one pass where D <= 5 * 512, the model's 2560): thread i holds
// elements d = i + e * blockDim.x of the pass, e < HC_NORM_EPT, in registers, their R and norm_w loads and the
// pending write's (Pending::at_n: the combine's slots in chunks of 6, a chunk's loads at once) issued before the
// first use; the sum of squares goes in pass and e order (d ascending per thread), then block_sum; a single pass
// normalizes from its registers, more passes re-read R. The PLE's step is a plain loop over the thread's elements
// before the passes (its R writes read back by the same thread): one layer of the model, not worth a second copy.
// Latency at T = 1 (D = 2560, C = 4, K = 11 slots): 4 blocks of 512 threads, 5 elements a thread; 2 rounds of loads
// (R, norm_w, inj_prev, shared and slots 0-5, then slots 6-10), 1 block reduction (3 barriers), the stores.
// Code ~1660 SASS instructions (bench/kernel_sass.py; the latency1 version, Pending's 17 slots unrolled into each
// of 8 register elements plus a tail copy, was ~7500, ~118 KB: instruction fetch bound on the H200).
#define HC_NORM_EPT 5
#define HC_NORM_THREADS 512
extern "C" __global__ void __launch_bounds__(HC_NORM_THREADS)
    hc_write_norm(float* R, const float* __restrict__ bo, const float* __restrict__ parts,
                  const float* __restrict__ route_w, const float* __restrict__ shared, int K,
                  const float* __restrict__ inj_prev, const float* __restrict__ norm_w, float* __restrict__ xn,
                  int C, int D, float eps, const float* __restrict__ ple_gated, const float* __restrict__ ple_history,
                  const float* __restrict__ ple_normed, const float* __restrict__ ple_conv_w, int ple_kc,
                  int ple_dil) {
    __shared__ float sh[WARP];
    const int b = blockIdx.x, c = b % C, t = b / C, nth = blockDim.x, span = HC_NORM_EPT * nth;
    const i64 base = (i64)b * D;
    float* r = R + base;
    const float* w = norm_w + (i64)c * D;
    const bool pend_write = ple_gated == nullptr && (bo != nullptr || parts != nullptr);
    if (ple_gated != nullptr) {  // the PLE layer's last step (PleConv), in place
        const PleConv ple{ple_gated, ple_history, ple_normed, ple_conv_w, C * D, ple_kc, ple_dil};
        for (int d = threadIdx.x; d < D; d += nth) r[d] = ple.add_to(r[d], t, (i64)c * D + d);
    }
    const Pending pend{bo, parts, route_w, shared, K};
    const float g = pend_write ? inj_prev[b] : 0.0f;
    float v[HC_NORM_EPT], wv[HC_NORM_EPT], ss = 0.0f;
    for (int pass = 0; pass < D; pass += span) {  // one pass where D <= span
        const int d0 = pass + threadIdx.x;
#pragma unroll
        for (int e = 0; e < HC_NORM_EPT; ++e) {
            const int d = d0 + e * nth;
            v[e] = d < D ? r[d] : 0.0f;
            wv[e] = d < D ? w[d] : 0.0f;
        }
        if (pend_write) {
            float p[HC_NORM_EPT];
            pend.at_n(t, d0, nth, D, p);
#pragma unroll
            for (int e = 0; e < HC_NORM_EPT; ++e) {
                const int d = d0 + e * nth;
                if (d < D) {
                    v[e] = v[e] + __fmul_rn(p[e], g);
                    r[d] = v[e];
                }
            }
        }
#pragma unroll
        for (int e = 0; e < HC_NORM_EPT; ++e) ss += v[e] * v[e];  // 0 past D
    }
    ss = block_sum(ss, sh);
    const float s = sqrtf(ss / (float)D + eps);
    if (D <= span) {
#pragma unroll
        for (int e = 0; e < HC_NORM_EPT; ++e) {
            const int d = threadIdx.x + e * nth;
            if (d < D) xn[base + d] = v[e] / s * wv[e];
        }
    } else {
        for (int d = threadIdx.x; d < D; d += nth) xn[base + d] = r[d] / s * w[d];  // its own r[d]
    }
}

// The last kernel of the read: the up projection, its gates, the mix of the streams and the inject gates in one
// launch. dn [T, n_dn] is the down + inject GEMV's output (already divided by C); W_up [C*D, L] raw rows of
// up_stride bytes, type up_type (F32, F16, BF16, Q8_0: read by raw_at, L values a row).
//   low[t, l]    = silu(dn[t, l])                                    l < L   (shared memory, every block)
//   gate[t, c]   = sigmoid(W_up[c*D + d] . low[t])                   lanes over l, then warp_sum (fixed order)
//   mixed[t, d]  = (sum_c gate[t, c] * xn[t, c*D + d]) / C           summed in stream order
//   inj[t, j]    = 2 * sigmoid(dn[t, L + j])                         j < n_inj, block 0 (inj may be null)
// grid ceil(D / 8): warp w of block b owns column d = 8b + w for every row and stream; block 256; dynamic shared
// memory T*L floats. T <= GEMV_MAXT.
// Each lane loads its W_up values of the first UP_MAXC streams (l = lane + 32 j, j < UP_MAXJ: L = 320 whole) and
// row 0's xn of them into registers before the low barrier (they do not depend on dn), so the weights' trip
// overlaps dn's; the type is dispatched once there (one straight-line block of UP_MAXC x UP_MAXJ predicated loads
// per type). After the barrier the rows are a runtime loop (one copy of the row's body, not one per possible
// row), each row's streams ascending from those registers; wider rows (L > 320) and more streams (C > 4) read the
// rest by a plain loop (a trip a value: not the model's shape, kept small rather than fast).
// Per (row, stream) the sum goes per lane in l order, then warp_sum, and mixed adds the streams in order: the
// bits of every earlier version of this kernel.
// Latency at T = 1 (D = 2560, C = 4, L = 320): 320 blocks; 1 round trip (W_up, xn and dn together), 1 barrier,
// C warp_sums, the store; each further row adds its xn loads and C warp_sums. Code ~2700 SASS instructions
// (bench/kernel_sass.py; the latency1 version unrolled the 16 possible rows into every stream and type body:
// ~17300 instructions, ~270 KB, instruction-fetch bound on the H200).
#define UP_MAXC 4
#define UP_MAXJ 10
template <int TYPE>
struct TypeTag {
    static constexpr int value = TYPE;
};
extern "C" __global__ void __launch_bounds__(256)
    hc_up_mix(const float* __restrict__ xn, const float* __restrict__ dn, int n_dn, int L,
              const u8* __restrict__ up_w, i64 up_stride, int up_type, float* __restrict__ mixed,
              float* __restrict__ inj, int n_inj, int T, int C, int D) {
    extern __shared__ float low[];  // [T][L]
    const int lane = threadIdx.x & (WARP - 1), d = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    const int held = d < D ? min(C, UP_MAXC) : 0;  // streams in registers (uniform in a warp)
    float wr[UP_MAXC][UP_MAXJ], x0[UP_MAXC];
    auto preload = [&](auto type) {
        constexpr int TYPE = decltype(type)::value;
#pragma unroll
        for (int c = 0; c < UP_MAXC; ++c) {
            const u8* row = up_w + (i64)(c * D + d) * up_stride;
            x0[c] = c < held ? xn[(i64)c * D + d] : 0.0f;
#pragma unroll
            for (int j = 0; j < UP_MAXJ; ++j) {
                const int l = lane + WARP * j;
                wr[c][j] = c < held && l < L ? raw_at_t<TYPE>(row, l) : 0.0f;
            }
        }
    };
    if (up_type == GGML_F32) preload(TypeTag<GGML_F32>());
    else if (up_type == GGML_F16) preload(TypeTag<GGML_F16>());
    else if (up_type == GGML_BF16) preload(TypeTag<GGML_BF16>());
    else preload(TypeTag<GGML_Q8_0>());
    for (int i = threadIdx.x; i < T * L; i += blockDim.x) low[i] = silu_f(dn[(i64)(i / L) * n_dn + i % L]);
    if (blockIdx.x == 0 && inj != nullptr) {
        for (int i = threadIdx.x; i < T * n_inj; i += blockDim.x)
            inj[i] = 2.0f * sigmoid_f(dn[(i64)(i / n_inj) * n_dn + L + i % n_inj]);
    }
    __syncthreads();
    if (d >= D) return;  // a whole warp: no barrier follows
    // acc + the lane's terms l = l0, l0 + 32, ... < L of stream c's row against low row lt (raw_at)
    auto rest = [&](int c, int l0, const float* lt, float acc) {
        const u8* row = up_w + (i64)(c * D + d) * up_stride;
#pragma unroll 1
        for (int l = l0; l < L; l += WARP) acc += raw_at(row, up_type, l) * lt[l];
        return acc;
    };
    for (int t = 0; t < T; ++t) {  // T is uniform: every lane meets the shuffles
        const float* lt = low + t * L;
        const float* xt = xn + (i64)t * C * D + d;
        float mix = 0.0f;
#pragma unroll
        for (int c = 0; c < UP_MAXC; ++c) {
            if (c < held) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < UP_MAXJ; ++j) {
                    const int l = lane + WARP * j;
                    if (l < L) acc += wr[c][j] * lt[l];
                }
                acc = rest(c, lane + WARP * UP_MAXJ, lt, acc);  // rows longer than the registers hold
                mix += sigmoid_f(warp_sum(acc)) * (t == 0 ? x0[c] : xt[(i64)c * D]);
            }
        }
        for (int c = UP_MAXC; c < C; ++c) mix += sigmoid_f(warp_sum(rest(c, lane, lt, 0.0f))) * xt[(i64)c * D];
        if (lane == 0) mixed[(i64)t * D + d] = mix / (float)C;
    }
}

// R [T, C, D] <- emb [T, D] on every stream. One thread per element: grid ceil(T*C*D / 256), block 256.
extern "C" __global__ void broadcast_streams(const float* __restrict__ emb, float* __restrict__ R,
                                             int T, int C, int D) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n = (long)T * C * D;
    if (i >= n) return;
    int d = (int)(i % D);
    int t = (int)(i / ((long)C * D));
    R[i] = emb[(long)t * D + d];
}
