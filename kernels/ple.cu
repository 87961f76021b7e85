// ple.cu: the PLE block over a verify window (strata_cli/ops/ple.py): n-gram hash rows (and, for tables of the
// element-wise types, their gather in the same launch: ple_gather), and the PLE layer's mix as the first kernel of
// its first hyper-connection read (ple_mix_norm: the previous layer's write, the per-stream gate and grouped norms,
// the dilated conv step and the read's norm). Block-type tables are gathered by gemv_quant.cu, the key/value
// projection is one gemv.cu / gemv_q8r.cu launch; both run in the window's inputs section (they read the tokens
// and the table only), before layer 0.
//
// Legend: T window rows, n n-gram size, hpn heads per n-gram order, Hn = (n-1)*hpn table rows per token,
// hd table row length, C streams, D hidden, CD = C*D, Kc conv taps, dil dilation, Hh = (Kc-1)*dil history rows.
//   tokens [T] int64; prev [n-1] int64 predecessors before the window, oldest first (EOS-padded)
//   R [T, C, D]; key_raw [T, CD] = emb @ w_key^T (row stride ks); value [T, D] = emb @ w_value^T (row stride vs;
//   both views of one GEMV's rows [key | value] [T, CD + D] where w_key and w_value are stacked); norms [CD];
//   conv_w [CD, Kc]; history [Hh, CD] previous normed rows, oldest first; normed [T, CD]; xn [T, CD]
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
    pdl_begin();
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
    pdl_begin();
    const int Hn = (n - 1) * hpn;
    const int t = blockIdx.x / Hn, head = blockIdx.x % Hn;
    const u8* src = table + ngram_row(tokens, prev, mult, sizes, offsets, t, n, hpn, eos, head, nullptr) * row_bytes;
    float* dst = emb + (i64)blockIdx.x * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = table_at(src, type, i);
}

#define PLE_EPT 5            // elements of a stream's row a thread holds (one pass where D <= 5 * 512)
#define PLE_NORM_THREADS 512
#define PLE_TAPS 4           // conv taps whose loads go out together (the model's Kc); more taps: chunks of 4

// gate of the PLE's key . query score s (ops/ple.ple_mix): sigmoid(sign(s) * sqrt(max(|s|, 1e-6)))
__device__ __forceinline__ float ple_gate_of(float s) {
    const float sign = s > 0.0f ? 1.0f : (s < 0.0f ? -1.0f : 0.0f);
    return sigmoid_f(sign * sqrtf(fmaxf(fabsf(s), 1e-6f)));
}

// The PLE layer's mix and its first read's norm in one launch (ops/ple.ple_mix_after_write, then the read's
// grouped_rms_norm: launch_hyper.hc_read's xn). Block b = t*C + c owns row t, stream c:
//   R[t, c] += pending(t) * inj_prev[t, c]           the previous layer's write if any (bo or parts non-null;
//                                                     hc_write's rounding: product, then add; Pending::at_n)
//   s = (rms(key_raw[t, c]) * norm_key) . (rms(R[t, c]) * norm_query) / sqrt_D,   gate = ple_gate_of(s)
//   gated = gate * value[t] (rounded), normed[t, c] = rms(gated) * norm_conv   (written: the conv's, the commit's)
//   R[t, c] = R + gated + silu(sum_k seq[Hh - (Kc-1-k)*dil + t, c] * conv_w[c, k]) over seq = [history | normed]
//                                                     (R + gated first, then the silu: numpy's order)
//   xn[t, c] = rms(R[t, c]) * norm_w
// (x / rms as x times the reciprocal, computed once.) Thread i holds elements d = pass + i + e * blockDim.x
// (e < PLE_EPT) in registers, every load of a phase issued before the first use (the combine's in chunks:
// Pending::at_n; the conv's taps in chunks of PLE_TAPS); 5 block reductions (the key's and the query's rms, the
// score, gated's rms, R's). ONE (ple_mix_norm): the row is one pass, D <= PLE_EPT * blockDim.x, the model's
// shape; else (ple_mix_norm_passes) each phase goes over the passes re-reading what it needs (R holds the written
// value in between): another kernel, so the model's carries no code of the passes.
// The conv of row t reads normed rows t - j*dil (0 < j < Kc) of the window, which blocks (t - j*dil, c) write.
// sync (uint32 [1 + T*C], zero between launches; given where T > dil): each block publishes its normed row
// (flag sync[1 + b], after a barrier and a fence: cooperative groups' grid-sync order) before it waits for the
// flags of its row's predecessors; it waits on blocks of lower index only, which the hardware dispatches no later
// than itself (CUB's single-pass scan, agent_scan.cuh ConsumeRange, relies on the same; a window has T*C blocks),
// and reads their rows from L2 (__ldcg). The last block to arrive (sync[0], counted once its waits are over)
// zeroes the flags and the counter at its end. T <= dil: no row reads another's, sync is null and nothing waits.
// grid T*C, block launch_hyper.norm_threads(D) (<= PLE_NORM_THREADS, whole warps).
template <bool ONE>
__device__ __forceinline__ void ple_mix_norm_body(
    float* R, const float* __restrict__ bo, const float* __restrict__ parts, const float* __restrict__ route_w,
    const float* __restrict__ shared, int K, const float* __restrict__ inj_prev, const float* __restrict__ key_raw,
    i64 ks, const float* __restrict__ value, i64 vs, const float* __restrict__ norm_key,
    const float* __restrict__ norm_query, const float* __restrict__ norm_conv, const float* history,
    const float* __restrict__ conv_w, int Kc, int dil, float* normed, unsigned* sync,
    const float* __restrict__ norm_w, float* __restrict__ xn, int C, int D, float sqrt_D, float eps) {
    __shared__ float sh[WARP];
    const int b = blockIdx.x, c = b % C, t = b / C, nth = blockDim.x, span = ONE ? D : PLE_EPT * nth;
    const i64 CD = (i64)C * D, base = (i64)b * D, ch0 = (i64)c * D;  // R, normed, xn: (t, c)'s row at base
    float* r = R + base;
    const float* kr = key_raw + t * ks + ch0;
    const float* vr = value + t * vs;
    const bool write = bo != nullptr || parts != nullptr;
    const Pending pend{bo, parts, route_w, shared, K};
    const float g = write ? inj_prev[b] : 0.0f;
    float v[PLE_EPT], kv[PLE_EPT], vv[PLE_EPT], nkv[PLE_EPT], nqv[PLE_EPT], ncv[PLE_EPT];
    auto load = [&](int d0) {  // the pass's elements (0 past D): R as it now is, the inputs, the norms
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            const int d = d0 + e * nth;
            const bool in = d < D;
            v[e] = in ? r[d] : 0.0f;
            kv[e] = in ? kr[d] : 0.0f;
            vv[e] = in ? vr[d] : 0.0f;
            nkv[e] = in ? norm_key[ch0 + d] : 0.0f;
            nqv[e] = in ? norm_query[ch0 + d] : 0.0f;
            ncv[e] = in ? norm_conv[ch0 + d] : 0.0f;
        }
    };

    // the pending write, then the key's and the query's sums of squares
    float sk = 0.0f, sr = 0.0f;
    for (int pass = 0; pass < D; pass += span) {
        const int d0 = pass + threadIdx.x;
        load(d0);
        if (write) pend.add_n(t, d0, nth, D, g, v, ONE ? nullptr : r);  // the later passes re-read r
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            sk += kv[e] * kv[e];
            sr += v[e] * v[e];
        }
    }
    const float ik = 1.0f / sqrtf(block_sum(sk, sh) / (float)D + eps);
    const float iq = 1.0f / sqrtf(block_sum(sr, sh) / (float)D + eps);

    float dot = 0.0f;
    for (int pass = 0; pass < D; pass += span) {
        if (!ONE) load(pass + threadIdx.x);
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) dot += (kv[e] * ik * nkv[e]) * (v[e] * iq * nqv[e]);
    }
    const float gate = ple_gate_of(block_sum(dot, sh) / sqrt_D);

    float sg = 0.0f;
    for (int pass = 0; pass < D; pass += span) {
        if (!ONE) load(pass + threadIdx.x);
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            const float gv = __fmul_rn(gate, vv[e]);
            sg += gv * gv;
        }
    }
    const float ig = 1.0f / sqrtf(block_sum(sg, sh) / (float)D + eps);

    float nv[PLE_EPT];  // this block's normed row (the conv's newest tap)
    for (int pass = 0; pass < D; pass += span) {
        const int d0 = pass + threadIdx.x;
        if (!ONE) load(d0);
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            const int d = d0 + e * nth;
            nv[e] = __fmul_rn(gate, vv[e]) * ig * ncv[e];
            if (d < D) normed[base + d] = nv[e];
        }
    }

    unsigned arrived = 0u;
    if (sync != nullptr) {
        __syncthreads();  // the block's normed row is written
        if (threadIdx.x == 0) {
            __threadfence();
            atomicExch(sync + 1 + b, 1u);
        }
        if (threadIdx.x < Kc - 1) {  // thread j - 1 waits for row t - j*dil
            const int tp = t - (threadIdx.x + 1) * dil;
            if (tp >= 0) {
                const volatile unsigned* flag = sync + 1 + tp * C + c;
                while (*flag == 0u) {
                }
                __threadfence();
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) arrived = atomicAdd(sync, 1u);  // its value is used at the end only
    }

    // the conv step; a tap's row lies in the history (tp < 0), is this block's (nv) or an earlier block's
    const int Hh = (Kc - 1) * dil;
    float ss = 0.0f, wv[PLE_EPT];
    for (int pass = 0; pass < D; pass += span) {
        const int d0 = pass + threadIdx.x;
        if (!ONE) {
            load(d0);  // R as the pending write left it
#pragma unroll
            for (int e = 0; e < PLE_EPT; ++e) nv[e] = __fmul_rn(gate, vv[e]) * ig * ncv[e];
        }
        float acc[PLE_EPT];
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            const int d = d0 + e * nth;
            acc[e] = 0.0f;
            wv[e] = d < D ? norm_w[ch0 + d] : 0.0f;  // the read's norm, loaded with the taps
        }
#pragma unroll 1
        for (int k0 = 0; k0 < Kc; k0 += PLE_TAPS) {
            float x[PLE_TAPS][PLE_EPT], cw[PLE_TAPS][PLE_EPT];  // the chunk's loads before its first product
#pragma unroll
            for (int i = 0; i < PLE_TAPS; ++i) {
                const int k = k0 + i, tp = t - (Kc - 1 - k) * dil;  // the tap's window row
                const bool tap = k < Kc, own = tp == t;
                const float* row = tp < 0 ? history + (i64)(Hh + tp) * CD : normed + (i64)tp * CD;
#pragma unroll
                for (int e = 0; e < PLE_EPT; ++e) {
                    const int d = d0 + e * nth;
                    const bool in = tap && d < D;
                    x[i][e] = in && !own ? __ldcg(row + ch0 + d) : 0.0f;
                    cw[i][e] = in ? conv_w[(ch0 + d) * Kc + k] : 0.0f;
                }
            }
#pragma unroll
            for (int i = 0; i < PLE_TAPS; ++i)
                if (k0 + i < Kc) {
                    const bool own = k0 + i == Kc - 1;
#pragma unroll
                    for (int e = 0; e < PLE_EPT; ++e) acc[e] += (own ? nv[e] : x[i][e]) * cw[i][e];
                }
        }
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            const int d = d0 + e * nth;
            if (d < D) {
                v[e] = v[e] + __fmul_rn(gate, vv[e]) + silu_f(acc[e]);
                r[d] = v[e];
            }
            ss += v[e] * v[e];  // 0 past D
        }
    }
    const float is = 1.0f / sqrtf(block_sum(ss, sh) / (float)D + eps);
    for (int pass = 0; pass < D; pass += span) {
        const int d0 = pass + threadIdx.x;
#pragma unroll
        for (int e = 0; e < PLE_EPT; ++e) {
            const int d = d0 + e * nth;
            if (d < D) xn[base + d] = ONE ? v[e] * is * wv[e] : r[d] * is * norm_w[ch0 + d];
        }
    }
    if (sync != nullptr && threadIdx.x == 0 && arrived == gridDim.x - 1) {  // every block has published and waited
        for (unsigned i = 0; i < gridDim.x; ++i) sync[1 + i] = 0u;
        sync[0] = 0u;
    }
}

#define PLE_MIX_NORM_ARGS                                                                                          \
    float *R, const float *__restrict__ bo, const float *__restrict__ parts, const float *__restrict__ route_w,   \
        const float *__restrict__ shared, int K, const float *__restrict__ inj_prev,                              \
        const float *__restrict__ key_raw, i64 ks, const float *__restrict__ value, i64 vs,                       \
        const float *__restrict__ norm_key, const float *__restrict__ norm_query,                                 \
        const float *__restrict__ norm_conv, const float *history, const float *__restrict__ conv_w, int Kc,      \
        int dil, float *normed, unsigned *sync, const float *__restrict__ norm_w, float *__restrict__ xn, int C,  \
        int D, float sqrt_D, float eps
#define PLE_MIX_NORM_PASS                                                                                          \
    R, bo, parts, route_w, shared, K, inj_prev, key_raw, ks, value, vs, norm_key, norm_query, norm_conv, history, \
        conv_w, Kc, dil, normed, sync, norm_w, xn, C, D, sqrt_D, eps
extern "C" __global__ void __launch_bounds__(PLE_NORM_THREADS) ple_mix_norm(PLE_MIX_NORM_ARGS) {
    pdl_begin();
    ple_mix_norm_body<true>(PLE_MIX_NORM_PASS);
}
extern "C" __global__ void __launch_bounds__(PLE_NORM_THREADS) ple_mix_norm_passes(PLE_MIX_NORM_ARGS) {
    pdl_begin();
    ple_mix_norm_body<false>(PLE_MIX_NORM_PASS);
}

// History commit: history <- rows [n_keep, n_keep + Hh) of [history | normed]. Thread per channel.
extern "C" __global__ void __launch_bounds__(PLE_BLOCK)
    ple_history_commit(float* history, const float* __restrict__ normed, int T, int Hh, int CD, int ld, int n_keep,
                       const int* n_keep_dev) {
    pdl_begin();
    rolling_commit(history, normed, T, Hh, CD, ld, n_keep, n_keep_dev);
}

// Predecessor commit: prev [n-1] <- the last n-1 of [prev | tokens[:n_keep]] (tokens [T]). One thread.
extern "C" __global__ void ple_prev_commit(i64* prev, const i64* __restrict__ tokens, int T, int n_prev, int n_keep,
                                           const int* n_keep_dev) {
    pdl_begin();
    if (blockIdx.x == 0 && threadIdx.x == 0)
        shift_commit_column(prev, tokens, n_prev, (i64)1, (i64)0, count_from(n_keep, n_keep_dev, T), (i64)1);
}
