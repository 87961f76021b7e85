// moe.cu: softmax top-k router and the weighted combine of routed expert outputs (strata_cli/ops/moe.py).
// The expert projections are gemv.cu / gemv_quant.cu launches over moe_group's groups of the J = T*K entries
// (gemv_expert_*, gemv_expert_q8r_*, qtc_expert_*; for block types h is one qtc_gateup_* launch reading gate and up
// together):
//   h     = silu(W_gate[e] . x[t]) * (W_up[e] . x[t])    [J, F]
//   parts = W_down[e] . h[j]                             [J, D]
//   out   = moe_combine(parts, w, shared)                [T, D]
// Legend: T window rows, E experts, K experts per row (<= 16), F expert width, D hidden.
#include "common.cuh"

#define ROUTER_MAXK 16

// logits [T, E] f32 -> ids [T, K] int32 (descending probability, ties -> lower id), w [T, K] f32 summing to 1.
// grid T, block 256, dynamic shared memory max(E, T*K + blockDim.x) floats. Mirrors numpy: p = exp(z - max) / sum,
// select on p. g_expert != null: the block counted last in done[0] (a zeroed counter it resets) also groups the
// J = T*K entries by expert into g_expert / g_count / g_entries, as moe_group does (J <= blockDim.x), so the routed
// experts need no grouping launch of their own. sg_w != null: block t also writes the shared expert's scalar gate
// sg[t] = sigmoid(sg_w . x[t]) (sg_w one raw row of n_in values, type sg_type, read by raw_at; x [T, n_in]).
extern "C" __global__ void __launch_bounds__(1024)
    router_topk(const float* __restrict__ logits, int E, int K, int* ids, float* __restrict__ w,
                int* __restrict__ g_expert, int* __restrict__ g_count, int* __restrict__ g_entries, int max_rows,
                unsigned* done, const float* __restrict__ x, int n_in, const u8* __restrict__ sg_w, int sg_type,
                float* __restrict__ sg) {
    pdl_begin();
    extern __shared__ float p[];
    __shared__ float shv[WARP];
    __shared__ int shi[WARP];
    __shared__ float top_p[ROUTER_MAXK];
    const float* z = logits + (i64)blockIdx.x * E;
    if (sg_w != nullptr) {  // uniform per launch: every thread meets the barriers of block_sum
        const float* xt = x + (i64)blockIdx.x * n_in;
        float acc = 0.0f;
        for (int i = threadIdx.x; i < n_in; i += blockDim.x) acc += raw_at(sg_w, sg_type, i) * xt[i];
        acc = block_sum(acc, shv);
        if (threadIdx.x == 0) sg[blockIdx.x] = sigmoid_f(acc);
    }

    float m = NEG_INF;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, z[e]);
    m = block_max(m, shv);
    float s = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        p[e] = expf(z[e] - m);
        s += p[e];
    }
    s = block_sum(s, shv);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = p[e] / s;  // each thread touches only its own e
    __syncthreads();

    // K rounds of block argmax; a taken expert is set to -1 (probabilities are >= 0, so it never wins again).
    for (int k = 0; k < K; ++k) {
        float bv = NEG_INF;
        int bi = BIG_ID;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (arg_better(p[e], e, bv, bi)) { bv = p[e]; bi = e; }
        block_argmax(bv, bi, shv, shi);  // ends with a barrier, so every thread has read p before the write below
        if (threadIdx.x == 0) {
            ids[(i64)blockIdx.x * K + k] = bi;
            top_p[k] = bv;
            p[bi] = -1.0f;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += top_p[k];
        for (int k = 0; k < K; ++k) w[(i64)blockIdx.x * K + k] = top_p[k] / sum;
    }
    if (g_expert == nullptr || !arrived_last(done, gridDim.x)) return;  // the ids of every block, then grouped
    const int J = (int)gridDim.x * K;
    int* sid = reinterpret_cast<int*>(p);  // p is no longer read: the ids, then group_by_key's leader flags
    for (int j = threadIdx.x; j < J; j += blockDim.x) sid[j] = __ldcg(ids + j);  // L2: other blocks wrote them
    __syncthreads();
    group_by_key(sid, sid + J, 0, J, max_rows, false, g_expert, g_count, g_entries);
}

// The router's GEMV, its top-k and the shared expert's gate in one launch (the window's: no logits node before
// router_topk). W [E, n_in] f32 rows, x [T, n_in] (T <= GEMV_MAXT), logits [T, E] written (and read back by the
// last block). grid G + ceil(E / ROUTER_EPB) (G gate blocks first: launch_moe.ROUTER_GATE_BLOCKS, min(T, 8) with
// sg_w, else 0), block ROUTER_THREADS (256), dynamic shared memory min(T, 8) * 1024 floats
// (launch_moe.router_fused_smem: a row of p a warp with a row; the grouping's T*K + 256 ints reuse it).
//   warps 4r .. 4r+3 of GEMV block b (blockIdx.x - G): logits[t, e] = W[e] . x[t] for e = ROUTER_EPB*b + r and
//   every row t; warp s of the four takes the elements i = lane + 32 (s + 4 j): the lane's up to ROUTER_J weights
//   and row 0's x are loaded together into registers, then a loop over the rows t (row t+1's x loads go out before
//   row t's sum; rows longer than 32 * 4 * ROUTER_J loop on), lanes then warps added in order (warp_sum, then s
//   ascending);
//   gate block b < G: sg[t] = sigmoid(sg_w . x[t]) for t = b, b + G, ..., its loads beside the GEMV's (router_topk's
//   gate: thread i's up to ROUTER_SGJ elements i + 256 j loaded together, the weight type dispatched once a row);
//   the block counted last in done[0] (a zeroed counter it resets): warp w takes rows t = w, w + 8, ...: its lanes
//   load the row's E logits into registers at once (lane l: e = l + 32 j) for the max and its row of p in shared
//   memory, p = exp(z - max) / sum in loops over that row, p back into registers, K rounds of warp argmax on p
//   (a lane's best by a 5-level tree over its 32 slots, then across the lanes; ties -> lower id), w = top p /
//   their sum (router_topk's selection; its sums go in warp order), then groups the J = T*K entries by expert as
//   router_topk does (J <= 256).
// shared_id >= 0: the shared expert runs as one more expert of the routed launches (its weights appended as expert
// shared_id): ids and w have rows of K + 1, slot K = (shared_id, sg[t]), grouped with the rest (J = T*(K+1)); the
// combine then adds sg * shared(x) last, as it adds the shared expert's output otherwise (sg_w must be given).
// Latency at T = 1 (E = 512, n_in = 2560, K = 10): 1 gate block + 256 GEMV blocks (one wave of 2 a SM), 20 weight
// loads a lane in one trip (the gate block's 10 a thread in the same trip), 1 barrier to add the 4 warps, the
// arrival (fence + atomic), 1 L2 trip for the logits, the exp and division loops (16 elements a lane, in shared
// memory), K warp-argmax rounds on registers (a tree: ~5 dependent compares a round, not 32), the grouping. Code
// size counts as much: each launch starts cold in the instruction cache (a window's other kernels run between two
// routers), so the rows, the gate's weight types and the softmax's elements are runtime loops over one compact body
// each, not straight-line code
// (unrolled over GEMV_MAXT rows, four types and 32 elements a lane this kernel was ~9000 SASS instructions and took
// ~47 us a call on the H200; now ~2900 (NVRTC sm_90), 121 registers, no stack). Sums: in the unrolled kernel's
// order (a lane's elements ascending, warp_sum, the 4 warps ascending; the gate a thread's elements ascending, then
// block_sum; exp and division as before), so the logits, the selection and the gate keep their bits.
#define ROUTER_THREADS (GEMV_WARPS * WARP)   // block size
#define ROUTER_KS 4                             // warps per expert row
#define ROUTER_EPB (GEMV_WARPS / ROUTER_KS)     // expert rows per block
#define ROUTER_J 24                             // elements per lane in registers: n_in <= 32 * 4 * 24 in one trip
#define ROUTER_SGJ 12                           // gate elements per thread in registers: n_in <= 256 * 12 in one trip
#define ROUTER_EJ 32                            // logits per lane in the top-k: E <= 1024 (launch_moe)

// How many of the elements i0 + step * j (j = 0, 1, ...) lie below n: the unrolled loads' guards compare j with it
// (a constant each), not each element's index with n.
__device__ __forceinline__ int router_count(int i0, int step, int n) { return i0 < n ? (n - i0 + step - 1) / step : 0; }

// v[WARP * ROUTER_KS * j] for j < nj (0 past them): one lane's ROUTER_J elements of a row, loaded together.
__device__ __forceinline__ void router_span(const float* __restrict__ v, int nj, float (&out)[ROUTER_J]) {
#pragma unroll
    for (int j = 0; j < ROUTER_J; ++j) out[j] = j < nj ? __ldg(v + WARP * ROUTER_KS * j) : 0.0f;
}

// sg_w . x[t] for this thread's elements i = threadIdx.x + ROUTER_THREADS * j (ascending), sg_w of type TYPE: the
// first ROUTER_SGJ of them loaded together, longer rows loop on. Summed by the caller's block_sum.
template <int TYPE>
__device__ __forceinline__ float router_gate_part(const u8* __restrict__ sg_w, const float* __restrict__ xt, int n_in) {
    const int nj = router_count(threadIdx.x, ROUTER_THREADS, n_in);
    float wv[ROUTER_SGJ], xv[ROUTER_SGJ];
#pragma unroll
    for (int j = 0; j < ROUTER_SGJ; ++j) {
        const int i = threadIdx.x + ROUTER_THREADS * j;  // a constant step: Q8_0's block i / 32 steps by 8
        wv[j] = j < nj ? raw_at_t<TYPE>(sg_w, i) : 0.0f;
        xv[j] = j < nj ? __ldg(xt + i) : 0.0f;
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < ROUTER_SGJ; ++j) acc += wv[j] * xv[j];  // past n_in: + 0 * 0, the sum unchanged
#pragma unroll 1
    for (int i = threadIdx.x + ROUTER_THREADS * ROUTER_SGJ; i < n_in; i += ROUTER_THREADS)  // longer rows
        acc += raw_at_t<TYPE>(sg_w, i) * xt[i];
    return acc;
}

extern "C" __global__ void __launch_bounds__(ROUTER_THREADS, 2)
    router_gemv_topk(const float* __restrict__ W, const float* __restrict__ x, int n_in, int T, float* logits,
                     int E, int K, int shared_id, int* ids, float* __restrict__ w, int* __restrict__ g_expert,
                     int* __restrict__ g_count, int* __restrict__ g_entries, int max_rows, unsigned* done,
                     const u8* __restrict__ sg_w, int sg_type, float* __restrict__ sg) {
    // GEMV blocks come after the gate blocks (the launcher's order): a gate block's row0 is negative
    pdl_prefetch_rows(W, (i64)n_in * sizeof(float),
                      ((i64)blockIdx.x - ((int)gridDim.x - (E + ROUTER_EPB - 1) / ROUTER_EPB)) * ROUTER_EPB,
                      ROUTER_EPB, E);
    pdl_begin();
    extern __shared__ float p[];
    __shared__ float shv[WARP];
    __shared__ float part[ROUTER_EPB][ROUTER_KS][GEMV_MAXT];
    __shared__ float top_p[GEMV_WARPS][ROUTER_MAXK];
    const int lane = threadIdx.x & (WARP - 1), warp = threadIdx.x / WARP;
    const int r = warp / ROUTER_KS, ks = warp % ROUTER_KS;
    const int gate_blocks = (int)gridDim.x - (E + ROUTER_EPB - 1) / ROUTER_EPB;  // the launcher's, before the GEMV's
    const bool gate_block = (int)blockIdx.x < gate_blocks;  // uniform per block
    const int gb = blockIdx.x - gate_blocks;  // this GEMV block's index
    const int e = gb * ROUTER_EPB + r;
    if (!gate_block && e < E) {  // uniform per warp
        const float* row = W + (i64)e * n_in;
        const int i0 = lane + WARP * ks;
        const int nj = router_count(i0, WARP * ROUTER_KS, n_in);
        float wv[ROUTER_J], xv[ROUTER_J];
        router_span(row + i0, nj, wv);
        router_span(x + i0, nj, xv);
        for (int t = 0; t < T; ++t) {  // T is uniform: every lane meets the shuffles
            float xn[ROUTER_J];
            router_span(x + (i64)(t + 1) * n_in + i0, t + 1 < T ? nj : 0, xn);  // the next row's, in flight
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < ROUTER_J; ++j) acc += wv[j] * xv[j];  // past n_in: + 0 * 0, the sum unchanged
            const float* xt = x + (i64)t * n_in;
#pragma unroll 1
            for (int i = i0 + WARP * ROUTER_KS * ROUTER_J; i < n_in; i += WARP * ROUTER_KS)  // longer rows
                acc += __ldg(row + i) * xt[i];
            const float v = warp_sum(acc);
            if (lane == 0) part[r][ks][t] = v;
#pragma unroll
            for (int j = 0; j < ROUTER_J; ++j) xv[j] = xn[j];
        }
    }
    __syncthreads();
    if (!gate_block && threadIdx.x < ROUTER_EPB * T) {  // the ROUTER_KS warps' sums of one (expert, row), in order
        const int rr = threadIdx.x / T, t = threadIdx.x % T, er = gb * ROUTER_EPB + rr;
        if (er < E) {
            float v = 0.0f;
#pragma unroll
            for (int s = 0; s < ROUTER_KS; ++s) v += part[rr][s][t];
            logits[(i64)t * E + er] = v;
        }
    }
    for (int t = blockIdx.x; gate_block && sg_w != nullptr && t < T; t += gate_blocks) {  // uniform per block
        const float* xt = x + (i64)t * n_in;
        float acc;  // raw_at's types, dispatched once
        if (sg_type == GGML_F32) acc = router_gate_part<GGML_F32>(sg_w, xt, n_in);
        else if (sg_type == GGML_F16) acc = router_gate_part<GGML_F16>(sg_w, xt, n_in);
        else if (sg_type == GGML_BF16) acc = router_gate_part<GGML_BF16>(sg_w, xt, n_in);
        else acc = router_gate_part<GGML_Q8_0>(sg_w, xt, n_in);
        acc = block_sum(acc, shv);
        if (threadIdx.x == 0) sg[t] = sigmoid_f(acc);
    }
    if (!arrived_last(done, gridDim.x)) return;  // the last block has every block's logits (and gates)
    const int Ks = shared_id >= 0 ? K + 1 : K;  // slots of a row
    const int ne = router_count(lane, WARP, E);  // this lane's elements e = lane + 32 j of a row, j < ne
    for (int t = warp; t < T; t += GEMV_WARPS) {
        const float* zl = logits + (i64)t * E + lane;
        float* pl = p + warp * (ROUTER_EJ * WARP) + lane;  // this warp's row of p, lane's element j at pl[32 j]
        float pv[ROUTER_EJ];
#pragma unroll
        for (int j = 0; j < ROUTER_EJ; ++j) pv[j] = j < ne ? __ldcg(zl + WARP * j) : NEG_INF;  // L2: other blocks'
        float m = NEG_INF;
#pragma unroll
        for (int j = 0; j < ROUTER_EJ; ++j) {
            m = fmaxf(m, pv[j]);
            pl[WARP * j] = pv[j];  // past E too (never read): no guard to keep
        }
        m = warp_max(m);
        float s = 0.0f;
#pragma unroll 4
        for (int j = 0; j < ne; ++j) {  // a loop over shared memory, not one expf and division an element unrolled
            const float v = expf(pl[WARP * j] - m);
            pl[WARP * j] = v;
            s += v;
        }
        s = warp_sum(s);
#pragma unroll 2
        for (int j = 0; j < ne; ++j) pl[WARP * j] = pl[WARP * j] / s;
        // p back into registers (NEG_INF past E, and for a NaN p: neither ever wins). A lane's best is the
        // ascending scan's (v > bv from NEG_INF: the greatest p, the lowest j of equal ones; none above NEG_INF:
        // j = -1), found by a tree over its slots, the right half taken only when strictly greater (5 levels of
        // latency a round where the scan chained 32 compares), then warp_argmax across the lanes: the old winner.
#pragma unroll
        for (int j = 0; j < ROUTER_EJ; ++j) {
            const float v = pl[WARP * j];
            pv[j] = v == v ? v : NEG_INF;
        }
        // K rounds of warp argmax; a taken expert is set to -1 (probabilities are >= 0, so it never wins again)
        for (int k = 0; k < K; ++k) {
            float tv[ROUTER_EJ];
            int tj[ROUTER_EJ];
#pragma unroll
            for (int j = 0; j < ROUTER_EJ; ++j) {
                tv[j] = pv[j];
                tj[j] = j;
            }
#pragma unroll
            for (int h = 1; h < ROUTER_EJ; h *= 2)
#pragma unroll
                for (int j = 0; j < ROUTER_EJ; j += 2 * h)
                    if (tv[j + h] > tv[j]) {
                        tv[j] = tv[j + h];
                        tj[j] = tj[j + h];
                    }
            float bv = tv[0];  // NEG_INF when no slot is above it
            const int bj = bv > NEG_INF ? tj[0] : -1;
            int bi = bj < 0 ? BIG_ID : lane + WARP * bj;
            warp_argmax(bv, bi);  // every lane holds the winner
            const int d = bi - lane;  // the winner is this lane's element j where d == 32 j
#pragma unroll
            for (int j = 0; j < ROUTER_EJ; ++j)
                if (d == WARP * j) pv[j] = -1.0f;
            if (lane == 0) {
                ids[(i64)t * Ks + k] = bi;
                top_p[warp][k] = bv;
            }
        }
        __syncwarp();
        if (lane == 0) {
            float sum = 0.0f;
#pragma unroll 1
            for (int k = 0; k < K; ++k) sum += top_p[warp][k];
#pragma unroll 1
            for (int k = 0; k < K; ++k) w[(i64)t * Ks + k] = top_p[warp][k] / sum;
            if (shared_id >= 0) {
                ids[(i64)t * Ks + K] = shared_id;
                w[(i64)t * Ks + K] = __ldcg(sg + t);  // L2: another block may have written it
            }
        }
        __syncwarp();
    }
    if (g_expert == nullptr) return;
    __syncthreads();  // every row's ids are written (this block wrote them all)
    const int J = T * Ks;
    int* sid = reinterpret_cast<int*>(p);  // the ids, then group_by_key's leader flags
    for (int j = threadIdx.x; j < J; j += blockDim.x) sid[j] = ids[j];
    __syncthreads();
    group_by_key(sid, sid + J, 0, J, max_rows, false, g_expert, g_count, g_entries);
}

// out[t, d] = sum_k w[t, k] * parts[t*K + k, d] (+ shared[t, d] when shared is not null); its residual write
// into the streams is the next hyper-connection read's (hyper.cu hc_write_norm, which also computes this sum in
// the window). Grid-stride over T*D, block 256. Slot order; numpy adds in expert-id order (float32 rounding differs
// only).
extern "C" __global__ void __launch_bounds__(256)
    moe_combine(const float* __restrict__ parts, const float* __restrict__ w, const float* __restrict__ shared,
                float* __restrict__ out, int T, int K, int D) {
    pdl_begin();
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < (i64)T * D; idx += (i64)gridDim.x * blockDim.x) {
        const i64 t = idx / D, d = idx % D;
        const float* wt = w + t * K;
        const float* column = parts + t * K * D + d;  // entry t*K + k at column[k * D]
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += wt[k] * column[(i64)k * D];
        out[idx] = shared ? acc + shared[idx] : acc;
    }
}

// Group the J = T*K (row, slot) entries by expert so that each distinct expert's weights are read once per window.
// ids [J] (row-major [T, K]) -> g_expert [J], g_count [J], g_entries [J, max_rows]: group u holds up to max_rows
// entries (ascending) of expert g_expert[u]; groups past the last have count 0. An entry leads a group when the
// number of earlier entries with its id is a multiple of max_rows (a row never repeats an id, so with T <=
// max_rows each expert is one group). One block of >= J threads (J <= 1024).
extern "C" __global__ void __launch_bounds__(1024)
    moe_group(const int* __restrict__ ids, int J, int max_rows, int* __restrict__ g_expert,
              int* __restrict__ g_count, int* __restrict__ g_entries) {
    pdl_begin();
    __shared__ int is_leader[1024];
    __shared__ int sid[1024];  // the ids, read from shared memory by every thread's scans
    if (threadIdx.x < J) sid[threadIdx.x] = ids[threadIdx.x];
    __syncthreads();
    group_by_key(sid, is_leader, 0, J, max_rows, false, g_expert, g_count, g_entries);
}
