// qsa_select.cu: QSA block scores and the per-row cell selection, one launch (ops.qsa.block_scores / select_cells).
//
// Legend: T window rows, Hi indexer heads, d indexer head dim, NB pooled block capacity, ratio cells per block,
// budget selected cells, keep = budget / ratio blocks, C = budget + ratio - 1 cell capacity per row.
//   positions [T] int32; a row at position pos sees n_cells = pos + 1 cells and n_blocks = n_cells / ratio
//   completed blocks; scores [T, NB]; cells [T, C] int32 ascending, -1 past the row's count (every word written, so a
//   replay leaves no word of an earlier window); counts [T] int32
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

// scores[t, b] = sum_h relu(q_idx[t, h] . pooled[b]) / sqrt_d for b < n_blocks(t), -inf for the rest of the
// warp's block b < NB (one warp a pooled block, lanes over d: coalesced reads of its key). sq: the row's query
// [Hi, d] in shared memory, loaded by the caller after kv (the block's key, up to SCORE_MAXR values a lane in
// registers) was issued, so their trips overlap: 1 round trip, 1 barrier, Hi warp_sums at T = 1.
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
// row's scratch (the replay permutes key/ix in place). Every thread of the block calls it.
__device__ int select_row(const float* scores_row, int n_cells, int n_blocks, int keep, int ratio,
                           int* __restrict__ out, u32* key, int* ix, int* flag) {
    __shared__ u32 hist[256];
    __shared__ int scan[SEL_BLOCK];
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

// Scores and selection of each window row in one launch (ops.qsa.block_scores, then select_cells):
//   scores [T, NB] as above; cells[t] = the cells row t attends to, ascending: every cell when n_blocks <= keep,
//   else select_row's; counts[t] = their number.
// q_idx [T, Hi, d] (normed, rotated); pooled [NB, d]; keys, idx, flags [T, NB] scratch; done [T] int32 zero
// before the launch and zero after it (the last block of a row puts it back: graph replays reuse it).
// grid (T, ceil(NB / (SEL_BLOCK / 32))), block SEL_BLOCK, dynamic shared Hi*d floats. Every block scores its
// warps' blocks; below the budget block y = 0 emits the row's cells (no scores read); above it the row's last
// block to finish (a fenced counter, the CUDA threadFenceReduction pattern) selects from the scores the others
// wrote, so the selection is select_cells' on the launch's own scores, exactly.
extern "C" __global__ void __launch_bounds__(SEL_BLOCK)
    qsa_score_select(const float* __restrict__ q_idx, const float* __restrict__ pooled,
                     const int* __restrict__ positions, float* scores, int* __restrict__ cells,
                     int* __restrict__ counts, u32* keys, int* idx, int* flags, int* done, int Hi, int d, int NB,
                     int C, int ratio, int budget, float sqrt_d) {
    extern __shared__ float sq[];
    __shared__ int s_last;
    const i64 t = blockIdx.x;
    const int lane = threadIdx.x & (WARP - 1), tid = threadIdx.x, nth = blockDim.x;
    const int b = blockIdx.y * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int n_cells = positions[t] + 1, n_blocks = n_cells / ratio, keep = budget / ratio;
    const bool scored = b < NB && b < n_blocks;  // uniform per warp
    const float* kb = pooled + (i64)b * d;
    float kv[SCORE_MAXR];
#pragma unroll
    for (int r = 0; r < SCORE_MAXR; ++r) kv[r] = scored && lane + WARP * r < d ? kb[lane + WARP * r] : 0.0f;
    for (int i = tid; i < Hi * d; i += nth) sq[i] = q_idx[t * Hi * d + i];
    __syncthreads();
    float* scores_row = scores + t * NB;
    if (b < NB) score_block(sq, kv, kb, scores_row, b, scored, Hi, d, sqrt_d);
    int* out = cells + t * C;
    if (n_blocks <= keep) {  // below the budget every cell is kept (uniform per row): no scores needed
        if (blockIdx.y != 0) return;
        for (int i = tid; i < C; i += nth) out[i] = i < n_cells ? i : -1;
        if (tid == 0) counts[t] = n_cells;
        return;
    }
    __threadfence();  // this block's scores reach L2 before its count does
    __syncthreads();
    if (tid == 0) {
        s_last = atomicAdd(done + t, 1) == (int)gridDim.y - 1;
        if (s_last) done[t] = 0;  // every other block of the row has counted
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const int count = select_row(scores_row, n_cells, n_blocks, keep, ratio, out, keys + t * NB, idx + t * NB,
                                 flags + t * NB);
    for (int i = count + tid; i < C; i += nth) out[i] = -1;
    if (tid == 0) counts[t] = count;
}
