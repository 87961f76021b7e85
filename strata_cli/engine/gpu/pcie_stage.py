"""The PCIe share's pinned staging ring: per token group and projection one pinned host buffer of Q expert blobs.

Why a ring and not the model file page-locked in place: registering the mapped experts (cudaHostRegister) pinned
whole pages, so the edge pages also held bytes of neighbouring dense tensors; that registration outlived its engine
and the next engine's upload of such a tensor, starting in registered memory and ending outside, was refused
(cudaErrorInvalidValue); and at full size (~48 GB of experts, most pages not yet faulted in) the registration alone
took minutes before the first window. Here nothing of the file is ever registered: a step's PCIe experts are gathered
from the mapping into the group's pinned buffer (numpy takes on a few threads, the GIL released; the pages were
brought in at load by tiers/prefault.py), then one DMA per projection copies them to the device staging slots.

Reuse is safe without a fence: the step (layer, g) that fills group g's buffer runs after the GPU rang it, which
it does only after it passed the flagB wait of (layer-1, g), i.e. after that step's copies from this buffer landed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

GATHER_THREADS = 4          # threads gathering one projection's experts (host memory bandwidth, not compute)
GATHER_SPLIT_BYTES = 4 << 20  # below this a projection is gathered on the calling thread


def expert_bytes_view(raw: np.ndarray, n_expert: int) -> np.ndarray:
    """A tensor's memory-mapped rows [E, ...] seen as [E, expert bytes] uint8 (no copy)."""
    flat = raw.reshape(n_expert, -1)
    return flat.view(np.uint8) if flat.dtype != np.uint8 else flat


def gather_chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) as up to `parts` contiguous (start, stop) chunks of near-equal length, none empty."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class StagingRing:
    """host[g][p]: group g's pinned buffer for projection p (bytes [Q * largest expert of p]); gather() fills it.
    alloc(nbytes) -> an object with .host (uint8 numpy view), .host_ptr and free() (runtime.MappedBuffer on the
    device; a plain numpy buffer in the CPU tests)."""

    def __init__(self, groups: int, sizes: list[int], alloc, threads: int = GATHER_THREADS):
        self.buffers = [[alloc(n) for n in sizes] for _ in range(groups)]
        self.threads = max(1, int(threads))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="strata-pcie-gather") \
            if self.threads > 1 else None

    def gather(self, grp: int, p: int, src: np.ndarray, experts: np.ndarray) -> tuple[int, int]:
        """Copy src[experts] (src [E, expert bytes] uint8) to the front of buffer (grp, p); (host address, bytes)."""
        buf = self.buffers[grp][p]
        nq, nbytes = len(experts), int(src.shape[1])
        out = buf.host[:nq * nbytes].reshape(nq, nbytes)
        chunks = gather_chunks(nq, self.threads if nq * nbytes >= GATHER_SPLIT_BYTES else 1)
        # mode "clip": with "raise" numpy buffers `out` (a second copy); the plan's expert ids are always in range
        if self._pool is None or len(chunks) <= 1:
            np.take(src, experts, axis=0, out=out, mode="clip")
        else:
            jobs = [self._pool.submit(np.take, src, experts[a:b], 0, out[a:b], "clip") for a, b in chunks]
            for job in jobs:
                job.result()
        return buf.host_ptr, nq * nbytes

    def close(self) -> None:
        """Stop the gather threads and free the pinned buffers (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        while self.buffers:
            for buf in self.buffers.pop():
                buf.free()
