// ple.cu: the PLE block over a verify window (strata_cli/ops/ple.py): n-gram hash rows (and, for tables of the
// element-wise types, their gather in the same launch: ple_gather), and the per-stream gate, grouped norms and
// dilated conv of ple_mix. Block-type tables are gathered by gemv_quant.cu, the key/value projections are gemv.cu
// launches.
//
// Legend: T window rows, n n-gram size, hpn heads per n-gram order, Hn = (n-1)*hpn table rows per token,
// hd table row length, C streams, D hidden, CD = C*D, Kc conv taps, dil dilation, Hh = (Kc-1)*dil history rows.
//   tokens [T] int64; prev [n-1] int64 predecessors before the window, oldest first (EOS-padded)
//   R [T, C, D]; key_raw [T, CD] = emb @ w_key^T; value [T, D] = emb @ w_value^T (or both one GEMV's rows
//   [key | value] [T, CD + D] over the stacked [w_key; w_value]); norms [CD]; conv_w [CD, Kc]
//   history [Hh, CD] previous normed rows, oldest first; gated, normed [T, CD]
// A window reads history and prev and never writes them; the commit kernels advance both to n_keep rows.
#include "seq_common.cuh"

#define PLE_BLOCK 256
#define PLE_MAXN 8  // largest n-gram size

// rows[t, (m-2)*hpn + g] = (XOR_{j<m} ctx[j]*mult[j]) floor-mod sizes[.] + offsets[.] for orders m = 2..n, with
// ctx = [token, newest predecessor, ...] where a predecessor reads EOS once an EOS lies between it and the token
// (ops.ple.ngram_context). Products wrap mod 2^64 as torch's int64 does. The table row of window row t, head
// `head` (order m = head / hpn + 2), or all Hn of them into rows[0..Hn) when head < 0.
__device__ __forceinline__ i64 ngram_row(const i64* __restrict__ tokens, const i64* __restrict__ prev,
                                         const i64* __restrict__ mult, const i64* __restrict__ sizes,
                                         const i64* __restrict__ offsets, int t, int n, int hpn, i64 eos, int head,
                                         i64* rows) {
    i64 ctx[PLE_MAXN];
    ctx[0] = tokens[t];
    bool cut = false;
    for (int s = 1; s < n; ++s) {
        const int j = (n - 1) + t - s;  // index into [prev | tokens]
        const i64 tok = j >= n - 1 ? tokens[j - (n - 1)] : prev[j];
        cut = cut || tok == eos;
        ctx[s] = cut ? eos : tok;
    }
    const int m_last = head < 0 ? n : head / hpn + 2;
    unsigned long long mixed = (unsigned long long)ctx[0] * (unsigned long long)mult[0];
    i64 row = 0;
    for (int m = 2; m <= m_last; ++m) {
        mixed ^= (unsigned long long)ctx[m - 1] * (unsigned long long)mult[m - 1];
        for (int g = 0; g < hpn; ++g) {
            const int hd = (m - 2) * hpn + g;
            if (head >= 0 && hd != head) continue;
            i64 r = (i64)mixed % sizes[hd];  // C truncates; numpy's remainder floors
            if (r < 0) r += sizes[hd];
            row = r + offsets[hd];
            if (head < 0) rows[hd] = row;
        }
    }
    return row;
}

// rows [T, Hn] of the window (ngram_row). Thread per window row.
extern "C" __global__ void __launch_bounds__(PLE_BLOCK)
    ple_ngram_rows(const i64* __restrict__ tokens, const i64* __restrict__ prev, const i64* __restrict__ mult,
                   const i64* __restrict__ sizes, const i64* __restrict__ offsets, i64* __restrict__ rows, int T, int n,
                   int hpn, i64 eos) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    ngram_row(tokens, prev, mult, sizes, offsets, t, n, hpn, eos, -1, rows + (i64)t * (n - 1) * hpn);
}

// The window's gathered PLE rows in one launch (ple_ngram_rows + embed.cu gather_rows): emb[t, head*hd + i] =
// table row ngram_row(t, head), element i, for table types F32, F16, BF16, Q8_0 (table_at; the block types gather
// in gemv_quant.cu after ple_ngram_rows). grid T*Hn (block t*Hn + head; every thread hashes the row, a few
// multiplies), block PLE_BLOCK.
extern "C" __global__ void __launch_bounds__(PLE_BLOCK)
    ple_gather(const i64* __restrict__ tokens, const i64* __restrict__ prev, const i64* __restrict__ mult,
               const i64* __restrict__ sizes, const i64* __restrict__ offsets, int n, int hpn, i64 eos,
               const u8* __restrict__ table, i64 row_bytes, int type, float* __restrict__ emb, int hd) {
    const int Hn = (n - 1) * hpn;
    const int t = blockIdx.x / Hn, head = blockIdx.x % Hn;
    const u8* src = table + ngram_row(tokens, prev, mult, sizes, offsets, t, n, hpn, eos, head, nullptr) * row_bytes;
    float* dst = emb + (i64)blockIdx.x * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = table_at(src, type, i);
}

// Per (row t, stream c): first the layer's pending hyper-connection write, if any (bo or parts non-null: R[t, c, :]
// += pending(t, :) * inj_prev[t, c] in place, hyper.cu hc_write's rounding, Pending in common.cuh), then
// key = rms(key_raw) * norm_key, query = rms(R) * norm_query (grouped per stream),
// s = key . query / sqrt_D, gate = sigmoid(sign(s) * sqrt(max(|s|, 1e-6))), gated = gate * value[t],
// normed = rms(gated) * norm_conv. key_raw row t at key_raw + t*ks, value row t at value + t*vs (ks = vs = CD + D
// where key and value are one GEMV's rows [key | value]). grid T*C, block PLE_BLOCK; block (t, c) owns R[t, c, :]
// (each element updated and read by one thread).
extern "C" __global__ void __launch_bounds__(PLE_BLOCK)
    ple_gate(const float* __restrict__ key_raw, i64 ks, const float* __restrict__ value, i64 vs, float* R,
             const float* __restrict__ bo, const float* __restrict__ parts, const float* __restrict__ route_w,
             const float* __restrict__ shared, int K, const float* __restrict__ inj_prev,
             const float* __restrict__ norm_key, const float* __restrict__ norm_query,
             const float* __restrict__ norm_conv, float* __restrict__ gated, float* __restrict__ normed, int C, int D,
             float sqrt_D, float eps) {
    __shared__ float sh[WARP];
    const i64 tc = blockIdx.x, t = tc / C, c = tc % C;
    const i64 base = tc * D;
    const float* kr = key_raw + t * ks + c * D;
    float* rr = R + base;
    const float* nk = norm_key + c * D;
    const float* nq = norm_query + c * D;
    const float* nc = norm_conv + c * D;
    const bool write = bo != nullptr || parts != nullptr;
    const Pending pend{bo, parts, route_w, shared, K};
    const float g = write ? inj_prev[tc] : 0.0f;
    float sk = 0.0f, sr = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float r = rr[i];
        if (write) {
            r = r + __fmul_rn(pend.at((int)t, i, D), g);
            rr[i] = r;
        }
        sk += kr[i] * kr[i];
        sr += r * r;
    }
    const float rms_k = sqrtf(block_sum(sk, sh) / (float)D + eps);
    const float rms_q = sqrtf(block_sum(sr, sh) / (float)D + eps);
    float dot = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dot += (kr[i] / rms_k * nk[i]) * (rr[i] / rms_q * nq[i]);
    const float s = block_sum(dot, sh) / sqrt_D;
    const float sign = s > 0.0f ? 1.0f : (s < 0.0f ? -1.0f : 0.0f);
    const float gate = sigmoid_f(sign * sqrtf(fmaxf(fabsf(s), 1e-6f)));
    float sg = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float gv = gate * value[t * vs + i];
        gated[base + i] = gv;
        sg += gv * gv;
    }
    const float rms_g = sqrtf(block_sum(sg, sh) / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) normed[base + i] = gated[base + i] / rms_g * nc[i];
}

// out[t, ch] = R[t, ch] + gated[t, ch] + silu(sum_k seq[Hh - (Kc-1-k)*dil + t, ch] * conv_w[ch, k]) over
// seq = [history | normed] (Hh + T rows; PleConv in common.cuh, which hyper.cu hc_write_norm applies instead where
// the window's next read follows). out may be R (each element read, then written, by one thread).
// Grid-stride over T*CD, block PLE_BLOCK.
extern "C" __global__ void __launch_bounds__(PLE_BLOCK)
    ple_conv_out(const float* R, const float* __restrict__ gated, const float* __restrict__ history,
                 const float* __restrict__ normed, const float* __restrict__ conv_w, float* out, int T, int CD,
                 int Kc, int dil) {
    const PleConv ple{gated, history, normed, conv_w, CD, Kc, dil};
    const i64 n = (i64)T * CD;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x)
        out[idx] = ple.add_to(R[idx], idx / CD, idx % CD);
}

// History commit: history <- rows [n_keep, n_keep + Hh) of [history | normed]. Thread per channel.
extern "C" __global__ void __launch_bounds__(PLE_BLOCK)
    ple_history_commit(float* history, const float* __restrict__ normed, int T, int Hh, int CD, int ld, int n_keep,
                       const int* n_keep_dev) {
    rolling_commit(history, normed, T, Hh, CD, ld, n_keep, n_keep_dev);
}

// Predecessor commit: prev [n-1] <- the last n-1 of [prev | tokens[:n_keep]] (tokens [T]). One thread.
extern "C" __global__ void ple_prev_commit(i64* prev, const i64* __restrict__ tokens, int T, int n_prev, int n_keep,
                                           const int* n_keep_dev) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
        shift_commit_column(prev, tokens, n_prev, (i64)1, (i64)0, count_from(n_keep, n_keep_dev, T), (i64)1);
}
