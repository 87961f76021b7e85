/* The tier host's steps of one window in one C loop, for a window with no PCIe share (strata_cli/tiers/host.py
 * TierHost.serve; its per-step Python, TierHost._step, is the reference, serves the PCIe share and the numpy pool,
 * and tests/test_tier_windows_cpu.py runs both against the simulated GPU side). Python's work between the GPU's ring
 * and the pool's kernel (the ring slices, the ids copy, the plan call, the flag writes under a lock, the pool call's
 * arguments and profile, the stats) was on the window's critical path at every step: on the H200 host (25b71aa,
 * verify-bench) plan ms + (pool ms - pool C ms) = 3.7 ms of a 28.4 ms cache-0 T = 1 window, ~40-80 us a step.
 *
 * Per step k (ring k + 1, layer lo + k, one token group of T rows: tiers/doorbell.StepRange with G = 1):
 *   wait until words[seq] >= k + 1 (at most max_wait_ns: then return k, the caller looks at its stream and the
 *   release and calls again from k), copy the picks into ids_log (the caller replays its route hook and an adaptive
 *   cache's observe from it after the window), plan (strata_plan_step, pcie_frac 0: no PCIe share), raise flagA and
 *   flagB, the CPU share on the pool's team (pool_run) into ymiss, raise flag (not for the last step of a stall
 *   window: withhold_last).
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
 * stats [SERVE_STATS] i64, accumulated (the caller zeroes it per window): SERVE_* below. */
#ifndef STRATA_EXPERT_POOL_SERVE_H
#define STRATA_EXPERT_POOL_SERVE_H

typedef struct {
    int64_t n_steps, lo, T, K, E, H, F, JM, M, n_threads, withhold_last;
    int64_t w_seq, w_flag_a, w_flag_b, w_flag;
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
} strata_serve_args;

/* stats[] */
enum { SERVE_VRAM, SERVE_CPU, SERVE_CPU_BYTES, SERVE_WAIT_NS, SERVE_PLAN_NS, SERVE_POOL_NS, SERVE_KERNEL_NS,
       SERVE_WAKE_NS, SERVE_STEP, SERVE_STATS };
/* return codes below 0 (stats[SERVE_STEP] is the step in progress) */
#define SERVE_RELEASED (-1)
#define SERVE_BAD_ID (-2)    /* a routed expert outside 0 .. E-1 */
#define SERVE_PLAN_SIZE (-3) /* the plan does not fit the slot (strata_plan_step's 2) */
#define SERVE_POOL (-4)      /* the pool's call failed (its scratch could not be allocated) */
#define SERVE_ARGS (-5)      /* a window the loop does not serve (T, K, J or the team out of range) */

static inline void serve_raise(uint32_t *word, uint32_t value) {
    uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    while (cur < value &&
           !__atomic_compare_exchange_n(word, &cur, value, 1, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
    }
}

static inline int serve_released(const strata_serve_args *a) {
    return __atomic_load_n(&a->words[a->w_flag], __ATOMIC_ACQUIRE) == 0xFFFFFFFFu;
}

/* Serves steps k .. n_steps - 1; returns the next step to serve (n_steps: the window's host work is done; less: its
 * ring did not come within max_wait_ns) or a SERVE_* code below 0. */
int64_t strata_serve_steps(const strata_serve_args *a, int64_t k, int64_t max_wait_ns, int64_t *stats) {
    const int T = (int)a->T, K = (int)a->K, J = T * K, E = (int)a->E;
    if (T < 1 || K < 1 || J > a->JM || a->n_threads < 1 || a->n_threads > 4096) return SERVE_ARGS;
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
        const int rc = strata_plan_step(T, K, log, a->table + (int64_t)layer * E, E, 0.0, 0, (int)a->JM, (int)a->M,
                                        a->slot, a->cpu_experts, a->cpu_start, a->cpu_tok, a->cpu_dst,
                                        a->pcie_experts, a->pcie_start, a->pcie_dst, a->counts, a->group);
        if (rc != 0) return rc == 1 ? SERVE_BAD_ID : SERVE_PLAN_SIZE;
        serve_raise(&a->words[a->w_flag_a], want);
        serve_raise(&a->words[a->w_flag_b], want); /* no PCIe share: nothing for flagB to wait for */
        const int64_t t2 = now_ns();
        stats[SERVE_PLAN_NS] += t2 - t1;
        const int G = a->counts[4];
        if (G > 0) {
            const uint64_t *base = a->base + 3 * layer, *estride = a->estride + 3 * layer;
            for (int g = 0; g < G; g++)
                for (int m = 0; m < 3; m++) ptr[m * G + g] = base[m] + (uint64_t)a->cpu_experts[g] * estride[m];
            const int64_t *rs = a->row_stride + 3 * layer;
            const int32_t *ty = a->types + 3 * layer;
            if (pool_run((int)a->n_threads, (int)a->H, (int)a->F, G, ptr, ptr + G, ptr + 2 * G, rs[0], rs[1], rs[2],
                         ty[0], ty[1], ty[2], a->cpu_start, a->cpu_tok, a->cpu_dst, a->x, a->ymiss, a->h, 0,
                         a->prof) != 0)
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
        stats[SERVE_VRAM] += a->counts[0];
        stats[SERVE_CPU] += a->counts[2];
        stats[SERVE_CPU_BYTES] += a->expert_bytes[layer] * G;
        if (serve_released(a)) return SERVE_RELEASED;
        if (!(a->withhold_last && k == a->n_steps - 1)) serve_raise(&a->words[a->w_flag], want);
    }
    stats[SERVE_STEP] = k;
    return k;
}

#endif
