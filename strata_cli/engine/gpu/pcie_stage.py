"""The PCIe share's pinned staging ring: per token group and projection one pinned host buffer of Q expert blobs.

Why a ring and not the model file page-locked in place: registering the mapped experts (cudaHostRegister) pinned
whole pages, so the edge pages also held bytes of neighbouring dense tensors; that registration outlived its engine
and the next engine's upload of such a tensor, starting in registered memory and ending outside, was refused
(cudaErrorInvalidValue); and at full size (~48 GB of experts, most pages not yet faulted in) the registration alone
took minutes before the first window. Here nothing of the file is ever registered: a step's PCIe experts are gathered
from the mapping into the group's pinned buffers (the pages were brought in at load by tiers/prefault.py), then one
DMA per projection copies them to the device staging slots.

Who gathers: the pool's OpenMP team, on the thread that runs the pool (tiers/host.py, before the step's pool call;
tiers/gather.py, kernels/expert_pool.c strata_gather: 64 KiB chunks of memcpy over as many of its threads as the
bytes call for). The gather and the pool
share the host's cores and memory bandwidth whatever runs them; the 4 Python threads (numpy take) that gathered
beside the pool's 16 OpenMP threads oversubscribed the cores and reached 17.9 GB/s on the H200 host (#17) where the
pool computed at 52. Without the native library the gather is numpy's take on the calling thread.

Reuse is safe without a fence: the step (layer, g) that fills group g's buffers runs after the GPU rang it, which
it does only after it passed the flagB wait of (layer-1, g), i.e. after that step's copies from these buffers landed.
"""

from __future__ import annotations

import numpy as np

from ...tiers.gather import gather_rows


class StagingRing:
    """host[g][p]: group g's pinned buffer for projection p (bytes [Q * largest expert of p]); gather() fills it.
    alloc(nbytes) -> an object with .host (uint8 numpy view), .host_ptr and free() (runtime.MappedBuffer on the
    device; a plain numpy buffer in the CPU tests). lib, threads: the pool's native library and team size
    (tiers/pool.ExpertPool's: gather() must run on the thread that runs the pool, so that the two share one team)."""

    def __init__(self, groups: int, sizes: list[int], alloc, lib=None, threads: int = 1):
        self.buffers = [[alloc(n) for n in sizes] for _ in range(groups)]
        self.lib, self.threads = lib, max(1, int(threads))

    def gather(self, grp: int, srcs: list[np.ndarray], experts: np.ndarray) -> list[tuple[int, int]]:
        """srcs[p][experts] (srcs[p] [E, expert bytes] uint8, one per projection) to the front of group grp's
        buffers; per projection (host address, bytes)."""
        nq = len(experts)
        outs = [buf.host[:nq * int(src.shape[1])].reshape(nq, int(src.shape[1]))
                for buf, src in zip(self.buffers[grp], srcs)]
        gather_rows(self.lib, self.threads, outs, srcs, experts)
        return [(buf.host_ptr, out.nbytes) for buf, out in zip(self.buffers[grp], outs)]

    def close(self) -> None:
        """Free the pinned buffers (idempotent)."""
        while self.buffers:
            for buf in self.buffers.pop():
                buf.free()
