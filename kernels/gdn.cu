// gdn.cu: Gated DeltaNet over a verify window (strata_cli/ops/gdn.py), float32 throughout.
//
// Legend: T window rows, Ch = 2*Hk*dk + Hv*dv conv channels, K conv taps, Hk key/query heads, Hv value heads,
// dk / dv key / value head dims. All arrays C-contiguous.
//   qkv [T, Ch] raw projections; conv_state [K-1, Ch] previous raw rows (oldest first); conv_w [Ch, K]
//   q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv]; state [Hv, dk, dv]; o, z [T, Hv, dv]
// A window reads the saved conv and recurrent state and never writes them; the commit kernels advance both to
// the first n_keep rows from what the window stored (qkv, q, k, v, g, beta). Value head h reads key head h % Hk.
#include "seq_common.cuh"

#define GDN_BLOCK 256
#define GDN_RPT 32           // recurrence: state rows in registers per thread (dk <= GDN_RPT * blockDim.y)
#define GDN_REC_THREADS 512  // recurrence: most threads per block (dv * blockDim.y)

// h[t, c] = silu(sum_i seq[t + i, c] * conv_w[c, i]) over seq = [conv_state | qkv] (K-1+T rows); tap K-1 is the
// current row. Grid-stride over T*Ch, block GDN_BLOCK.
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_conv(const float* __restrict__ qkv, const float* __restrict__ conv_state, const float* __restrict__ conv_w,
             float* __restrict__ h, int T, int Ch, int K) {
    const i64 n = (i64)T * Ch;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 t = idx / Ch, c = idx % Ch;
        float acc = 0.0f;
        for (int i = 0; i < K; ++i) {
            const i64 r = t + i;  // row of seq
            const float x = r < K - 1 ? conv_state[r * Ch + c] : qkv[(r - (K - 1)) * Ch + c];
            acc += x * conv_w[c * K + i];
        }
        h[idx] = silu_f(acc);
    }
}

// Conv commit: conv_state [K1 = K-1, Ch] <- rows [n_keep, n_keep + K1) of [conv_state | qkv] (qkv holds T rows).
// Thread per channel; the arguments of ple.cu's ple_history_commit (seq_util.rolling_commit builds both).
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_conv_commit(float* conv_state, const float* __restrict__ qkv, int T, int K1, int Ch, int n_keep,
                    const int* n_keep_dev) {
    rolling_commit(conv_state, qkv, T, K1, Ch, n_keep, n_keep_dev);
}

// h [T, Ch] -> q = l2norm(h[:, :Hk*dk]) / sqrt(dk), k = l2norm(h[:, Hk*dk : 2*Hk*dk]) per head, v = the rest.
// grid (T, 2*Hk + Hv): y < Hk a q head, y < 2*Hk a k head, else a v head (copied); block GDN_BLOCK.
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_split(const float* __restrict__ h, float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
              int Ch, int nk, int dk, int nv, int dv, float q_scale, float eps) {
    __shared__ float sh[WARP];
    const i64 t = blockIdx.x;
    const int j = blockIdx.y;
    const float* row = h + t * Ch;
    if (j >= 2 * nk) {  // uniform per block: no barrier is skipped by part of the block
        const int vh = j - 2 * nk;
        const float* src = row + 2 * nk * dk + vh * dv;
        float* dst = v + (t * nv + vh) * dv;
        for (int i = threadIdx.x; i < dv; i += blockDim.x) dst[i] = src[i];
        return;
    }
    const float* src = row + (i64)j * dk;  // q heads then k heads, back to back
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss, sh);
    const float norm = sqrtf(ss + eps);  // eps floors the SUM (ops/basic.l2_norm)
    const bool is_q = j < nk;
    float* dst = is_q ? q + (t * nk + j) * dk : k + (t * nk + (j - nk)) * dk;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float x = src[i] / norm;
        dst[i] = is_q ? x * q_scale : x;
    }
}

// gdn_conv then gdn_split in one launch (launch_gdn.gdn_conv_split, windows of T >= 4): no h [T, Ch] round trip.
// grid (T, 2*Hk + Hv) as gdn_split, block GDN_BLOCK; each block convolves its head's channels itself (conv_at:
// gdn_conv's arithmetic), twice for a q/k head (once for the norm, once for the output), so q, k, v equal
// gdn_conv + gdn_split bit for bit.
__device__ __forceinline__ float conv_at(const float* __restrict__ qkv, const float* __restrict__ conv_state,
                                         const float* __restrict__ conv_w, i64 t, i64 c, int Ch, int K) {
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) {
        const i64 r = t + i;  // row of seq = [conv_state | qkv]
        const float x = r < K - 1 ? conv_state[r * Ch + c] : qkv[(r - (K - 1)) * Ch + c];
        acc += x * conv_w[c * K + i];
    }
    return silu_f(acc);
}

extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_conv_split(const float* __restrict__ qkv, const float* __restrict__ conv_state,
                   const float* __restrict__ conv_w, float* __restrict__ q, float* __restrict__ k,
                   float* __restrict__ v, int Ch, int K, int nk, int dk, int nv, int dv, float q_scale, float eps) {
    __shared__ float sh[WARP];
    const i64 t = blockIdx.x;
    const int j = blockIdx.y;
    if (j >= 2 * nk) {  // uniform per block: no barrier is skipped by part of the block
        const int vh = j - 2 * nk;
        const i64 c0 = (i64)2 * nk * dk + (i64)vh * dv;
        float* dst = v + (t * nv + vh) * dv;
        for (int i = threadIdx.x; i < dv; i += blockDim.x) dst[i] = conv_at(qkv, conv_state, conv_w, t, c0 + i, Ch, K);
        return;
    }
    const i64 c0 = (i64)j * dk;  // q heads then k heads, back to back
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float x = conv_at(qkv, conv_state, conv_w, t, c0 + i, Ch, K);
        ss += x * x;
    }
    ss = block_sum(ss, sh);
    const float norm = sqrtf(ss + eps);  // eps floors the SUM (ops/basic.l2_norm)
    const bool is_q = j < nk;
    float* dst = is_q ? q + (t * nk + j) * dk : k + (t * nk + (j - nk)) * dk;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float x = conv_at(qkv, conv_state, conv_w, t, c0 + i, Ch, K) / norm;
        dst[i] = is_q ? x * q_scale : x;
    }
}

// g = ssm_a * softplus(alpha + dt_bias) (log decay), beta = sigmoid(beta_in); alpha, beta_in, g, beta [T, Hv].
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_gates(const float* __restrict__ alpha, const float* __restrict__ beta_in, const float* __restrict__ dt_bias,
              const float* __restrict__ ssm_a, float* __restrict__ g, float* __restrict__ beta, int T, int nv) {
    const i64 n = (i64)T * nv;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const int hv = (int)(idx % nv);
        g[idx] = ssm_a[hv] * softplus_f(alpha[idx] + dt_bias[hv]);
        beta[idx] = sigmoid_f(beta_in[idx]);
    }
}

// The alpha and beta projections with their gates in one launch (launch_gdn.gdn_ab_gates, windows of T >= 4):
//   g[t, h] = ssm_a[h] * softplus(W_alpha[h] . x[t] + dt_bias[h]),  beta[t, h] = sigmoid(W_beta[h] . x[t])
// x [T, n_in]; W_alpha, W_beta raw [Hv, n_in] rows (row strides in bytes, types F32/F16/BF16/Q8_0); g, beta [T, Hv].
// grid 2*Hv (block o < Hv: alpha row o; else beta row o - Hv), block GDN_BLOCK: the threads split the input axis,
// rows of x in chunks of AB_MAXT, partial sums reduced per warp then across warps in warp order (deterministic).
#define AB_MAXT 16
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_ab_gates(const float* __restrict__ x, int n_in, const u8* __restrict__ w_alpha, i64 alpha_stride,
                 int alpha_type, const u8* __restrict__ w_beta, i64 beta_stride, int beta_type,
                 const float* __restrict__ dt_bias, const float* __restrict__ ssm_a, float* __restrict__ g,
                 float* __restrict__ beta, int T, int nv) {
    __shared__ float sh[GDN_BLOCK / WARP][AB_MAXT];
    const bool is_alpha = blockIdx.x < (unsigned)nv;
    const int h = is_alpha ? blockIdx.x : blockIdx.x - nv;
    const u8* row = is_alpha ? w_alpha + (i64)h * alpha_stride : w_beta + (i64)h * beta_stride;
    const int type = is_alpha ? alpha_type : beta_type;
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    for (int t0 = 0; t0 < T; t0 += AB_MAXT) {
        const int nt = min(AB_MAXT, T - t0);
        float acc[AB_MAXT];
#pragma unroll
        for (int t = 0; t < AB_MAXT; ++t) acc[t] = 0.0f;
        for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
            const float w = raw_at(row, type, i);
#pragma unroll
            for (int t = 0; t < AB_MAXT; ++t)
                if (t < nt) acc[t] += w * x[(i64)(t0 + t) * n_in + i];
        }
#pragma unroll
        for (int t = 0; t < AB_MAXT; ++t) acc[t] = warp_sum(acc[t]);
        __syncthreads();  // sh is reused by the next chunk
        if (lane == 0)
            for (int t = 0; t < nt; ++t) sh[warp][t] = acc[t];
        __syncthreads();
        if (threadIdx.x < nt) {
            float v = 0.0f;
            for (int k = 0; k < n_warps; ++k) v += sh[k][threadIdx.x];
            const i64 idx = (i64)(t0 + threadIdx.x) * nv + h;
            if (is_alpha) g[idx] = ssm_a[h] * softplus_f(v + dt_bias[h]);
            else beta[idx] = sigmoid_f(v);
        }
    }
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
        const float decay = expf(g[(i64)t * nv + hv]);
        const float b = beta[(i64)t * nv + hv];
        float mem = 0.0f;  // this thread's share of (S^T k)[j]
#pragma unroll
        for (int r = 0; r < GDN_RPT; ++r) {
            const int i = p * GDN_RPT + r;
            if (i < dk) {
                S[r] *= decay;
                mem += S[r] * sk[i];
            }
        }
        part[p * dv + j] = mem;
        __syncthreads();
        mem = 0.0f;
        for (int pp = 0; pp < P; ++pp) mem += part[pp * dv + j];  // same order in every thread of column j
        const float delta = (v[((i64)t * nv + hv) * dv + j] - mem) * b;
        float out = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_RPT; ++r) {
            const int i = p * GDN_RPT + r;
            if (i < dk) {
                S[r] += sk[i] * delta;
                out += S[r] * sq[i];
            }
        }
        __syncthreads();  // every thread has read part[] for mem
        part[p * dv + j] = out;
        __syncthreads();
        if (o && p == 0) {
            float acc = 0.0f;
            for (int pp = 0; pp < P; ++pp) acc += part[pp * dv + j];
            o[((i64)t * nv + hv) * dv + j] = acc;
        }
        if (t + 1 == n_save) {
#pragma unroll
            for (int r = 0; r < GDN_RPT; ++r)
                if (p * GDN_RPT + r < dk) state_out[head + (i64)(p * GDN_RPT + r) * dv + j] = S[r];
        }
        __syncthreads();  // sk, sq and part are rewritten by the next row
    }
}

// y = rms_norm(o) * norm_w * sigmoid(z) per (row, value head); o, z, y [T, Hv, dv], norm_w [dv].
// grid T*Hv, block GDN_BLOCK.
extern "C" __global__ void __launch_bounds__(GDN_BLOCK)
    gdn_gated_norm(const float* __restrict__ o, const float* __restrict__ z, const float* __restrict__ norm_w,
                   float* __restrict__ y, int dv, float eps) {
    __shared__ float sh[WARP];
    const i64 base = (i64)blockIdx.x * dv;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += o[base + i] * o[base + i];
    ss = block_sum(ss, sh);
    const float rms = sqrtf(ss / (float)dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x)
        y[base + i] = o[base + i] / rms * norm_w[i] * sigmoid_f(z[base + i]);
}
