// qsa.cu: gated attention with QSA block selection over a verify window (strata_cli/ops/qsa.py), float32: a QSA
// layer's whole mixer after its projection GEMV in one launch (qsa_mix), the commit's indexer append
// (qsa_indexer_append) and a norm-rope of heads (qsa_norm_rope). Block scores and a row's cell selection are
// qsa_select.cuh's.
//
// Legend: T window rows, H query heads, Hk kv heads (rep = H / Hk query heads a kv head), Hi indexer heads, d head
// dim, di indexer head dim, n_rot rotated dims (NeoX pairs (i, i + n_rot/2)), N cells, NB pooled block capacity,
// ratio cells per block, keep = budget / ratio blocks, C selected-cell capacity per row.
//   positions [T] int32 absolute positions of the window rows (consecutive: row r is cell positions[0] + r)
//   cos_tab, sin_tab [P, n_rot] rope tables by absolute position (host float64 -> f32, ops.qsa.rope_tables)
//   k_cache, v_cache [N, Hk, d]; tail [ratio, di] raw indexer keys of the block being filled; pooled [NB, di]
#include "qsa_select.cuh"

#define QSA_BLOCK 128  // threads of a norm: qsa_norm_rope's and qsa_indexer_append's blocks, and the block a warp of
                       // qsa_mix plays when it norms a row (the same partial sums in the same order: the same bits)
#define QSA_VWARPS (QSA_BLOCK / WARP)
#define MIX_WARPS 16  // warps of a qsa_mix block: a head's cells are spread over them (latency, not bandwidth); a
                      // score block scores MIX_WARPS pooled blocks at a time, one a warp
#define MIX_THREADS (MIX_WARPS * WARP)
#define ATT_MAXR 8  // attention: d <= 32 * ATT_MAXR values per lane
#define MIX_WAIT_CYCLES (1ll << 34)  // the longest a row's attention waits for its selection (~10 s: only a broken
                                     // counter gets there; that row's output is then NaN, which the window flags)

__device__ __forceinline__ float rms_of(float ss, int n, float eps) { return sqrtf(ss / (float)n + eps); }

// Element i of rope_neox over the normed row y: the first n_rot dims turn with their partner i -+ n_rot / 2.
__device__ __forceinline__ float rope_at(const float* y, const float* cs, const float* sn, int i, int n_rot) {
    const int half = n_rot / 2;
    float val = y[i];
    if (i < n_rot) val = y[i] * cs[i] + (i < half ? -y[i + half] : y[i - half]) * sn[i];
    return val;
}

// dst[0..d) = rope_row(rms_norm(src[0..d)) * w) with cs, sn = row's cos/sin [n_rot]; one block of QSA_BLOCK
// threads, y shared d floats (qsa_norm_rope).
__device__ __forceinline__ void norm_rope_head(const float* __restrict__ src, const float* __restrict__ w,
                                               const float* __restrict__ cs, const float* __restrict__ sn,
                                               float* __restrict__ dst, int d, int n_rot, float eps, float* sh,
                                               float* y) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss, sh);
    const float rms = rms_of(ss, d, eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[i] = src[i] / rms * w[i];
    __syncthreads();  // rotation reads the partner element of another thread
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = rope_at(y, cs, sn, i, n_rot);
}

// block_sum over a block of QSA_BLOCK threads, computed by one warp: part[v] is the partial sum of the block's
// thread 32 v + lane; each is reduced as that thread's warp reduces it, then lane v holds warp v's sum and the
// lanes add them as block_reduce's warp 0 does (lanes past them the identity): the block's bits.
__device__ __forceinline__ float block_sum_of_warp(const float (&part)[QSA_VWARPS]) {
    const int lane = threadIdx.x & (WARP - 1);
    float mine = 0.0f;
#pragma unroll
    for (int v = 0; v < QSA_VWARPS; ++v) {
        const float s = warp_sum(part[v]);
        if (lane == v) mine = s;
    }
    return warp_sum(mine);
}

// norm_rope_head of one row by one warp, with the bits of a QSA_BLOCK-thread block: y is the warp's scratch of d
// floats (shared), dst may be shared or global.
__device__ __forceinline__ void norm_rope_warp(const float* __restrict__ src, const float* __restrict__ w,
                                               const float* __restrict__ cs, const float* __restrict__ sn, float* dst,
                                               int d, int n_rot, float eps, float* y) {
    const int lane = threadIdx.x & (WARP - 1);
    float part[QSA_VWARPS];
#pragma unroll
    for (int v = 0; v < QSA_VWARPS; ++v) {
        part[v] = 0.0f;
        for (int i = lane + WARP * v; i < d; i += QSA_BLOCK) part[v] += src[i] * src[i];
    }
    const float rms = rms_of(block_sum_of_warp(part), d, eps);
    for (int i = lane; i < d; i += WARP) y[i] = src[i] / rms * w[i];
    __syncwarp();  // rotation reads the partner element of another lane
    for (int i = lane; i < d; i += WARP) dst[i] = rope_at(y, cs, sn, i, n_rot);
    __syncwarp();  // y is the warp's next row's scratch
}

// The pooled key of block b completed inside a window whose first row is cell p0, by one warp: the mean of cell
// b*ratio + s's raw key (s ascending; cells before p0 from the committed tail's slot s, the window's from its key rows
// ik [T, d], row stride iks), rms-normed with k_norm_w and rotated at cell b*ratio: indexer_append_block's arithmetic
// (the same bits as its QSA_BLOCK threads), nothing written but dst. y: the warp's scratch of d floats.
__device__ __forceinline__ void pool_block_warp(const float* __restrict__ tail, const float* __restrict__ ik, i64 iks,
                                                int p0, i64 b, int ratio, const float* __restrict__ k_norm_w,
                                                const float* __restrict__ cos_tab, const float* __restrict__ sin_tab,
                                                float* dst, int d, int n_rot, float eps, float* y) {
    const int lane = threadIdx.x & (WARP - 1);
    float part[QSA_VWARPS];
#pragma unroll
    for (int v = 0; v < QSA_VWARPS; ++v) {
        part[v] = 0.0f;
        for (int i = lane + WARP * v; i < d; i += QSA_BLOCK) {
            float m = 0.0f;
            for (int s = 0; s < ratio; ++s) {
                const i64 cell = b * ratio + s;
                m += cell < p0 ? tail[(i64)s * d + i] : ik[(cell - p0) * iks + i];  // row order, as the mean
            }
            m = m / (float)ratio;
            y[i] = m;
            part[v] += m * m;
        }
    }
    const float rms = rms_of(block_sum_of_warp(part), d, eps);
    for (int i = lane; i < d; i += WARP) y[i] = y[i] / rms * k_norm_w[i];  // the columns this lane wrote
    __syncwarp();
    const float* cs = cos_tab + b * ratio * n_rot;
    const float* sn = sin_tab + b * ratio * n_rot;
    for (int i = lane; i < d; i += WARP) dst[i] = rope_at(y, cs, sn, i, n_rot);
    __syncwarp();
}

// out[t, h] = rope_{row}(rms_norm(x[t, h]) * w), row = rows ? rows[t] : t (rows = positions with full tables).
// x row (t, h) starts at x + t*xs_t + h*xs_h with d contiguous values (q is the first half of attn_q's heads).
// grid T*H, block QSA_BLOCK, dynamic shared d floats.
extern "C" __global__ void __launch_bounds__(QSA_BLOCK)
    qsa_norm_rope(const float* __restrict__ x, i64 xs_t, i64 xs_h, const float* __restrict__ w,
                  const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ rows,
                  float* __restrict__ out, int H, int d, int n_rot, float eps) {
    pdl_begin();
    __shared__ float sh[WARP];
    extern __shared__ float y[];
    const i64 t = blockIdx.x / H, h = blockIdx.x % H;
    const i64 row = rows ? rows[t] : t;
    norm_rope_head(x + t * xs_t + h * xs_h, w, cos_tab + row * n_rot, sin_tab + row * n_rot, out + (t * H + h) * d,
                   d, n_rot, eps, sh, y);
}

// The commit's indexer append: the first n = count_from(n_rows, n_dev, T) raw keys raw [T, d] appended at
// positions[r], in order, to the tail and pooled blocks in place: tail[pos % ratio] = key; when pos completes block
// b = pos / ratio, pooled[b] = rope_{b*ratio}(rms_norm(mean of tail) * k_norm_w). Rows are sequential: a completion
// reads the slots earlier rows wrote; column i of tail is always touched by thread i % blockDim.x. (A window never
// writes the tail: qsa_mix pools the blocks it completes itself, pool_block_warp, with this arithmetic.)
// One block of QSA_BLOCK threads, dynamic shared d floats.
extern "C" __global__ void __launch_bounds__(QSA_BLOCK)
    qsa_indexer_append(float* tail, float* __restrict__ pooled, const float* __restrict__ raw,
                       const int* __restrict__ positions, int T, int n_rows, const int* n_dev,
                       const float* __restrict__ k_norm_w, const float* __restrict__ cos_tab,
                       const float* __restrict__ sin_tab, int ratio, int d, int n_rot, float eps) {
    pdl_begin();
    __shared__ float sh[WARP];
    extern __shared__ float y[];
    const int tid = threadIdx.x, nth = blockDim.x, n = count_from(n_rows, n_dev, T);
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
        const float rms = rms_of(ss, d, eps);
        for (int i = tid; i < d; i += nth) y[i] = y[i] / rms * k_norm_w[i];
        __syncthreads();  // rotation reads the partner element
        const float* cs = cos_tab + b * ratio * n_rot;
        const float* sn = sin_tab + b * ratio * n_rot;
        for (int i = tid; i < d; i += nth) pooled[b * d + i] = rope_at(y, cs, sn, i, n_rot);
        __syncthreads();  // y is rewritten by the next completion
    }
}

// ---- qsa_mix: the window's k/v cache rows, norms and ropes, pooled blocks, scores, selection and attention

// qsa_mix's operands (its parameters, gathered for the roles' functions). Views of the layer's GEMV rows: k head j
// of row t at k + t*ks + j*d (v: vs), q head h at q + t*qs + h*qh, its gate at gate + t*gs + h*gh, indexer query
// head at qr + t*is + head*di, indexer key at ik + t*iks. Selection scratch [T, NB] scores / keys / idx / flags,
// cells [T, C], counts [T]; done, ready, seen [T] counters, zero between launches.
struct MixArgs {
    const float *k, *v, *q, *gate;
    i64 ks, vs, qs, qh, gs, gh;
    const float *k_w, *q_w;
    float *k_cache, *v_cache;
    const float *cos_tab, *sin_tab;
    const int* positions;
    float* out;
    int T, H, Hk, d, n_rot;
    float eps, sqrt_d;
    const float* qr;
    i64 is;
    const float *qi_w, *ik;
    i64 iks;
    const float *ik_w, *tail, *pooled;
    float* idx_raw;
    int Hi, di, ratio, keep, NB, C, SY;
    float sqrt_di;
    float* scores;
    int *cells, *counts;
    u32* keys;
    int *idx, *flags;
    unsigned* done;
    int *ready, *seen;
};

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// One cell of a warp's online softmax (qsa_mix's attention): score q . k / sqrt_d (every lane gets it), then
// (m, l, acc) rescaled and the cell's value added; lane holds dims lane + 32 r. kr, vr: the cell's key and value.
__device__ __forceinline__ void attend_cell(const float* sq, const float* kr, const float* __restrict__ vr, int d,
                                            float sqrt_d, float& m, float& l, float (&acc)[ATT_MAXR]) {
    const int lane = threadIdx.x & (WARP - 1);
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

// Thread 0 of a selected row's attention block: waits for the row's cells (ready[t], raised by the row's last score
// block once they are written), then counts itself out (the row's H-th block puts ready and seen back to zero for
// the next launch) and returns counts[t]; -1 if MIX_WAIT_CYCLES pass first.
__device__ __forceinline__ int wait_cells(const MixArgs& a, int t) {
    const long long t0 = clock64();
    while (load_acquire(a.ready + t) == 0) {
        if (clock64() - t0 > MIX_WAIT_CYCLES) return -1;
        __nanosleep(128);
    }
    if (atomicAdd(a.seen + t, 1) == a.H - 1) {
        atomicExch(a.seen + t, 0);
        atomicExch(a.ready + t, 0);
    }
    return __ldcg(a.counts + t);
}

// Attention role (t, h): out[t, h*d:(h+1)*d] = sigmoid(gate[t, h]) * softmax_s(qn . k_s / sqrt_d) v_s over the row's
// cells s (cells[t, :counts[t]] where the row is above the budget, else every cell 0..positions[t]), query head h
// reading kv head h / rep; qn = rope(rms_norm(q[t, h]) * q_w). The window's own cells (rows 0..t) take their keys
// rope(rms_norm(k[r]) * k_w), normed here, and their values from the GEMV's v rows; the earlier cells the caches'.
// The first query head of each kv head also writes the row's cache cell (k normed and roped, v), which later windows
// read, and head 0 the row's raw indexer key into idx_raw (the commit re-appends it).
// Warp w takes the cells w, w + MIX_WARPS, ... with an online softmax, then the warps' (max, sum, acc) are merged
// in warp order. Shared: sq [d], wm, wl [MIX_WARPS], kwin [T, d], wacc [MIX_WARPS, d] (each warp's norm scratch first).
__device__ __forceinline__ void mix_attend(const MixArgs& a, int t, int h, float* sm) {
    const int tid = threadIdx.x, lane = tid & (WARP - 1), w = tid / WARP, d = a.d, rep = a.H / a.Hk, kvh = h / rep;
    float* sq = sm;
    float* wm = sq + d;
    float* wl = wm + MIX_WARPS;
    float* kwin = wl + MIX_WARPS;
    float* wacc = kwin + (i64)a.T * d;
    const int p0 = a.positions[0];
    const i64 pt = a.positions[t];
    for (int item = w; item <= t + 1; item += MIX_WARPS) {  // item 0 the query head, 1 + r the window's key row r
        const int r = item == 0 ? t : item - 1;
        const i64 pr = a.positions[r];
        const float* src = item == 0 ? a.q + t * a.qs + h * a.qh : a.k + r * a.ks + (i64)kvh * d;
        norm_rope_warp(src, item == 0 ? a.q_w : a.k_w, a.cos_tab + pr * a.n_rot, a.sin_tab + pr * a.n_rot,
                       item == 0 ? sq : kwin + (i64)r * d, d, a.n_rot, a.eps, wacc + w * d);
    }
    __syncthreads();
    if (h % rep == 0) {  // the row's cache cell of kv head kvh (no block of this launch reads it)
        float* kc = a.k_cache + (pt * a.Hk + kvh) * d;
        float* vc = a.v_cache + (pt * a.Hk + kvh) * d;
        const float* vr = a.v + t * a.vs + (i64)kvh * d;
        for (int i = tid; i < d; i += blockDim.x) {
            kc[i] = kwin[(i64)t * d + i];
            vc[i] = vr[i];
        }
    }
    if (h == 0 && a.idx_raw)
        for (int i = tid; i < a.di; i += blockDim.x) a.idx_raw[(i64)t * a.di + i] = a.ik[t * a.iks + i];
    int count = (int)pt + 1;
    const int* cells = nullptr;
    if (a.ratio && count / a.ratio > a.keep) {  // above the budget: the row's last score block selects its cells
        __shared__ int s_count;
        if (tid == 0) s_count = wait_cells(a, t);
        __syncthreads();
        count = s_count;
        if (count < 0) {
            for (int i = tid; i < d; i += blockDim.x) a.out[(t * a.H + h) * d + i] = QNAN;
            return;
        }
        cells = a.cells + t * a.C;
    }
    float m = NEG_INF, l = 0.0f, acc[ATT_MAXR];
#pragma unroll
    for (int r = 0; r < ATT_MAXR; ++r) acc[r] = 0.0f;
    // cells ascend, so a warp's cells of earlier windows (in the caches) come before the window's own
    int s = w;
    for (; s < count; s += MIX_WARPS) {
        const i64 cell = cells ? __ldcg(cells + s) : s;  // L2: the selecting block wrote them
        if (cell >= p0) break;
        attend_cell(sq, a.k_cache + (cell * a.Hk + kvh) * d, a.v_cache + (cell * a.Hk + kvh) * d, d, a.sqrt_d, m, l,
                    acc);
    }
    for (; s < count; s += MIX_WARPS) {
        const i64 r = (cells ? __ldcg(cells + s) : s) - p0;
        attend_cell(sq, kwin + r * d, a.v + r * a.vs + (i64)kvh * d, d, a.sqrt_d, m, l, acc);
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
    for (int i = 0; i < MIX_WARPS; ++i) M = fmaxf(M, wm[i]);
    float L = 0.0f;
    for (int i = 0; i < MIX_WARPS; ++i) L += wl[i] * expf(wm[i] - M);  // a warp without cells adds 0
    const float* gr = a.gate + t * a.gs + (i64)h * a.gh;
    for (int i = tid; i < d; i += blockDim.x) {
        float acc_i = 0.0f;
        for (int j = 0; j < MIX_WARPS; ++j) acc_i += wacc[j * d + i] * expf(wm[j] - M);
        a.out[(t * a.H + h) * d + i] = acc_i / L * sigmoid_f(gr[i]);
    }
}

// Score role (t, y) of a row above the budget: scores[t, b] = sum_h relu(qi[t, h] . pooled_b) / sqrt_di for its
// pooled blocks b < n_blocks (qi = rope(rms_norm(qr[t, h]) * qi_w), normed here), -inf for b < NB past them, over
// the chunks y, y + SY, ... of MIX_WARPS blocks (warp w block c * MIX_WARPS + w). A block completed before the
// window is read from pooled, one completed inside it is pooled here (pool_block_warp) by the score block whose
// chunk holds it. The row's last score block to finish (a fenced counter) selects its cells from the scores the
// others wrote (select_row), writes cells and counts, then raises ready[t] for the row's attention blocks.
// Shared: sq [Hi, di], wpool [T, di] (window block wb0 + j), scratch [MIX_WARPS, di].
__device__ __forceinline__ void mix_score(const MixArgs& a, int t, int y, float* sm) {
    const int tid = threadIdx.x, lane = tid & (WARP - 1), w = tid / WARP, di = a.di, ratio = a.ratio;
    const int n_cells = a.positions[t] + 1, n_blocks = n_cells / ratio;
    if (n_blocks <= a.keep) return;  // below the budget every cell is kept: no scores, no block waits for them
    const int p0 = a.positions[0], wb0 = p0 / ratio;  // blocks [wb0, n_blocks) complete inside the window
    float* sq = sm;
    float* wpool = sq + a.Hi * di;
    float* scratch = wpool + (i64)a.T * di;
    const int b0 = y * MIX_WARPS + w;
    const bool early = b0 < a.NB && b0 < n_blocks && b0 < wb0;  // a key of pooled: issued before the norms
    float kv[SCORE_MAXR];
#pragma unroll
    for (int r = 0; r < SCORE_MAXR; ++r)
        kv[r] = early && lane + WARP * r < di ? a.pooled[(i64)b0 * di + lane + WARP * r] : 0.0f;
    const i64 pt = a.positions[t];
    for (int item = w; item < a.Hi + n_blocks - wb0; item += MIX_WARPS) {  // the query heads, then window blocks
        if (item < a.Hi) {
            norm_rope_warp(a.qr + t * a.is + (i64)item * di, a.qi_w, a.cos_tab + pt * a.n_rot,
                           a.sin_tab + pt * a.n_rot, sq + item * di, di, a.n_rot, a.eps, scratch + w * di);
            continue;
        }
        const int b = wb0 + item - a.Hi;
        if ((b / MIX_WARPS) % a.SY != y) continue;  // another score block's chunk
        pool_block_warp(a.tail, a.ik, a.iks, p0, b, ratio, a.ik_w, a.cos_tab, a.sin_tab, wpool + (i64)(b - wb0) * di,
                        di, a.n_rot, a.eps, scratch + w * di);
    }
    __syncthreads();
    float* scores_row = a.scores + t * a.NB;
    const int n_chunks = (a.NB + MIX_WARPS - 1) / MIX_WARPS;
    for (int c = y; c < n_chunks; c += a.SY) {
        const int b = c * MIX_WARPS + w;
        if (b >= a.NB) break;  // uniform per warp
        const bool scored = b < n_blocks;
        const float* kb = b < wb0 ? a.pooled + (i64)b * di : wpool + (i64)(b - wb0) * di;
        if (c != y || !early)
#pragma unroll
            for (int r = 0; r < SCORE_MAXR; ++r) kv[r] = scored && lane + WARP * r < di ? kb[lane + WARP * r] : 0.0f;
        score_block(sq, kv, kb, scores_row, b, scored, a.Hi, di, a.sqrt_di);
    }
    if (!arrived_last(a.done + t, a.SY)) return;
    int* out = a.cells + t * a.C;
    const int count = select_row(scores_row, n_cells, n_blocks, a.keep, ratio, out, a.keys + t * a.NB,
                                 a.idx + t * a.NB, a.flags + t * a.NB);
    for (int i = count + tid; i < a.C; i += blockDim.x) out[i] = -1;
    if (tid == 0) a.counts[t] = count;
    __threadfence();  // the cells reach L2 before the flag does
    __syncthreads();
    if (tid == 0) atomicExch(a.ready + t, 1);
}

// A QSA layer's window after its one projection GEMV, in one launch (ops/qsa.qsa_mix): out [T, H*d] as mix_attend
// says, over the cells mix_score selects; the window's rows' k/v cache cells written, their raw indexer keys copied
// to idx_raw (null: ik already is idx_raw's rows, or no indexer). Nothing else is written but scratch: the tail,
// pooled and every committed cell are only read (a window never writes carried state; the commit appends the kept
// keys, qsa_indexer_append). ratio 0: no indexer, every row attends to every cell (the indexer pointers unused).
// Roles: score (t, y) for y < SY (ratio > 0), then attention (t, h); grid T*SY + T*H, block MIX_THREADS, dynamic
// shared max((2 + T + MIX_WARPS) d + 2 MIX_WARPS, (Hi + T + MIX_WARPS) di) floats.
// Without a row above the budget no block waits: the attention roles are blocks 0..T*H-1 and the rest return. With
// one, a row's attention waits for its cells, and each block takes its role from a ticket drawn when it starts
// (ticket, zero between launches): the score roles are the first drawn, so a waiting block waits only on blocks
// that are already running or done and never wait themselves. No block counts on others being resident with it
// (another stream's kernels may hold the SMs); every counter is back at zero when the launch ends, so graph
// replays find them so.
extern "C" __global__ void __launch_bounds__(MIX_THREADS, 2)
    qsa_mix(const float* __restrict__ k, i64 ks, const float* __restrict__ v, i64 vs, const float* __restrict__ q,
            i64 qs, i64 qh, const float* __restrict__ gate, i64 gs, i64 gh, const float* __restrict__ k_w,
            const float* __restrict__ q_w, float* k_cache, float* v_cache, const float* __restrict__ cos_tab,
            const float* __restrict__ sin_tab, const int* __restrict__ positions, float* __restrict__ out, int T,
            int H, int Hk, int d, int n_rot, float eps, float sqrt_d, const float* __restrict__ qr, i64 is,
            const float* __restrict__ qi_w, const float* __restrict__ ik, i64 iks, const float* __restrict__ ik_w,
            const float* __restrict__ tail, const float* __restrict__ pooled, float* __restrict__ idx_raw, int Hi,
            int di, int ratio, int budget, int NB, int C, int SY, float sqrt_di, float* scores, int* cells,
            int* counts, u32* keys, int* idx, int* flags, int* done, int* ready, int* seen, int* ticket) {
    pdl_begin();
    extern __shared__ float sm[];
    __shared__ int s_role;
    const int keep = ratio ? budget / ratio : 0;
    const MixArgs a{k, v, q, gate, ks, vs, qs, qh, gs, gh, k_w, q_w, k_cache, v_cache, cos_tab, sin_tab, positions,
                    out, T, H, Hk, d, n_rot, eps, sqrt_d, qr, is, qi_w, ik, iks, ik_w, tail, pooled, idx_raw, Hi, di,
                    ratio, keep, NB, C, SY, sqrt_di, scores, cells, counts, keys, idx, flags, (unsigned*)done, ready,
                    seen};
    const int S = ratio ? T * SY : 0;
    int role;
    if (ratio && (positions[T - 1] + 1) / ratio > keep) {  // a row above the budget (the last has the most blocks)
        if (threadIdx.x == 0) {
            const int r = atomicAdd(ticket, 1);
            if (r == (int)gridDim.x - 1) atomicExch(ticket, 0);  // every block has drawn
            s_role = r;
        }
        __syncthreads();
        role = s_role;
    } else {
        if (blockIdx.x >= T * H) return;  // no row scores
        role = S + blockIdx.x;
    }
    if (role < S)
        mix_score(a, role / SY, role % SY, sm);
    else
        mix_attend(a, (role - S) / H, (role - S) % H, sm);
}
