// qsa_select.cuh: QSA block scores and a row's cell selection (ops.qsa.block_scores / select_cells), the parts of
// qsa.cu's qsa_mix that score the pooled blocks and select a row's cells.
//
// Legend: T window rows, Hi indexer heads, d indexer head dim, NB pooled block capacity, ratio cells per block,
// budget selected cells, keep = budget / ratio blocks, C = budget + ratio - 1 cell capacity per row.
//   a row at position pos sees n_cells = pos + 1 cells and n_blocks = n_cells / ratio completed blocks; scores
//   [T, NB]; cells [T, C] int32 ascending, -1 past the row's count (every word written); counts [T] int32
// The selection reproduces torch's CPU topk (ops/topk_ties.py): exact k-th value by radix select; if no tie
// straddles the k-th place the kept set is "score >= k-th", else one thread replays the library's selection.
#pragma once
#include "seq_common.cuh"
#include "topk_replay.cuh"

#define SEL_MAX_THREADS 512  // select_row's scan holds one int a thread

// Order-preserving uint32 image of a float (larger float -> larger key); -0 maps to +0 as numpy compares them.
// Integer compares are exact for denormals, which -ftz float compares would flush.
__device__ __forceinline__ u32 order_key(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) == 0) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// scores[t, b] = sum_h relu(q_idx[t, h] . pooled[b]) / sqrt_d for b < n_blocks(t), -inf for the rest of the
// warp's block b < NB (one warp a pooled block, lanes over d: coalesced reads of its key). sq: the row's query
// [Hi, d] in shared memory, made by the caller after kv (the block's key, up to SCORE_MAXR values a lane in
// registers) was issued, so their trips overlap; kb: the key (global, or shared for a block the window completes).
#define SCORE_MAXR 8  // d <= 32 * SCORE_MAXR key values a lane in registers (longer keys read on)
__device__ __forceinline__ void score_block(const float* sq, const float* kv, const float* __restrict__ kb,
                                            float* scores_row, int b, bool scored, int Hi, int d, float sqrt_d) {
    const int lane = threadIdx.x & (WARP - 1);
    if (!scored) {
        if (lane == 0) scores_row[b] = NEG_INF;
        return;
    }
    float acc = 0.0f;
    for (int h = 0; h < Hi; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int r = 0; r < SCORE_MAXR; ++r)
            if (lane + WARP * r < d) dot += sq[h * d + lane + WARP * r] * kv[r];
        for (int i = lane + WARP * SCORE_MAXR; i < d; i += WARP) dot += sq[h * d + i] * kb[i];
        acc += fmaxf(warp_sum(dot), 0.0f);  // every lane holds the head's dot
    }
    if (lane == 0) scores_row[b] = acc / sqrt_d;
}

// The row's cells out [C], ascending, from its n_blocks > keep completed blocks' scores row [n_blocks] (read
// through L2: other blocks of the launch wrote them): the cells of the `keep` best blocks, then the cells after
// the last completed block; returns their number (thread 0's value is the one written). key, ix, flag [NB]: the
// row's scratch (the replay permutes key/ix in place). Every thread of the block calls it. Not inlined: its
// registers stay out of qsa_mix's other roles (inlined, they spilled into the attention loop).
__device__ __noinline__ int select_row(const float* scores_row, int n_cells, int n_blocks, int keep, int ratio,
                           int* __restrict__ out, u32* key, int* ix, int* flag) {
    __shared__ u32 hist[256];
    __shared__ int scan[SEL_MAX_THREADS];
    __shared__ u32 s_prefix;
    __shared__ int s_need, s_above, s_equal;
    const int tid = threadIdx.x, nth = blockDim.x;
    for (int b = tid; b < n_blocks; b += nth) {
        key[b] = order_key(__ldcg(scores_row + b));
        ix[b] = b;
    }
    __syncthreads();
    if (keep > 0) {
        // Radix select, 8 bits a pass from the top: the keep-th largest key is `prefix` after four passes.
        u32 prefix = 0, mask = 0;
        int need = keep;  // rank still to find among keys matching prefix under mask
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += nth) hist[i] = 0;
            __syncthreads();
            for (int b = tid; b < n_blocks; b += nth)
                if ((key[b] & mask) == prefix) atomicAdd(&hist[(key[b] >> shift) & 255u], 1u);
            __syncthreads();
            if (tid == 0) {
                int cum = 0;
                for (int bin = 255; bin >= 0; --bin) {
                    const int c = (int)hist[bin];
                    if (cum + c >= need) {
                        s_prefix = prefix | ((u32)bin << shift);
                        s_need = need - cum;
                        break;
                    }
                    cum += c;
                }
                if (shift == 24) s_above = s_equal = 0;
            }
            __syncthreads();
            prefix = s_prefix;
            need = s_need;
            mask |= 255u << shift;
        }
        const u32 kth = prefix;
        int above = 0, equal = 0;
        for (int b = tid; b < n_blocks; b += nth) {
            above += key[b] > kth;
            equal += key[b] == kth;
        }
        atomicAdd(&s_above, above);
        atomicAdd(&s_equal, equal);
        __syncthreads();
        if (s_above + s_equal == keep) {  // no tie straddles the cut: keep every block >= the k-th
            for (int b = tid; b < n_blocks; b += nth) flag[b] = key[b] >= kth;
        } else {
            for (int b = tid; b < n_blocks; b += nth) flag[b] = 0;
            __syncthreads();
            if (tid == 0) {
                const TkPairs q{key, ix};
                tk_replay(q, n_blocks, keep);
                for (int i = 0; i < keep; ++i) flag[ix[i]] = 1;
            }
        }
    } else {
        for (int b = tid; b < n_blocks; b += nth) flag[b] = 0;
    }
    __syncthreads();
    // Emit the kept blocks' cells in ascending block order: a block-wide scan of the flags, chunk by chunk.
    int done = 0;
    for (int b0 = 0; b0 < n_blocks; b0 += nth) {
        const int b = b0 + tid;
        const int f = b < n_blocks ? flag[b] : 0;
        int total;
        const int before = block_exclusive_scan(f, scan, &total);
        if (f)
            for (int r = 0; r < ratio; ++r) out[(i64)(done + before) * ratio + r] = b * ratio + r;
        done += total;
    }
    const int tail0 = n_blocks * ratio, n_tail = n_cells - tail0;
    for (int i = tid; i < n_tail; i += nth) out[keep * ratio + i] = tail0 + i;
    return keep * ratio + n_tail;
}
