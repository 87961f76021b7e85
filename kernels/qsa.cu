// qsa.cu: gated attention with QSA block selection over a verify window (strata_cli/ops/qsa.py), float32.
// Block scores and the top-k selection (one launch) are in qsa_select.cu.
//
// Legend: T window rows, H query heads, Hk kv heads, Hi indexer heads, d head dim, n_rot rotated dims (NeoX
// pairs (i, i + n_rot/2)), N cells, NB pooled blocks, ratio cells per block, C selected-cell capacity per row.
//   positions [T] int32 absolute positions of the window rows (consecutive)
//   cos_tab, sin_tab [P, n_rot] rope tables by absolute position (host float64 -> f32, ops.qsa.rope_tables)
//   k_cache, v_cache [N, Hk, d]; tail [ratio, d] raw indexer keys of the block being filled; pooled [NB, d]
#include "seq_common.cuh"

#define QSA_BLOCK 128
#define ATT_WARPS 16  // warps per (row, head): a head's cells are spread over them (latency, not bandwidth)
#define ATT_MAXR 8  // attention: d <= 32 * ATT_MAXR values per lane

// dst[0..d) = rope_row(rms_norm(src[0..d)) * w) with cs, sn = row's cos/sin [n_rot]; one block, y dynamic shared
// d floats (qsa_norm_rope and qsa_prep).
__device__ __forceinline__ void norm_rope_head(const float* __restrict__ src, const float* __restrict__ w,
                                               const float* __restrict__ cs, const float* __restrict__ sn,
                                               float* __restrict__ dst, int d, int n_rot, float eps, float* sh,
                                               float* y) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss, sh);
    const float rms = sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[i] = src[i] / rms * w[i];
    __syncthreads();  // rotation reads the partner element of another thread
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float val = y[i];
        if (i < n_rot) val = y[i] * cs[i] + (i < half ? -y[i + half] : y[i - half]) * sn[i];
        dst[i] = val;
    }
}

// out[t, h] = rope_{row}(rms_norm(x[t, h]) * w), row = rows ? rows[t] : t (rows = positions with full tables).
// x row (t, h) starts at x + t*xs_t + h*xs_h with d contiguous values (q is the first half of attn_q's heads).
// grid T*H, block QSA_BLOCK, dynamic shared d floats.
extern "C" __global__ void __launch_bounds__(QSA_BLOCK)
    qsa_norm_rope(const float* __restrict__ x, i64 xs_t, i64 xs_h, const float* __restrict__ w,
                  const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ rows,
                  float* __restrict__ out, int H, int d, int n_rot, float eps) {
    __shared__ float sh[WARP];
    extern __shared__ float y[];
    const i64 t = blockIdx.x / H, h = blockIdx.x % H;
    const i64 row = rows ? rows[t] : t;
    norm_rope_head(x + t * xs_t + h * xs_h, w, cos_tab + row * n_rot, sin_tab + row * n_rot, out + (t * H + h) * d,
                   d, n_rot, eps, sh, y);
}

// Append the first n = count_from(n_rows, n_dev, T) raw indexer keys raw [T, d] at positions[t], in order:
// tail[pos % ratio] = key; when pos completes block b = pos / ratio,
// pooled[b] = rope_{b*ratio}(rms_norm(mean of tail) * k_norm_w). save (nullable) receives the tail before
// anything is appended (the run's snapshot) and the tail goes back to it at the end (a run writes no committed
// state: the window's rows may wrap over slots of committed positions; no copy node after it); restore (nullable)
// replaces the tail first (the commit).
// One block of blockDim threads (qsa_indexer_append, and qsa_prep's last block): rows are sequential, a completion
// reads the slots earlier rows wrote. Column i of tail is always touched by thread i % blockDim.x. y: shared d
// floats.
__device__ __forceinline__ void indexer_append_block(float* tail, float* __restrict__ pooled,
                                                     const float* __restrict__ raw, const int* __restrict__ positions,
                                                     int n, float* save, const float* restore,
                                                     const float* __restrict__ k_norm_w,
                                                     const float* __restrict__ cos_tab,
                                                     const float* __restrict__ sin_tab, int ratio, int d, int n_rot,
                                                     float eps, float* sh, float* y) {
    const int tid = threadIdx.x, nth = blockDim.x;
    for (int e = tid; e < ratio * d; e += nth) {
        if (save) save[e] = tail[e];
        if (restore) tail[e] = restore[e];
    }
    __syncthreads();  // the copies above stride over ratio*d, not by column
    const int half = n_rot / 2;
    for (int r = 0; r < n; ++r) {
        const int pos = positions[r];
        for (int i = tid; i < d; i += nth) tail[(i64)(pos % ratio) * d + i] = raw[(i64)r * d + i];
        if ((pos + 1) % ratio != 0) continue;  // uniform: the block is not complete yet
        const i64 b = pos / ratio;
        float ss = 0.0f;
        for (int i = tid; i < d; i += nth) {
            float m = 0.0f;
            for (int s = 0; s < ratio; ++s) m += tail[(i64)s * d + i];  // row order, as numpy's axis-0 mean
            m = m / (float)ratio;
            y[i] = m;
            ss += m * m;
        }
        ss = block_sum(ss, sh);
        const float rms = sqrtf(ss / (float)d + eps);
        for (int i = tid; i < d; i += nth) y[i] = y[i] / rms * k_norm_w[i];
        __syncthreads();  // rotation reads the partner element
        const float* cs = cos_tab + b * ratio * n_rot;
        const float* sn = sin_tab + b * ratio * n_rot;
        for (int i = tid; i < d; i += nth) {
            float val = y[i];
            if (i < n_rot) val = y[i] * cs[i] + (i < half ? -y[i + half] : y[i - half]) * sn[i];
            pooled[b * d + i] = val;
        }
        __syncthreads();  // y is rewritten by the next completion
    }
    if (save == nullptr) return;
    __syncthreads();  // the tail's columns were written by their own threads; the copy strides over ratio*d
    for (int e = tid; e < ratio * d; e += nth) tail[e] = save[e];
}

// indexer_append_block in a launch of its own (the commit; a window whose indexer key is not in its stacked GEMV).
// One block of QSA_BLOCK threads, dynamic shared d floats.
extern "C" __global__ void __launch_bounds__(QSA_BLOCK)
    qsa_indexer_append(float* tail, float* __restrict__ pooled, const float* __restrict__ raw,
                       const int* __restrict__ positions, int T, int n_rows, const int* n_dev, float* save,
                       const float* restore, const float* __restrict__ k_norm_w, const float* __restrict__ cos_tab,
                       const float* __restrict__ sin_tab, int ratio, int d, int n_rot, float eps) {
    __shared__ float sh[WARP];
    extern __shared__ float y[];
    indexer_append_block(tail, pooled, raw, positions, count_from(n_rows, n_dev, T), save, restore, k_norm_w,
                         cos_tab, sin_tab, ratio, d, n_rot, eps, sh, y);
}

// A QSA layer's window rows after its one projection GEMV, in one launch (the seed's norm-rope k, kv append,
// norm-rope q, norm-rope of the indexer query and the indexer's key append; ops/qsa.prep_window):
//   k_cache[pos[t], h] = rope_pos(rms_norm(k[t, h]) * k_w)     h < Hk   (d values)
//   v_cache[pos[t], h] = v[t, h]                               h < Hk
//   qn[t, h]           = rope_pos(rms_norm(q[t, h]) * q_w)     h < H
//   qi[t, h]           = rope_pos(rms_norm(qr[t, h]) * qi_w)   h < Hi   (di values; Hi = 0 without an indexer)
//   with the indexer's keys (ik non-null): the last block copies the window's raw keys ik rows t into
//   idx_raw[r0 + t] (the commit re-appends them), then appends idx_raw rows [0, r0 + T) at idx_pos (the whole
//   window: group B of a split window re-appends A's rows from the restored tail) as qsa_indexer_append does,
//   with the tail saved to snap first and restored at the end.
// Inputs are views of the GEMV's rows: head h of row t of k starts at k + t*ks + h*d (v: vs, d; q: qs, qh; qr:
// is, di; ik: iks); k_cache, v_cache [N, Hk, d]; qn [T, H, d]; qi [T, Hi, di]; tail, snap [ratio, di]; pooled
// [NB, di]; idx_raw [>= r0 + T, di]; cos/sin [P, n_rot] by absolute position; pos = positions[t] (this group's rows).
// grid T * (2 Hk + H + Hi) (+ 1 with ik: block 0 the indexer's keys, the others shifted by one): block
// t * per_row + j takes k head j (j < Hk), v head j - Hk, q head j - 2 Hk, then indexer head; block QSA_BLOCK,
// dynamic shared max(d, di) floats. Each block writes only its own head; the indexer block alone writes idx_raw, tail, snap and pooled (score_select reads pooled next launch).
extern "C" __global__ void __launch_bounds__(QSA_BLOCK)
    qsa_prep(const float* __restrict__ k, i64 ks, const float* __restrict__ v, i64 vs, const float* __restrict__ q,
             i64 qs, i64 qh, const float* __restrict__ qr, i64 is, const float* __restrict__ k_w,
             const float* __restrict__ q_w, const float* __restrict__ qi_w, float* __restrict__ k_cache,
             float* __restrict__ v_cache, float* __restrict__ qn, float* __restrict__ qi,
             const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ positions,
             int T, int Hk, int H, int Hi, int d, int di, int n_rot, float eps, const float* __restrict__ ik, i64 iks,
             float* idx_raw, int r0, const int* __restrict__ idx_pos, float* tail, float* snap,
             float* __restrict__ pooled, const float* __restrict__ ik_w, int ratio) {
    __shared__ float sh[WARP];
    extern __shared__ float y[];
    const int per_row = 2 * Hk + H + Hi;
    if (ik != nullptr && blockIdx.x == 0) {  // the indexer's keys: the longest block (sequential rows) starts first
        for (int t = 0; t < T; ++t)
            for (int i = threadIdx.x; i < di; i += blockDim.x) idx_raw[(i64)(r0 + t) * di + i] = ik[t * iks + i];
        __syncthreads();
        indexer_append_block(tail, pooled, idx_raw, idx_pos, r0 + T, snap, nullptr, ik_w, cos_tab, sin_tab, ratio,
                             di, n_rot, eps, sh, y);
        return;
    }
    const int b = blockIdx.x - (ik != nullptr);
    const i64 t = b / per_row;
    int j = b % per_row;
    const i64 pos = positions[t];
    const float* cs = cos_tab + pos * n_rot;
    const float* sn = sin_tab + pos * n_rot;
    if (j < Hk) {
        norm_rope_head(k + t * ks + (i64)j * d, k_w, cs, sn, k_cache + (pos * Hk + j) * d, d, n_rot, eps, sh, y);
        return;
    }
    j -= Hk;
    if (j < Hk) {
        const float* src = v + t * vs + (i64)j * d;
        float* dst = v_cache + (pos * Hk + j) * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
        return;
    }
    j -= Hk;
    if (j < H) {
        norm_rope_head(q + t * qs + (i64)j * qh, q_w, cs, sn, qn + (t * H + j) * d, d, n_rot, eps, sh, y);
        return;
    }
    j -= H;
    norm_rope_head(qr + t * is + (i64)j * di, qi_w, cs, sn, qi + (t * Hi + j) * di, di, n_rot, eps, sh, y);
}

// out[t, h*d:(h+1)*d] = sigmoid(gate[t, h]) * softmax_s(q[t, h] . k_s / sqrt_d) v_s over the row's cells s:
// cells[t, :counts[t]] (selected), or, with cells null, every cell 0..positions[t] (dense). Query head h reads
// kv head h / (H / Hk). q [T, H, d]; the gate row (t, h) starts at gate + t*gs_t + h*gs_h (second half of attn_q).
// grid T*H, block ATT_WARPS*32: warp w takes cells w, w + ATT_WARPS, ... with an online softmax (lane holds
// dims lane + 32*r), then the warps' (max, sum, acc) are merged. Dynamic shared (d + ATT_WARPS*(d + 2)) floats.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * WARP)
    qsa_attend(const float* __restrict__ q, const float* __restrict__ gate, i64 gs_t, i64 gs_h,
               const float* __restrict__ k_cache, const float* __restrict__ v_cache, const int* __restrict__ cells,
               const int* __restrict__ counts, const int* __restrict__ positions, float* __restrict__ out, int H,
               int Hk, int d, int C, float sqrt_d) {
    extern __shared__ float sm[];
    float* sq = sm;
    float* wm = sq + d;            // [ATT_WARPS] running max
    float* wl = wm + ATT_WARPS;    // [ATT_WARPS] running sum of exp
    float* wacc = wl + ATT_WARPS;  // [ATT_WARPS, d]
    const i64 t = blockIdx.x / H;
    const int h = blockIdx.x % H, kvh = h / (H / Hk);
    const int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
    for (int i = threadIdx.x; i < d; i += blockDim.x) sq[i] = q[(t * H + h) * d + i];
    __syncthreads();
    const int count = cells ? counts[t] : positions[t] + 1;
    float m = NEG_INF, l = 0.0f, acc[ATT_MAXR];
#pragma unroll
    for (int r = 0; r < ATT_MAXR; ++r) acc[r] = 0.0f;
    for (int s = w; s < count; s += ATT_WARPS) {
        const i64 cell = cells ? cells[t * C + s] : s;
        const float* kr = k_cache + (cell * Hk + kvh) * d;
        const float* vr = v_cache + (cell * Hk + kvh) * d;
        float part = 0.0f, vv[ATT_MAXR];
#pragma unroll
        for (int r = 0; r < ATT_MAXR; ++r) {
            vv[r] = lane + WARP * r < d ? vr[lane + WARP * r] : 0.0f;  // issued with k, before the reduction waits
            if (lane + WARP * r < d) part += sq[lane + WARP * r] * kr[lane + WARP * r];
        }
        const float sc = warp_sum(part) / sqrt_d;  // the same value in every lane
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new), p = expf(sc - m_new);  // corr is 0 on the warp's first cell
        l = l * corr + p;
#pragma unroll
        for (int r = 0; r < ATT_MAXR; ++r)
            if (lane + WARP * r < d) acc[r] = acc[r] * corr + p * vv[r];
        m = m_new;
    }
    if (lane == 0) {
        wm[w] = m;
        wl[w] = l;
    }
#pragma unroll
    for (int r = 0; r < ATT_MAXR; ++r)
        if (lane + WARP * r < d) wacc[w * d + lane + WARP * r] = acc[r];
    __syncthreads();
    float M = NEG_INF;
    for (int i = 0; i < ATT_WARPS; ++i) M = fmaxf(M, wm[i]);
    float L = 0.0f;
    for (int i = 0; i < ATT_WARPS; ++i) L += wl[i] * expf(wm[i] - M);  // a warp without cells adds 0
    const float* gr = gate + t * gs_t + (i64)h * gs_h;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < ATT_WARPS; ++j) a += wacc[j * d + i] * expf(wm[j] - M);
        out[(t * H + h) * d + i] = a / L * sigmoid_f(gr[i]);
    }
}
