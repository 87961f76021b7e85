/* The tier host's step plan in C (strata_cli/tiers/host.py: plan_step + write_plan are its numpy reference, and
 * tests/test_tier_plan_native.py holds the two equal word for word). Python spent 80-230 us a layer on it on the H200
 * host (verify-bench's plan ms: 3.9 ms of a 21.8 ms T = 1 window at 24 GiB, 8.9 of 38.6 at cache 0), all of it on
 * the window's critical path between the GPU's routing and the pool's call; through this function the plan ms were
 * 0.9 and 1.5 (25b71aa), and a step with its Python takes 8 us on the dev box (50 with numpy).
 *
 * Shapes (one step: n token rows of one group, K picks a row, J = n*K entries, E experts of the layer):
 *   ids [J] int32          the routed experts, row-major (entry i = row i / K, pick i % K)
 *   res [E] int32          the layer's residency row: VRAM slot, or -1
 *   slot [JM * (3 + M)]    the group's mapped plan slot (M = GEMV_MAXT entries a PCIe group):
 *                          src [JM] | pcie expert [JM] | pcie count [JM] | pcie entries [JM, M]; the group's entries
 *                          start at j0
 *   cpu_experts [J], cpu_start [J + 1], cpu_tok [J], cpu_dst [J]   the CPU share grouped by expert
 *   pcie_experts [J], pcie_start [J + 1], pcie_dst [J]             the PCIe share (staging slot = group position)
 *   counts [5]             VRAM entries, PCIe entries, CPU entries, PCIe groups, CPU groups
 *   group [E] int32        the caller's scratch, all -1 before the call and after it (the distinct experts' map)
 * The rule (tiers/plan.build_plan): the distinct experts in the order of their first pick; residents go to the GPU's
 * own grouping (not in the plan); of the misses the last floor(n_miss * pcie_frac + 1e-9) go over PCIe, the rest to
 * the CPU pool; a group's entries in routing order. */
#ifndef STRATA_EXPERT_POOL_PLAN_H
#define STRATA_EXPERT_POOL_PLAN_H

#define PLAN_SRC_VRAM 0
#define PLAN_SRC_PCIE 1
#define PLAN_SRC_CPU 2

/* Returns 0, or 1 for an expert id outside [0, E), 2 for sizes out of range (J > JM, j0 + J > JM, a PCIe group of
 * more than M entries, E < 1). */
int strata_plan_step(int n, int K, const int32_t *ids, const int32_t *res, int E, double pcie_frac, int j0, int JM,
                     int M, int32_t *slot, int32_t *cpu_experts, int32_t *cpu_start, int32_t *cpu_tok,
                     int32_t *cpu_dst, int32_t *pcie_experts, int32_t *pcie_start, int32_t *pcie_dst,
                     int32_t *counts, int32_t *group) {
    const int J = n * K;
    if (n < 0 || K < 1 || E < 1 || j0 < 0 || J > JM || j0 + J > JM || M < 1) return 2;
    /* group[e]: -1 unseen, else the expert's position among the distinct experts (first-pick order) */
    int32_t distinct[J > 0 ? J : 1], kind[J > 0 ? J : 1], index[J > 0 ? J : 1];
    int nd = 0, n_miss = 0;
    for (int i = 0; i < J; i++) {
        const int32_t e = ids[i];
        if (e < 0 || e >= E) { for (int d = 0; d < nd; d++) group[distinct[d]] = -1; return 1; }
        if (group[e] < 0) { group[e] = nd; distinct[nd++] = e; n_miss += res[e] < 0; }
    }
    long n_dma = (long)floor((double)n_miss * pcie_frac + 1e-9);
    if (n_dma < 0) n_dma = 0;
    if (n_dma > n_miss) n_dma = n_miss;
    /* kind and index of each distinct expert: the first n_miss - n_dma misses to the CPU, the rest over PCIe */
    int n_cpu = 0, n_pcie = 0, miss = 0;
    for (int d = 0; d < nd; d++) {
        const int32_t e = distinct[d];
        if (res[e] >= 0) { kind[d] = PLAN_SRC_VRAM; index[d] = -1; continue; }
        if (miss++ < n_miss - n_dma) { kind[d] = PLAN_SRC_CPU; index[d] = n_cpu; cpu_experts[n_cpu++] = e; }
        else { kind[d] = PLAN_SRC_PCIE; index[d] = n_pcie; pcie_experts[n_pcie++] = e; }
    }
    /* entries grouped by a counting sort that keeps routing order */
    for (int g = 0; g <= n_cpu; g++) cpu_start[g] = 0;
    for (int g = 0; g <= n_pcie; g++) pcie_start[g] = 0;
    int32_t *src = slot + j0, *g_expert = slot + JM, *g_count = slot + 2 * JM, *g_entries = slot + 3 * JM;
    int n_vram = 0;
    for (int i = 0; i < J; i++) {
        const int d = group[ids[i]];
        src[i] = kind[d];
        if (kind[d] == PLAN_SRC_CPU) cpu_start[index[d] + 1]++;
        else if (kind[d] == PLAN_SRC_PCIE) pcie_start[index[d] + 1]++;
        else n_vram++;
    }
    for (int g = 0; g < n_cpu; g++) cpu_start[g + 1] += cpu_start[g];
    for (int g = 0; g < n_pcie; g++) pcie_start[g + 1] += pcie_start[g];
    for (int g = 0; g < n_pcie; g++) if (pcie_start[g + 1] - pcie_start[g] > M) {
        for (int q = 0; q < nd; q++) group[distinct[q]] = -1;
        return 2;
    }
    int32_t fill_cpu[n_cpu > 0 ? n_cpu : 1], fill_pcie[n_pcie > 0 ? n_pcie : 1];
    for (int g = 0; g < n_cpu; g++) fill_cpu[g] = cpu_start[g];
    for (int g = 0; g < n_pcie; g++) fill_pcie[g] = pcie_start[g];
    for (int i = 0; i < J; i++) {
        const int d = group[ids[i]];
        if (kind[d] == PLAN_SRC_CPU) { const int at = fill_cpu[index[d]]++; cpu_tok[at] = i / K; cpu_dst[at] = i; }
        else if (kind[d] == PLAN_SRC_PCIE) pcie_dst[fill_pcie[index[d]]++] = i;
    }
    /* the PCIe groups' words: write_plan's (counts of the first J groups zeroed, then each group's entries) */
    for (int q = 0; q < J; q++) g_count[q] = 0;
    for (int q = 0; q < n_pcie; q++) {
        g_expert[q] = q;
        g_count[q] = pcie_start[q + 1] - pcie_start[q];
        for (int r = pcie_start[q]; r < pcie_start[q + 1]; r++) g_entries[q * M + (r - pcie_start[q])] = j0 + pcie_dst[r];
    }
    for (int d = 0; d < nd; d++) group[distinct[d]] = -1; /* the map back to unseen for the next step */
    counts[0] = n_vram; counts[1] = pcie_start[n_pcie]; counts[2] = cpu_start[n_cpu];
    counts[3] = n_pcie; counts[4] = n_cpu;
    return 0;
}

#endif
