// Stage stamps of the profiling window graph (strata_cli/engine/stage_timing.py names the slots).
// Legend: slots [(n_layers + 1) * stages] uint64 nanoseconds, one per (layer, stage).

// One thread: slots[slot] <- the GPU's global nanosecond timer. On a stream (and in the captured graph) the
// node starts after every node before it has finished, so the stamp marks the end of the stage before it.
extern "C" __global__ void stamp_globaltimer(unsigned long long* __restrict__ slots, int slot) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    slots[slot] = now;
}
