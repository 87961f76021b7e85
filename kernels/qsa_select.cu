// qsa_select.cu: QSA block scores and the per-row cell selection (ops.qsa.block_scores / select_cells).
//
// Legend: T window rows, Hi indexer heads, d indexer head dim, NB pooled block capacity, ratio cells per block,
// budget selected cells, keep = budget / ratio blocks, C = budget + ratio - 1 cell capacity per row.
//   positions [T] int32; a row at position pos sees n_cells = pos + 1 cells and n_blocks = n_cells / ratio
//   completed blocks; scores [T, NB]; cells [T, C] int32 ascending, counts [T] int32
// The selection reproduces torch's CPU topk (ops/topk_ties.py): exact k-th value by radix select; if no tie
// straddles the k-th place the kept set is "score >= k-th", else one thread replays the library's selection.
#include "seq_common.cuh"
#include "topk_replay.cuh"

#define SEL_BLOCK 256

// Order-preserving uint32 image of a float (larger float -> larger key); -0 maps to +0 as numpy compares them.
// Integer compares are exact for denormals, which -ftz float compares would flush.
__device__ __forceinline__ u32 order_key(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) == 0) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// scores[t, b] = sum_h relu(q_idx[t, h] . pooled[b]) / sqrt_d for b < n_blocks(t), -inf for the rest.
// q_idx [T, Hi, d] (normed, rotated); pooled [NB, d]. grid (T, ceil(NB / (SEL_BLOCK / 32))), block SEL_BLOCK:
// one warp per pooled block, lanes over d (coalesced reads of the block's key), dynamic shared Hi*d floats.
// The row's position and the block's key (up to SCORE_MAXR values a lane, in registers) are loaded before the
// query's barrier, so their trips overlap the query's. Latency at T = 1: 1 round trip (was 3: the query, then the
// position, then the key), 1 barrier, Hi warp_sums; the same sums in the same order.
#define SCORE_MAXR 8  // d <= 32 * SCORE_MAXR key values a lane in registers (longer keys read on)
extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    qsa_block_scores(const float* __restrict__ q_idx, const float* __restrict__ pooled,
                     const int* __restrict__ positions, float* __restrict__ scores, int Hi, int d, int NB, int ratio,
                     float sqrt_d) {
    extern __shared__ float sq[];
    const i64 t = blockIdx.x;
    const int lane = threadIdx.x & (WARP - 1);
    const int b = blockIdx.y * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int n_blocks = (positions[t] + 1) / ratio;
    const bool scored = b < NB && b < n_blocks;  // uniform per warp
    const float* kb = pooled + (i64)b * d;
    float kv[SCORE_MAXR];
#pragma unroll
    for (int r = 0; r < SCORE_MAXR; ++r) kv[r] = scored && lane + WARP * r < d ? kb[lane + WARP * r] : 0.0f;
    for (int i = threadIdx.x; i < Hi * d; i += blockDim.x) sq[i] = q_idx[t * Hi * d + i];
    __syncthreads();
    if (b >= NB) return;  // whole warps leave; no barrier follows
    if (!scored) {
        if (lane == 0) scores[t * NB + b] = NEG_INF;
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
    if (lane == 0) scores[t * NB + b] = acc / sqrt_d;
}

// cells[t] = the cells row t attends to, ascending: every cell when n_blocks <= keep, else the cells of the
// `keep` best completed blocks then the cells after the last completed block. counts[t] = their number.
// keys, idx, flags [T, NB]: scratch (the replay permutes keys/idx in place). grid T, block SEL_BLOCK.
extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    qsa_select(const float* __restrict__ scores, const int* __restrict__ positions, int* __restrict__ cells,
               int* __restrict__ counts, u32* keys, int* idx, int* flags, int NB, int C, int ratio, int budget) {
    __shared__ u32 hist[256];
    __shared__ int scan[SEL_BLOCK];
    __shared__ u32 s_prefix;
    __shared__ int s_need, s_above, s_equal;
    const int tid = threadIdx.x, nth = blockDim.x;
    const i64 t = blockIdx.x;
    const int n_cells = positions[t] + 1, n_blocks = n_cells / ratio, keep = budget / ratio;
    int* out = cells + t * C;
    if (n_blocks <= keep) {  // below the budget every cell is kept (uniform per block)
        for (int i = tid; i < n_cells; i += nth) out[i] = i;
        if (tid == 0) counts[t] = n_cells;
        return;
    }
    u32* key = keys + t * NB;
    int* ix = idx + t * NB;
    int* flag = flags + t * NB;
    for (int b = tid; b < n_blocks; b += nth) {
        key[b] = order_key(scores[t * NB + b]);
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
    if (tid == 0) counts[t] = keep * ratio + n_tail;
}
