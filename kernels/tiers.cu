// tiers.cu: the GPU side of the expert tiers: doorbell publish, bounded waits on mapped words, grouping
// of the VRAM-resident entries through the residency table, and the combine of VRAM/PCIe/CPU expert outputs.
// Host reference: strata_cli/tiers/host.py (plan) and ops/moe.py (combine).
// Legend: M window rows (max), T rows of one token group starting at row r0, K experts per row, D hidden,
// J = T*K (row, slot) entries of the group, entry j (global) = row*K + slot; E experts of a layer.
// Mapped words (u32, host-visible): seq (GPU rings), flagA, flagB, flag (host raises), err (first timed-out wait).
#include "common.cuh"

// Where an entry's unweighted expert output comes from (the host plan's src[], tiers/host.py SRC_*).
#define SRC_VRAM 0
#define SRC_PCIE 1
#define SRC_CPU 2

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Copy the group's routed rows x [T, D], ids [T, K], w [T, K] (rows r0.. of the window buffers) to the mapped
// doorbell payload (same row offsets), then ring: seq = ring. One block; the system fence orders the payload's
// writes before the ring as the host sees them.
extern "C" __global__ void __launch_bounds__(1024)
    tier_publish(const float* __restrict__ x, const int* __restrict__ ids, const float* __restrict__ w, int r0,
                 int T, int D, int K, float* pub_x, int* pub_ids, float* pub_w, u32* seq, u32 ring) {
    const i64 nx = (i64)T * D, x0 = (i64)r0 * D;
    for (i64 i = threadIdx.x; i < nx; i += blockDim.x) pub_x[x0 + i] = x[x0 + i];
    const int nk = T * K, k0 = r0 * K;
    for (int i = threadIdx.x; i < nk; i += blockDim.x) {
        pub_ids[k0 + i] = ids[k0 + i];
        pub_w[k0 + i] = w[k0 + i];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        *(volatile u32*)seq = ring;
        __threadfence_system();
    }
}

// Bounded wait: spin until the mapped word reaches want. After timeout_ns without it, record code in err (unless
// one is there) and go on: the host sees err and fails the window; nothing spins past the bound. The host's
// release stores 0xFFFFFFFF into every flag, which passes every wait. waited_ns (mapped, may be null)
// gets the time spent here. One thread.
extern "C" __global__ void tier_wait(const u32* word, u32 want, u32* err, u32 code, unsigned long long timeout_ns,
                                     unsigned long long* waited_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const volatile u32* v = word;
    const unsigned long long t0 = global_ns();
    while (*v < want) {
        if (global_ns() - t0 > timeout_ns) {
            volatile u32* e = err;
            if (*e == 0u) *e = code;  // a plain store: atomics on mapped host memory need PCIe atomics
            __threadfence_system();
            break;
        }
        __nanosleep(32);
    }
    if (waited_ns) *(volatile unsigned long long*)waited_ns = global_ns() - t0;
}

// Group the J entries (starting at global entry j0) whose expert is VRAM-resident by residency slot, as moe.cu's
// moe_group does by expert id: slot_of [E] maps expert -> slot or -1 (the layer's row of the residency table).
// g_expert [J] (the slot), g_count [J], g_entries [J, max_rows] (global entries, ascending); groups past the last
// have count 0; missed entries belong to no group. One block of >= J threads (J <= 1024).
extern "C" __global__ void __launch_bounds__(1024)
    tier_group(const int* __restrict__ ids, int j0, int J, const int* __restrict__ slot_of, int n_expert,
               int max_rows, int* __restrict__ g_expert, int* __restrict__ g_count, int* __restrict__ g_entries) {
    pdl_begin();
    __shared__ int is_leader[1024];
    __shared__ int sid[1024];
    const int j = threadIdx.x;
    if (j < J) {
        const int e = ids[j0 + j];
        sid[j] = (e >= 0 && e < n_expert) ? slot_of[e] : -1;
    }
    __syncthreads();
    group_by_key(sid, is_leader, j0, J, max_rows, true, g_expert, g_count, g_entries);
}

// out[t, d] = sum_k w[t, k] * part(t*K + k, d) + shared[t, d] for rows t in [r0, r0 + T): part = ymiss (mapped,
// read uncached: the host wrote it after this graph started) when src says CPU, else parts (VRAM and PCIe
// entries, computed on the device). Same slot order as moe.cu's moe_combine. Grid-stride over T*D.
extern "C" __global__ void __launch_bounds__(256)
    tier_combine(const float* __restrict__ parts, const float* ymiss, const int* __restrict__ src,
                 const float* __restrict__ w, const float* __restrict__ shared, float* __restrict__ out, int r0,
                 int T, int K, int D) {
    pdl_begin();
    const i64 n = (i64)T * D;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {
        const i64 t = r0 + idx / D, d = idx % D;
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            const i64 j = t * K + k;
            const float p = src[j] == SRC_CPU ? __ldcv(ymiss + j * D + d) : parts[j * D + d];
            acc += w[j] * p;
        }
        out[t * D + d] = acc + shared[t * D + d];
    }
}
