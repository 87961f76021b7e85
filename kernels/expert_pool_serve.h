/* The tier host's steps of one window in one C loop (strata_cli/tiers/host.py TierHost.serve through
 * tiers/serve_loop.py; its per-step Python, TierHost._step, is the reference and serves eager windows and the numpy
 * pool, and tests/test_tier_windows_cpu.py runs both against the simulated GPU side). Python's work between the GPU's
 * ring and the pool's kernel (the ring slices, the ids copy, the plan call, the flag writes under a lock, the pool
 * call's arguments and profile, the PCIe copies' hand-off to a copy thread, the stats) was on the window's critical
 * path at every step: on the H200 host (25b71aa, verify-bench) plan ms + (pool ms - pool C ms) = 3.7 ms of a 28.4 ms
 * cache-0 T = 1 window, ~40-80 us a step.
 *
 * Per step k (ring k + 1, layer lo + k, one token group of T rows: tiers/doorbell.StepRange with G = 1):
 *   wait until words[seq] >= k + 1 (at most max_wait_ns: then return k, the caller looks at its stream and the
 *   release and calls again from k), copy the picks into ids_log (the caller replays its route hook and an adaptive
 *   cache's observe from it after the window), plan (strata_plan_step at pcie_frac), raise flagA; without a PCIe
 *   share raise flagB, with one issue the step's copies and flagB on the copy stream (serve_issue, on the pool's thread
 *   0 while the rest of the team computes); the CPU share on the pool's team (pool_run) into ymiss; raise flag (not
 *   for the last step of a stall window: withhold_last).
 * A flag is raised by a compare-and-swap maximum, so a release (another thread storing 0xFFFFFFFF in every flag) is
 * never lowered; a released flag ends the call (SERVE_RELEASED).
 *
 * Shapes (L layers of the model, E experts a layer, T rows, K picks a row, J = T*K <= JM entries, H hidden, F expert
 * ff, M = GEMV_MAXT):
 *   words [8] u32 mapped          seq, flagA, flagB, flag at the w_* indices
 *   ids [T, K] i32, x [T, H] f32  the group's published picks and rows (mapped);  ymiss [J, H] f32 (mapped)
 *   slot [JM * (3 + M)] i32       the group's plan slot (mapped; expert_pool_plan.h)
 *   table [L, E] i32              the residency table (VRAM slot or -1)
 *   base, estride [L, 3] u64      per layer and projection (gate, up, down): the tensor's address, bytes an expert
 *   row_stride [L, 3] i64, types [L, 3] i32, expert_bytes [L] i64 (gate + up + down of one expert)
 *   h [JM, F] f32                 the pool's gate/up scratch;  ids_log [n_steps, J] i32
 *   the plan's buffers (expert_pool_plan.h: cpu_* [JM] / [JM + 1], pcie_* likewise, counts [5], group [E] all -1)
 *   prof [PROF_HEAD + PROF_PER * n_threads] i64  the pool call's profile (kernel and wake-up time)
 *   the PCIe share's (pcie_frac > 0): store_at [L, 3] u64, store_slot [L, E] i64, proj_bytes [L, 3] i64,
 *   stage_dev [3] u64, events [n_steps, 2], copied [n_steps] i32 (the fields' comments below)
 * stats [SERVE_STATS] i64, accumulated (the caller zeroes it per window): SERVE_* below. */
#ifndef STRATA_EXPERT_POOL_SERVE_H
#define STRATA_EXPERT_POOL_SERVE_H

/* the CUDA driver calls of the PCIe share, by address (tiers/serve_loop.py takes them from libcuda; the CPU tests pass
 * stand-ins); the loop runs on the thread whose context made the engine, and so does the pool's thread 0 */
typedef int (*copy_fn)(uint64_t dst, const void *src, size_t bytes, void *stream);         /* cuMemcpyHtoDAsync */
typedef int (*write_fn)(void *stream, uint64_t addr, uint32_t value, unsigned int flags);  /* cuStreamWriteValue32 */
typedef int (*event_fn)(void *event, void *stream);                                        /* cuEventRecord */

typedef struct {
    int64_t n_steps, lo, T, K, E, H, F, JM, M, n_threads, withhold_last;
    int64_t w_seq, w_flag_a, w_flag_b, w_flag;
    double pcie_frac; /* 0: no PCIe share (flagB raised by the host), else the share of each step's misses */
    uint32_t *words;
    const int32_t *ids;
    const float *x;
    float *ymiss;
    int32_t *slot;
    const int32_t *table;
    const uint64_t *base, *estride;
    const int64_t *row_stride;
    const int32_t *types;
    const int64_t *expert_bytes;
    float *h;
    int32_t *ids_log;
    int32_t *cpu_experts, *cpu_start, *cpu_tok, *cpu_dst, *pcie_experts, *pcie_start, *pcie_dst, *counts, *group;
    int64_t *prof;
    /* the PCIe share */
    copy_fn copy;
    write_fn write_value;
    event_fn record;
    void *copy_stream;
    uint64_t flag_b_dev;        /* the device address of words[w_flag_b] */
    const uint64_t *store_at;   /* [L, 3] the page-locked store's address of each layer's projection block */
    const int64_t *store_slot;  /* [L, E] an expert's index in its layer's blocks, -1: not stored */
    const int64_t *proj_bytes;  /* [L, 3] one expert's bytes of each projection */
    const uint64_t *stage_dev;  /* [3] the group's device staging slots of each projection */
    void *const *events;        /* [n_steps, 2] a step's (start, end) events around its copies */
    int32_t *copied;            /* [n_steps] 1 where a step recorded its events */
} strata_serve_args;

/* stats[] */
enum { SERVE_VRAM, SERVE_CPU, SERVE_CPU_BYTES, SERVE_WAIT_NS, SERVE_PLAN_NS, SERVE_POOL_NS, SERVE_KERNEL_NS,
       SERVE_WAKE_NS, SERVE_STEP, SERVE_PCIE, SERVE_PCIE_BYTES, SERVE_ISSUE_NS, SERVE_COPY_RC, SERVE_STATS };
/* return codes below 0 (stats[SERVE_STEP] is the step in progress) */
#define SERVE_RELEASED (-1)
#define SERVE_BAD_ID (-2)    /* a routed expert outside 0 .. E-1 */
#define SERVE_PLAN_SIZE (-3) /* the plan does not fit the slot (strata_plan_step's 2) */
#define SERVE_POOL (-4)      /* the pool's call failed (its scratch could not be allocated) */
#define SERVE_ARGS (-5)      /* a window the loop does not serve (T, K, J or the team out of range) */
#define SERVE_COPY (-6)      /* a driver call of the PCIe share failed (its code in stats[SERVE_COPY_RC]) */
#define SERVE_UNSTORED (-7)  /* a PCIe expert the page-locked store does not hold */

static inline void serve_raise(uint32_t *word, uint32_t value) {
    uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    while (cur < value &&
           !__atomic_compare_exchange_n(word, &cur, value, 1, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
    }
}

static inline int serve_released(const strata_serve_args *a) {
    return __atomic_load_n(&a->words[a->w_flag], __ATOMIC_ACQUIRE) == 0xFFFFFFFFu;
}

/* One step's PCIe share: its experts' DMAs from the store into the staging slots (staging slot q = the plan's PCIe
 * group q, one copy an expert and projection) between the step's events, then flagB = the ring on the copy stream: in
 * stream order after the copies and after every earlier step's flagB, never a host store (which a late stream write
 * of an earlier step would lower). */
typedef struct {
    const strata_serve_args *a;
    int64_t k;
    int layer, n_pcie;
    uint32_t want;
    int rc;      /* the first failing driver call's code, or 0 */
    int missing; /* a PCIe expert the store does not hold */
    int64_t ns;  /* the issue's time */
} serve_copies;

static void serve_issue(void *ctx) {
    serve_copies *c = (serve_copies *)ctx;
    const strata_serve_args *a = c->a;
    const int64_t t0 = now_ns();
    int rc = 0;
    if (c->n_pcie > 0) {
        void *const *ev = a->events + 2 * c->k;
        rc = a->record(ev[0], a->copy_stream);
        for (int q = 0; q < c->n_pcie && !rc && !c->missing; q++) {
            const int64_t slot = a->store_slot[(int64_t)c->layer * a->E + a->pcie_experts[q]];
            if (slot < 0) {
                c->missing = 1;
                break;
            }
            for (int p = 0; p < 3 && !rc; p++) {
                const int64_t nb = a->proj_bytes[3 * c->layer + p];
                rc = a->copy(a->stage_dev[p] + (uint64_t)(q * nb),
                             (const void *)(uintptr_t)(a->store_at[3 * c->layer + p] + (uint64_t)(slot * nb)),
                             (size_t)nb, a->copy_stream);
            }
        }
        if (!rc && !c->missing) rc = a->record(ev[1], a->copy_stream);
        if (!rc && !c->missing) a->copied[c->k] = 1;
    }
    if (!rc && !c->missing) rc = a->write_value(a->copy_stream, a->flag_b_dev, c->want, 0);
    c->rc = rc;
    c->ns = now_ns() - t0;
}

/* Serves steps k .. n_steps - 1; returns the next step to serve (n_steps: the window's host work is done; less: its
 * ring did not come within max_wait_ns) or a SERVE_* code below 0. */
int64_t strata_serve_steps(const strata_serve_args *a, int64_t k, int64_t max_wait_ns, int64_t *stats) {
    const int T = (int)a->T, K = (int)a->K, J = T * K, E = (int)a->E;
    if (T < 1 || K < 1 || J > a->JM || a->n_threads < 1 || a->n_threads > 4096) return SERVE_ARGS;
    const int pcie = a->pcie_frac > 0.0;
    if (pcie && !(a->copy && a->write_value && a->record && a->store_at && a->store_slot && a->proj_bytes &&
                  a->stage_dev && a->events && a->copied))
        return SERVE_ARGS;
    const int64_t G_max = a->JM;
    uint64_t ptr[3 * G_max];
    for (; k < a->n_steps; k++) {
        stats[SERVE_STEP] = k;
        const uint32_t want = (uint32_t)(k + 1);
        const int64_t t0 = now_ns();
        const uint32_t seq = strata_wait_geq(&a->words[a->w_seq], want, max_wait_ns);
        const int64_t t1 = now_ns();
        stats[SERVE_WAIT_NS] += t1 - t0;
        if (serve_released(a)) return SERVE_RELEASED;
        if (seq < want) return k;
        const int layer = (int)(a->lo + k);
        int32_t *const log = a->ids_log + k * J;
        memcpy(log, a->ids, sizeof(int32_t) * (size_t)J);
        const int rc = strata_plan_step(T, K, log, a->table + (int64_t)layer * E, E, a->pcie_frac, 0, (int)a->JM,
                                        (int)a->M, a->slot, a->cpu_experts, a->cpu_start, a->cpu_tok, a->cpu_dst,
                                        a->pcie_experts, a->pcie_start, a->pcie_dst, a->counts, a->group);
        if (rc != 0) return rc == 1 ? SERVE_BAD_ID : SERVE_PLAN_SIZE;
        serve_raise(&a->words[a->w_flag_a], want);
        if (!pcie) serve_raise(&a->words[a->w_flag_b], want); /* no PCIe share: nothing for flagB to wait for */
        const int64_t t2 = now_ns();
        stats[SERVE_PLAN_NS] += t2 - t1;
        const int G = a->counts[4];
        serve_copies copies = {a, k, layer, a->counts[3], want, 0, 0, 0};
        if (pcie && G == 0) serve_issue(&copies);
        if (G > 0) {
            const uint64_t *base = a->base + 3 * layer, *estride = a->estride + 3 * layer;
            for (int g = 0; g < G; g++)
                for (int m = 0; m < 3; m++) ptr[m * G + g] = base[m] + (uint64_t)a->cpu_experts[g] * estride[m];
            const int64_t *rs = a->row_stride + 3 * layer;
            const int32_t *ty = a->types + 3 * layer;
            if (pool_run((int)a->n_threads, (int)a->H, (int)a->F, G, ptr, ptr + G, ptr + 2 * G, rs[0], rs[1], rs[2],
                         ty[0], ty[1], ty[2], a->cpu_start, a->cpu_tok, a->cpu_dst, a->x, a->ymiss, a->h, 0,
                         a->prof, pcie ? serve_issue : NULL, &copies) != 0)
                return SERVE_POOL;
            int64_t entered = 0;
            for (int t = 0; t < (int)a->prof[2]; t++) {
                const int64_t in = a->prof[PROF_HEAD + PROF_PER * t];
                entered = in > entered ? in : entered;
            }
            stats[SERVE_KERNEL_NS] += a->prof[1] - a->prof[0];
            stats[SERVE_WAKE_NS] += entered > 0 ? entered - a->prof[0] : 0;
        }
        const int64_t t3 = now_ns();
        stats[SERVE_POOL_NS] += t3 - t2;
        if (copies.missing) return SERVE_UNSTORED;
        if (copies.rc) {
            stats[SERVE_COPY_RC] = copies.rc;
            return SERVE_COPY;
        }
        stats[SERVE_VRAM] += a->counts[0];
        stats[SERVE_CPU] += a->counts[2];
        stats[SERVE_CPU_BYTES] += a->expert_bytes[layer] * G;
        stats[SERVE_PCIE] += a->counts[1];
        stats[SERVE_PCIE_BYTES] += a->expert_bytes[layer] * copies.n_pcie;
        stats[SERVE_ISSUE_NS] += copies.ns;
        if (serve_released(a)) return SERVE_RELEASED;
        if (!(a->withhold_last && k == a->n_steps - 1)) serve_raise(&a->words[a->w_flag], want);
    }
    stats[SERVE_STEP] = k;
    return k;
}

#endif
