// hyper.cu: the hyper-connection read and write (strata_cli/ops/hyper.py). A read is 3 launches
// (launch_hyper.hc_read; reference ops/hyper.hc_write_read_raw):
//   R, xn   = hc_write_norm(R, bo, inj_prev)            [T, C, D], [T, C*D]   the previous block's pending write
//                                                       R += bo * inj_prev (if any) in place, then the norm; after
//                                                       the routed experts bo is their combine, computed here (at
//                                                       the PLE layer ple.cu ple_mix_norm instead: the PLE's mix)
//   dn      = (W_dn . xn) / C                           [T, n_dn]   one gemv.cu / gemv_q8r.cu launch (ACT_NONE,
//                                                       div C) over W_dn = [W_down; W_inject; zero rows]: the down
//                                                       and inject projections read the same xn
//   mixed, inj = hc_up_mix(xn, dn, W_up)                [T, D], [T, C]   low = silu(dn[:, :L]),
//                                                       gates = sigmoid(W_up . low), mixed = mean_c gates * xn,
//                                                       inj = 2 * sigmoid(dn[:, L:L+C])
// hc_write applies a write on its own (at a layer-split hand-off).
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
    pdl_begin();
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
//   product, then add; pending as Pending::at_n);
//   xn[t, c*D + d] = R[t, c, d] / sqrt(mean_d R[t, c, :]^2 + eps) * norm_w[c*D + d] (ops/basic.grouped_rms_norm).
// Each block owns its stream's elements, so the in-place update races with nothing. The row goes in passes of
// HC_NORM_EPT * blockDim.x elements (a runtime loop; one pass where D <= 5 * 512, the model's 2560): thread i holds
// elements d = i + e * blockDim.x of the pass, e < HC_NORM_EPT, in registers, their R and norm_w loads and the
// pending write's (Pending::at_n: the combine's slots in chunks of 6, a chunk's loads at once) issued before the
// first use; the sum of squares goes in pass and e order (d ascending per thread), then block_sum; a single pass
// normalizes from its registers, more passes re-read R.
// Latency at T = 1 (D = 2560, C = 4, K = 11 slots): 4 blocks of 512 threads, 5 elements a thread; 2 rounds of loads
// (R, norm_w, inj_prev, shared and slots 0-5, then slots 6-10), 1 block reduction (3 barriers), the stores.
// Code ~1170 SASS instructions (bench/kernel_sass.py; ~1660 while it applied the PLE's conv step too; the latency1
// version, Pending's 17 slots unrolled into each of 8 register elements plus a tail copy, was ~7500, ~118 KB:
// instruction fetch bound on the H200).
#define HC_NORM_EPT 5
#define HC_NORM_THREADS 512
extern "C" __global__ void __launch_bounds__(HC_NORM_THREADS)
    hc_write_norm(float* R, const float* __restrict__ bo, const float* __restrict__ parts,
                  const float* __restrict__ route_w, const float* __restrict__ shared, int K,
                  const float* __restrict__ inj_prev, const float* __restrict__ norm_w, float* __restrict__ xn,
                  int C, int D, float eps) {
    pdl_begin();
    __shared__ float sh[WARP];
    const int b = blockIdx.x, c = b % C, t = b / C, nth = blockDim.x, span = HC_NORM_EPT * nth;
    const i64 base = (i64)b * D;
    float* r = R + base;
    const float* w = norm_w + (i64)c * D;
    const bool pend_write = bo != nullptr || parts != nullptr;
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
        if (pend_write) pend.add_n(t, d0, nth, D, g, v, r);
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
//   gate[t, c]   = sigmoid(W_up[c*D + d] . low[t])                   lanes over l, then a butterfly (fixed order)
//   mixed[t, d]  = (sum_c gate[t, c] * xn[t, c*D + d]) / C           summed in stream order
//   inj[t, j]    = 2 * sigmoid(dn[t, L + j])                         j < n_inj, block 0 (inj may be null)
// grid ceil(D / 8): warp w of block b owns column d = 8b + w for every row and stream; block 256; dynamic shared
// memory T*L + T*C*8 floats (low, and the block's 8 columns of xn: xs[t][c][w]). T <= GEMV_MAXT.
// Before the barrier, all at once (none depends on dn's GEMV but low): each lane's W_up values of the first UP_MAXC
// streams (l = lane + 32 j, j < UP_MAXJ: L = 320 whole) into registers, the type dispatched once (F32/F16/BF16: one
// straight-line block of UP_MAXC x UP_MAXJ predicated loads; Q8_0: the 40 bytes by load_q8_bytes, and lane j's
// load of block j's scale shared by shuffle), the block's xn columns of every row into xs, low in batches of
// UP_LOW_BATCH loads a thread. Rows then go in pairs (a runtime loop over one copy of the pair's body; past T the
// last row again, not stored): the 2 x UP_MAXC dots of a lane, then one reduce-scatter butterfly over the 8 sums
// (reduce_scatter8: 9 shuffles for 8 sums, not 40; lanes 4k..4k+3 end with sum k = r * UP_MAXC + c), one sigmoid a
// lane, and the mix gathers the row's gates by shuffle. Wider rows (L > 320) add their tail by a loop over l for
// both rows; more streams (C > 4) read theirs by a plain loop (a trip a value: not the model's shape, kept small).
// Bits: per (row, stream) the sum goes per lane in l order, then the butterfly of warp_sum (offsets 16 .. 1, each
// level own + partner: the reduce-scatter adds the same pairs in the same order), and mixed adds the streams in
// order: the bits of every earlier version of this kernel.
// Why (issue 18: 12.0 us at T = 1, 28.7 at T = 8; D = 2560, C = 4, L = 320, Q8_0; 320 blocks, 3 an SM at <= 80
// registers, one wave on 132 SMs): the Q8_0 preload through raw_at_t converted each value right after its 3 byte
// loads (NVVM's order; ptxas kept it), holding the next loads back, so about half the 40 values cost a DRAM trip
// each; the row loop read each stream's xn after its warp_sum (4 dependent L2 trips a row) and its 4 warp_sums and
// sigmoids sat in 4 branch-separated blocks (no overlap); the low fill was one dn load a trip (T*L / 256 trips in
// a row). Now the weights are one trip, the staging one, and a row costs no memory trip.
#define UP_MAXC 4
#define UP_MAXJ 10
#define UP_ROWS 2                     // rows a pass of the row loop: UP_ROWS * UP_MAXC = 8 sums a reduce-scatter
#define UP_LOW_BATCH 8                // low values a thread loads at once
template <int TYPE>
struct TypeTag {
    static constexpr int value = TYPE;
};

// v[k] (k < 8) per lane -> lane's sum of value k = lane / 4 over the warp, added as warp_sum adds (offsets 16, 8,
// 4, 2, 1; own + partner): at offset o the lane keeps the half of its values that bit o of its lane selects and
// adds the partner's copy of that half.
__device__ __forceinline__ float reduce_scatter8(float (&v)[8], int lane) {
#pragma unroll
    for (int o = 16, n = 8; o >= 4; o >>= 1, n >>= 1) {
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int m = 0; m < n / 2; ++m) {
            const float keep = hi ? v[m + n / 2] : v[m], send = hi ? v[m] : v[m + n / 2];
            v[m] = keep + __shfl_xor_sync(FULL_MASK, send, o);
        }
    }
    float s = v[0];
    s += __shfl_xor_sync(FULL_MASK, s, 2);
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    return s;
}

// qv[j] = the signed byte lane of Q8_0 block j (q: the row's byte 2 + lane) where c_held and block j < L / 32, else
// 0, for j = J..UP_MAXJ-1. Inline PTX, predicated, the block offset an immediate: emitted in program order, so the
// row's loads go out before the first use of any (through __ldg, NVVM put each byte's conversion right after its
// load, which held the next loads back: a trip a value), and they take no address registers.
template <int J = 0>
__device__ __forceinline__ void load_q8_bytes(int (&qv)[UP_MAXJ], const u8* q, bool c_held, int L) {
    if constexpr (J < UP_MAXJ) {
        qv[J] = 0;
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p ld.global.nc.s8 %0, [%1+%3];\n\t}"
                     : "+r"(qv[J]) : "l"(q), "r"((int)(c_held && J * QK8_0 < L)), "n"(J * Q8_0_BYTES));
        load_q8_bytes<J + 1>(qv, q, c_held, L);
    }
}

extern "C" __global__ void __launch_bounds__(256)
    hc_up_mix(const float* __restrict__ xn, const float* __restrict__ dn, int n_dn, int L,
              const u8* __restrict__ up_w, i64 up_stride, int up_type, float* __restrict__ mixed,
              float* __restrict__ inj, int n_inj, int T, int C, int D) {
    pdl_prefetch_rows(up_w, up_stride, (i64)blockIdx.x * GEMV_WARPS, GEMV_WARPS, D, min(C, UP_MAXC), D);
    pdl_begin();
    extern __shared__ float smem[];
    float* low = smem;          // [T][L]
    float* xs = low + T * L;    // [T][C][GEMV_WARPS]: xn[t, c*D + d0 + w]
    const int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP, d0 = blockIdx.x * GEMV_WARPS, d = d0 + w;
    const int held = d < D ? min(C, UP_MAXC) : 0;  // streams in registers (uniform in a warp)
    float wr[UP_MAXC][UP_MAXJ];
    auto preload = [&](auto type) {
        constexpr int TYPE = decltype(type)::value;
#pragma unroll
        for (int c = 0; c < UP_MAXC; ++c) {
            const u8* row = up_w + (i64)(c * D + d) * up_stride;
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
    else {  // Q8_0 (L a multiple of 32: l = lane + 32 j is byte lane of block j): lane j < UP_MAXJ reads block j's
            // scale of each stream, the warp shares it by shuffle; 1 byte load a value at an immediate offset from
            // the lane's row pointer (no address registers: all 40 in flight at once)
        float sc[UP_MAXC];
        int qv[UP_MAXC][UP_MAXJ];
#pragma unroll
        for (int c = 0; c < UP_MAXC; ++c) {
            const u8* row = up_w + (i64)(c < held ? c * D + d : 0) * up_stride;
            sc[c] = c < held && lane < UP_MAXJ && lane * QK8_0 < L ? q8_0_scale(row + lane * Q8_0_BYTES) : 0.0f;
            load_q8_bytes(qv[c], row + 2 + lane, c < held, L);
        }
#pragma unroll
        for (int c = 0; c < UP_MAXC; ++c) {
#pragma unroll
            for (int j = 0; j < UP_MAXJ; ++j) {
                const float scale = __shfl_sync(FULL_MASK, sc[c], j);  // every lane: no divergent shuffle
                wr[c][j] = scale * (float)qv[c][j];  // 0 * 0 outside the matrix
            }
        }
    }
    for (int i = threadIdx.x; i < T * C * GEMV_WARPS; i += blockDim.x) {  // 2 a thread at T = 16, C = 4
        const int tc = i / GEMV_WARPS, dd = d0 + i % GEMV_WARPS;         // tc = t * C + c
        xs[i] = dd < D ? xn[(i64)tc * D + dd] : 0.0f;
    }
    for (int i0 = threadIdx.x; i0 < T * L; i0 += UP_LOW_BATCH * blockDim.x) {  // the batch's loads go out together
        float dv[UP_LOW_BATCH];
#pragma unroll
        for (int b = 0; b < UP_LOW_BATCH; ++b) {
            const int i = i0 + b * blockDim.x;
            dv[b] = i < T * L ? dn[(i64)(i / L) * n_dn + i % L] : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < UP_LOW_BATCH; ++b) {
            const int i = i0 + b * blockDim.x;
            if (i < T * L) low[i] = silu_f(dv[b]);
        }
    }
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
    for (int t0 = 0; t0 < T; t0 += UP_ROWS) {  // T is uniform: every lane meets the shuffles
        float v[UP_ROWS * UP_MAXC];            // v[r * UP_MAXC + c]: this lane's share of row t0 + r, stream c
        const float* lr[UP_ROWS];              // low of row t0 + r (the last row again past T)
#pragma unroll
        for (int r = 0; r < UP_ROWS; ++r) {
            lr[r] = low + min(t0 + r, T - 1) * L;
#pragma unroll
            for (int c = 0; c < UP_MAXC; ++c) {
                float acc = 0.0f;  // 0 for streams past held (their weights are 0): summed, never used
#pragma unroll
                for (int j = 0; j < UP_MAXJ; ++j) {
                    const int l = lane + WARP * j;
                    if (l < L) acc += wr[c][j] * lr[r][l];
                }
                v[r * UP_MAXC + c] = acc;
            }
        }
        // rows longer than the registers hold (L > 320): each term once for both rows, l ascending as before
#pragma unroll 1
        for (int l = lane + WARP * UP_MAXJ; l < L; l += WARP) {
#pragma unroll
            for (int c = 0; c < UP_MAXC; ++c) {
                if (c < held) {
                    const float wv = raw_at(up_w + (i64)(c * D + d) * up_stride, up_type, l);
#pragma unroll
                    for (int r = 0; r < UP_ROWS; ++r) v[r * UP_MAXC + c] += wv * lr[r][l];
                }
            }
        }
        const float gate = sigmoid_f(reduce_scatter8(v, lane));  // of sum lane / 4
#pragma unroll
        for (int r = 0; r < UP_ROWS; ++r) {
            const int t = t0 + r;
            if (t >= T) break;  // uniform
            const float* lt = low + t * L;
            const float* xt = xs + t * C * GEMV_WARPS + w;
            float mix = 0.0f;
#pragma unroll
            for (int c = 0; c < UP_MAXC; ++c) {
                const float gc = __shfl_sync(FULL_MASK, gate, 4 * (r * UP_MAXC + c));
                if (c < held) mix += gc * xt[c * GEMV_WARPS];
            }
            for (int c = UP_MAXC; c < C; ++c)
                mix += sigmoid_f(warp_sum(rest(c, lane, lt, 0.0f))) * xt[c * GEMV_WARPS];
            if (lane == 0) mixed[(i64)t * D + d] = mix / (float)C;
        }
    }
}

// R [T, C, D] <- emb [T, D] on every stream. One thread per element: grid ceil(T*C*D / 256), block 256.
extern "C" __global__ void broadcast_streams(const float* __restrict__ emb, float* __restrict__ R,
                                             int T, int C, int D) {
    pdl_begin();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n = (long)T * C * D;
    if (i >= n) return;
    int d = (int)(i % D);
    int t = (int)(i / ((long)C * D));
    R[i] = emb[(long)t * D + d];
}
