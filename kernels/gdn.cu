// gdn.cu: Gated DeltaNet over a verify window (strata_cli/ops/gdn.py), float32 throughout.
//
// Legend: T window rows, Ch = 2*Hk*dk + Hv*dv conv channels, K conv taps, Hk key/query heads, Hv value heads,
// dk / dv key / value head dims. All arrays C-contiguous.
//   qkv [T, Ch] raw projections (rows qkv_ld apart); conv_state [K-1, Ch] previous raw rows (oldest first);
//   conv_w [Ch, K]
//   q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv]; state [Hv, dk, dv]; o [T, Hv, dv]; z [T, Hv*dv] (rows z_ld
//   apart). The window's qkv and z are one GEMV's [T, Ch + Hv*dv] rows where their weights stack (qkv_ld = z_ld =
//   Ch + Hv*dv, z at column Ch).
// A window reads the saved conv and recurrent state and never writes them; the commit kernels advance both to
// the first n_keep rows from what the window stored (qkv, q, k, v, g, beta). Value head h reads key head h % Hk.
#include "seq_common.cuh"

#define GDN_BLOCK 256
#define GDN_RPT 32           // recurrence: state rows in registers per thread (dk <= GDN_RPT * blockDim.y)
#define GDN_REC_THREADS 512  // recurrence: most threads per block (dv * blockDim.y)

// Conv commit: conv_state [K1 = K-1, Ch] <- rows [n_keep, n_keep + K1) of [conv_state | qkv] (qkv holds T rows of
// row stride ld: the window's qkv and z projections may be one GEMV's [T, Ch + Hv*dv] output). Thread per channel;
// the arguments of ple.cu's ple_history_commit (seq_util.rolling_commit builds both).
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_conv_commit(float* conv_state, const float* __restrict__ qkv, int T, int K1, int Ch, int ld, int n_keep,
                    const int* n_keep_dev) {
    pdl_begin();
    rolling_commit(conv_state, qkv, T, K1, Ch, ld, n_keep, n_keep_dev);
}

// silu(causal depthwise conv) of channel c at row t over seq = [conv_state | qkv] (K-1+T rows); tap K-1 is the
// current row.
__device__ __forceinline__ float conv_at(const float* __restrict__ qkv, const float* __restrict__ conv_state,
                                         const float* __restrict__ conv_w, i64 t, i64 c, int Ch, int ld, int K) {
    float acc = 0.0f;
#pragma unroll 4
    for (int i = 0; i < K; ++i) {  // unrolled: the taps' loads go out together
        const i64 r = t + i;  // row of seq = [conv_state | qkv]; qkv rows ld apart
        const float x = r < K - 1 ? conv_state[r * Ch + c] : qkv[(r - (K - 1)) * ld + c];
        acc += x * conv_w[c * K + i];
    }
    return silu_f(acc);
}

// One row of the delta rule for thread (j, p), which holds S[i, j] for i = p*GDN_RPT + r < dk (holds false: a
// thread outside the (dv, P) grid, which only meets the barriers): S *= decay; S += k (x) b*(v - S^T k); returns
// (S^T q)[j], the P partial sums added in p order (the same in every thread of column j). k, q [dk] in shared
// memory, v_j = v[j]; part [P, dv] shared scratch. Every thread of the block calls it; on return k, q and part may
// be rewritten.
__device__ __forceinline__ float delta_rule_row(float (&S)[GDN_RPT], const float* sk, const float* sq, float v_j,
                                                float decay, float b, float* part, int j, int p, int P, int dk,
                                                int dv, bool holds) {
    float mem = 0.0f;  // this thread's share of (S^T k)[j]
#pragma unroll
    for (int r = 0; r < GDN_RPT; ++r) {
        const int i = p * GDN_RPT + r;
        if (holds && i < dk) {
            S[r] *= decay;
            mem += S[r] * sk[i];
        }
    }
    if (holds) part[p * dv + j] = mem;
    __syncthreads();
    mem = 0.0f;
    for (int pp = 0; pp < P; ++pp) mem += part[pp * dv + j];  // same order in every thread of column j
    const float delta = (v_j - mem) * b;
    float out = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_RPT; ++r) {
        const int i = p * GDN_RPT + r;
        if (holds && i < dk) {
            S[r] += sk[i] * delta;
            out += S[r] * sq[i];
        }
    }
    __syncthreads();  // every thread has read part[] for mem
    if (holds) part[p * dv + j] = out;
    __syncthreads();
    float acc = 0.0f;
    for (int pp = 0; pp < P; ++pp) acc += part[pp * dv + j];
    __syncthreads();  // every thread has read part[] (and k, q) before the next row rewrites them
    return acc;
}

// Delta rule from the saved state over rows [0, T): per row S *= exp(g); S += k (x) beta*(v - S^T k);
// o = S^T q. Writes o [T, Hv, dv] (skipped when o is null) and, when state_out is not null, S after
// n_save = count_from(n_state, n_state_dev, T) rows into state_out. Without o the loop stops at n_save.
// state_out may be state (the commit): each thread reads its own elements once, before writing them.
//
// grid Hv (one block per value head), block (dv, P) with P = ceil(dk / GDN_RPT): thread (j, p) holds S[i, j] for
// i = p*GDN_RPT + r, r < GDN_RPT, in registers. Dynamic shared memory (2*dk + P*dv) floats: the row's k and q,
// and the partial sums across p.
extern "C" __global__ void __launch_bounds__(GDN_REC_THREADS)
    gdn_recurrence(const float* state, const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, const float* __restrict__ g, const float* __restrict__ beta,
                   float* o, float* state_out, int T, int n_state, const int* n_state_dev, int nk, int nv, int dk,
                   int dv) {
    pdl_begin();
    extern __shared__ float smem[];
    float* sk = smem;
    float* sq = sk + dk;
    float* part = sq + dk;  // [P, dv]
    const int hv = blockIdx.x, kh = hv % nk;
    const int j = threadIdx.x, p = threadIdx.y, P = blockDim.y;
    const int tid = p * dv + j, nthreads = P * dv;
    const i64 head = (i64)hv * dk * dv;

    float S[GDN_RPT];
#pragma unroll
    for (int r = 0; r < GDN_RPT; ++r) {
        const int i = p * GDN_RPT + r;
        S[r] = i < dk ? state[head + (i64)i * dv + j] : 0.0f;
    }
    const int n_save = state_out ? count_from(n_state, n_state_dev, T) : -1;
    const int rows = o ? T : max(n_save, 0);
    if (n_save == 0) {
#pragma unroll
        for (int r = 0; r < GDN_RPT; ++r)
            if (p * GDN_RPT + r < dk) state_out[head + (i64)(p * GDN_RPT + r) * dv + j] = S[r];
    }
    for (int t = 0; t < rows; ++t) {
        const i64 qk_row = ((i64)t * nk + kh) * dk;
        for (int i = tid; i < dk; i += nthreads) {
            sk[i] = k[qk_row + i];
            sq[i] = q[qk_row + i];
        }
        __syncthreads();
        const float out = delta_rule_row(S, sk, sq, v[((i64)t * nv + hv) * dv + j], expf(g[(i64)t * nv + hv]),
                                         beta[(i64)t * nv + hv], part, j, p, P, dk, dv, true);
        if (o && p == 0) o[((i64)t * nv + hv) * dv + j] = out;
        if (t + 1 == n_save) {
#pragma unroll
            for (int r = 0; r < GDN_RPT; ++r)
                if (p * GDN_RPT + r < dk) state_out[head + (i64)(p * GDN_RPT + r) * dv + j] = S[r];
        }
    }
}

#define GDN_GATE_ROWS 4  // rows a pass of the alpha/beta dots holds (2 accumulators a row; launch_gdn mirrors it)
#define GDN_GATE_J 6     // x elements a thread holds: n_in <= GDN_GATE_J * blockDim.x in one trip

// gdn_mix's alpha / beta weights: row[i0 + step * jj] for jj < nj (0 past them) of a raw row of type TYPE (raw_at_t),
// loaded together.
template <int TYPE>
__device__ __forceinline__ void gate_weights_t(const u8* __restrict__ row, int i0, int step, int nj, float* out) {
#pragma unroll
    for (int jj = 0; jj < GDN_GATE_J; ++jj) out[jj] = jj < nj ? raw_at_t<TYPE>(row, i0 + step * jj) : 0.0f;
}

// The same for a runtime type (raw_at's four), dispatched once for the GDN_GATE_J elements.
__device__ __forceinline__ void gate_weights(const u8* __restrict__ row, int type, int i0, int step, int nj,
                                             float (&out)[GDN_GATE_J]) {
    if (type == GGML_F32) gate_weights_t<GGML_F32>(row, i0, step, nj, out);
    else if (type == GGML_F16) gate_weights_t<GGML_F16>(row, i0, step, nj, out);
    else if (type == GGML_BF16) gate_weights_t<GGML_BF16>(row, i0, step, nj, out);
    else gate_weights_t<GGML_Q8_0>(row, i0, step, nj, out);
}

// The GDN mixer between its projections in one launch (launch_gdn.gdn_mix, every window): for value head hv,
// conv + split of its q/k head kh = hv % Hk and of its v head (conv_at; q, k L2-normed per head, q times q_scale),
// the gates g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(beta_in) (the alpha/beta projections of x by
// raw_at dots when w_alpha is given, else read from alpha_in / beta_in), the delta rule (delta_rule_row, from the
// saved state, which is not written) and the gated norm y = o / rms(o) * norm_w * sigmoid(z) of its output rows
// (ops/gdn.py; the norms' sums go per warp). Rows [0, r0) belong to an
// earlier token group of a split window: their gates are read from g / beta (that group's launch wrote them), and
// only rows [r0, T) of x, alpha_in, beta_in, z and y exist (row t at t - r0). Writes what the commit keeps: v of
// its head, q and k of head hv when hv < Hk, and the gates g, beta of rows [r0, T).
//
// grid Hv, block dv * P threads rounded up to a multiple of 32 (1-D; P = ceil(dk / GDN_RPT); thread (j, p) =
// (tid % dv, tid / dv) with p < P holds S[i, j] for i = p*GDN_RPT + r, the rounding's threads only share the warp
// items and the barriers). Dynamic shared memory T*(2*dk + 2*dv) + 2*T + P*dv floats: the head's
// q, k, v and o rows, the gates, and the recurrence's partial sums across p; static: the gate dots' warp sums.
//
// The alpha/beta dots of GDN_GATE_ROWS rows at a time are spread over the whole block (thread i takes x elements
// i + blockDim.x * j, up to GDN_GATE_J of them loaded at once), added lanes then warps in warp order; the saved
// state's registers are loaded first, then the thread's GDN_GATE_J alpha and beta weights, decoded once for every
// pass (gate_weights: the type dispatched once a row; an element-wise raw_at in the unrolled body let the compiler
// copy the body for every pair of types, ~6700 SASS instructions; now ~5400, 104 registers, no spill). Latency at
// T = 1 (Hv 48, dk = dv = 128, n_in 2560, Q8_0 alpha/beta): 48 blocks of 512 threads; was the conv's trip, then one
// warp per gate looping 80 raw_at loads a lane (several dependent trips), then the state's trip; now the state,
// gate weight and conv loads in one or two trips, 2 barriers for the gates (their warp sums) and the norms, then
// the recurrence's 3 barriers a row and the gated norm. The gates' sum order over n_in: a thread's elements
// ascending, then warp_sum, then the warps ascending (float32 rounding against numpy; the tests' tolerances hold).
extern "C" __global__ void __launch_bounds__(GDN_REC_THREADS)
    gdn_mix(const float* __restrict__ qkv, const float* __restrict__ conv_state, const float* __restrict__ conv_w,
            int Ch, int qkv_ld, int K, const float* __restrict__ state, const float* __restrict__ x, int n_in,
            const u8* __restrict__ w_alpha, i64 alpha_stride, int alpha_type, const u8* __restrict__ w_beta,
            i64 beta_stride, int beta_type, const float* __restrict__ alpha_in, const float* __restrict__ beta_in,
            const float* __restrict__ dt_bias, const float* __restrict__ ssm_a, const float* __restrict__ z, int z_ld,
            const float* __restrict__ norm_w, float norm_eps, float* __restrict__ q, float* __restrict__ k,
            float* __restrict__ v, float* g, float* beta, float* __restrict__ y, int T, int r0, int nk, int nv,
            int dk, int dv, float q_scale, float l2_eps) {
    pdl_begin();
    extern __shared__ float smem[];
    __shared__ float gred[GDN_REC_THREADS / WARP][2 * GDN_GATE_ROWS];  // [warp][alpha, beta of each row]
    float* sq = smem;             // [T, dk]
    float* sk = sq + T * dk;      // [T, dk]
    float* sv = sk + T * dk;      // [T, dv]
    float* so = sv + T * dv;      // [T, dv]
    float* sdec = so + T * dv;    // [T]
    float* sbeta = sdec + T;      // [T]
    float* part = sbeta + T;      // [P, dv]
    const int hv = blockIdx.x, kh = hv % nk;
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int j = tid % dv, p = tid / dv, P = (dk + GDN_RPT - 1) / GDN_RPT;
    const bool holds = p < P;  // a thread of the recurrence
    const int lane = tid & (WARP - 1), warp = tid / WARP, n_warps = nthreads / WARP;

    // the saved state of the delta rule first: its loads overlap everything before the recurrence
    const i64 head = (i64)hv * dk * dv;
    float S[GDN_RPT];
#pragma unroll
    for (int r = 0; r < GDN_RPT; ++r) {
        const int i = p * GDN_RPT + r;
        S[r] = holds && i < dk ? state[head + (i64)i * dv + j] : 0.0f;
    }

    // this thread's alpha / beta weights (elements i = tid + nthreads * jj, jj < nj) decoded once for every pass of
    // the gates, their loads out before the conv's; the weight type dispatched once a row, not once an element
    const int nj = tid < n_in ? min(GDN_GATE_J, (n_in - tid + nthreads - 1) / nthreads) : 0;
    float ga[GDN_GATE_J], gb[GDN_GATE_J];
    if (w_alpha != nullptr && r0 < T) {
        gate_weights(w_alpha + (i64)hv * alpha_stride, alpha_type, tid, nthreads, nj, ga);
        gate_weights(w_beta + (i64)hv * beta_stride, beta_type, tid, nthreads, nj, gb);
    }

    // conv + silu of the head's channels, every row
    const int width = 2 * dk + dv;
    for (int idx = tid; idx < T * width; idx += nthreads) {
        const int t = idx / width, i = idx % width;
        float* dst;
        i64 c;
        if (i < dk) {
            c = (i64)kh * dk + i;
            dst = sq + t * dk + i;
        } else if (i < 2 * dk) {
            c = (i64)nk * dk + (i64)kh * dk + (i - dk);
            dst = sk + t * dk + (i - dk);
        } else {
            c = (i64)2 * nk * dk + (i64)hv * dv + (i - 2 * dk);
            dst = sv + t * dv + (i - 2 * dk);
        }
        *dst = conv_at(qkv, conv_state, conv_w, t, c, Ch, qkv_ld, K);
    }
    for (int t = tid; t < r0; t += nthreads) {  // an earlier group's gates
        sdec[t] = g[(i64)t * nv + hv];
        sbeta[t] = beta[(i64)t * nv + hv];
    }
    // the gates of rows [r0, T), GDN_GATE_ROWS a pass; the first pass's barrier also completes the conv
    const u8* wa = w_alpha + (i64)hv * alpha_stride;
    const u8* wb = w_beta + (i64)hv * beta_stride;
    for (int tb = r0; tb < T; tb += GDN_GATE_ROWS) {
        const int nr = min(GDN_GATE_ROWS, T - tb);
        if (w_alpha != nullptr) {  // uniform: every thread meets the shuffles
            float pa[GDN_GATE_ROWS], pb[GDN_GATE_ROWS];
#pragma unroll
            for (int t = 0; t < GDN_GATE_ROWS; ++t) pa[t] = pb[t] = 0.0f;
            const float* xr = x + (i64)(tb - r0) * n_in + tid;  // row t's element tid + nthreads * jj at
                                                                // xr[t * n_in + nthreads * jj]
#pragma unroll
            for (int jj = 0; jj < GDN_GATE_J; ++jj) {
#pragma unroll
                for (int t = 0; t < GDN_GATE_ROWS; ++t) {
                    if (jj < nj && t < nr) {
                        const float xv = xr[(i64)t * n_in + nthreads * jj];
                        pa[t] += ga[jj] * xv;
                        pb[t] += gb[jj] * xv;
                    }
                }
            }
#pragma unroll 1
            for (int i = tid + GDN_GATE_J * nthreads; i < n_in; i += nthreads) {  // wider x rows
                const float a = raw_at(wa, alpha_type, i), bb = raw_at(wb, beta_type, i);
#pragma unroll
                for (int t = 0; t < GDN_GATE_ROWS; ++t) {
                    if (t < nr) {
                        const float xv = xr[(i64)t * n_in + (i - tid)];
                        pa[t] += a * xv;
                        pb[t] += bb * xv;
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < GDN_GATE_ROWS; ++t) {
                if (t < nr) {
                    const float sa = warp_sum(pa[t]), sb = warp_sum(pb[t]);
                    if (lane == 0) {
                        gred[warp][2 * t] = sa;
                        gred[warp][2 * t + 1] = sb;
                    }
                }
            }
        }
        __syncthreads();
        if (tid < 2 * nr) {  // item tid: alpha (even) or beta (odd) of row tb + tid / 2
            const int t = tb + tid / 2;
            const bool is_alpha = tid % 2 == 0;
            float proj = 0.0f;
            if (w_alpha != nullptr) {
                for (int w = 0; w < n_warps; ++w) proj += gred[w][tid];  // warp order
            } else {
                proj = (is_alpha ? alpha_in : beta_in)[(i64)(t - r0) * nv + hv];
            }
            if (is_alpha) {
                const float gv = ssm_a[hv] * softplus_f(proj + dt_bias[hv]);
                sdec[t] = gv;
                g[(i64)t * nv + hv] = gv;
            } else {
                const float bv = sigmoid_f(proj);
                sbeta[t] = bv;
                beta[(i64)t * nv + hv] = bv;
            }
        }
        if (tb + GDN_GATE_ROWS < T) __syncthreads();  // gred is rewritten by the next pass
    }
    // one warp per item: the 2*T L2 norms (q then k of row t)
    for (int item = warp; item < 2 * T; item += n_warps) {
        const int t = item / 2;
        const bool is_q = item % 2 == 0;
        float* row = (is_q ? sq : sk) + t * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += WARP) ss += row[i] * row[i];
        const float norm = sqrtf(warp_sum(ss) + l2_eps);  // eps floors the SUM (ops/basic.l2_norm)
        for (int i = lane; i < dk; i += WARP) {
            const float xi = row[i] / norm;
            row[i] = is_q ? xi * q_scale : xi;
        }
    }
    __syncthreads();
    // what the commit keeps (rows [0, r0) again: the same values as the earlier group's launch wrote)
    for (int idx = tid; idx < T * dv; idx += nthreads) v[((i64)(idx / dv) * nv + hv) * dv + idx % dv] = sv[idx];
    if (hv < nk) {
        for (int idx = tid; idx < T * dk; idx += nthreads) {
            const i64 at = ((i64)(idx / dk) * nk + hv) * dk + idx % dk;
            q[at] = sq[idx];
            k[at] = sk[idx];
        }
    }

    // the delta rule over the T rows (gdn_recurrence's loop, q/k/v/gates from shared memory)
    for (int t = 0; t < T; ++t) {
        const float out = delta_rule_row(S, sk + t * dk, sq + t * dk, sv[t * dv + j], expf(sdec[t]), sbeta[t], part,
                                         j, p, P, dk, dv, holds);
        if (p == 0) so[t * dv + j] = out;
    }
    __syncthreads();  // so is complete

    // gated norm of this group's rows, one warp per row
    for (int t = r0 + warp; t < T; t += n_warps) {
        const float* ot = so + t * dv;
        float ss = 0.0f;
        for (int i = lane; i < dv; i += WARP) ss += ot[i] * ot[i];
        const float rms = sqrtf(warp_sum(ss) / (float)dv + norm_eps);
        const i64 base = ((i64)(t - r0) * nv + hv) * dv;
        const float* zt = z + (i64)(t - r0) * z_ld + (i64)hv * dv;
        for (int i = lane; i < dv; i += WARP) y[base + i] = ot[i] / rms * norm_w[i] * sigmoid_f(zt[i]);
    }
}
