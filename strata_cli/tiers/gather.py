"""The host gather: experts copied from the memory-mapped expert tensors into other host memory (an adaptive cache's
slot fills' pinned staging, engine/gpu/residency_fill.py; the PCIe share's page-locked store at load,
engine/gpu/expert_store.py), on the calling thread's OpenMP team (kernels/expert_pool.c strata_gather: 64 KiB chunks
of memcpy over the team), so that the thread that runs the pool gathers on the pool's own team, one call after the
other (the two share the host's cores and memory bandwidth whatever runs them)."""

from __future__ import annotations

import ctypes

import numpy as np

_ptr = ctypes.c_void_p


def expert_bytes_view(raw: np.ndarray, n_expert: int) -> np.ndarray:
    """A tensor's memory-mapped rows [E, ...] seen as [E, expert bytes] uint8 (no copy)."""
    flat = raw.reshape(n_expert, -1)
    return flat.view(np.uint8) if flat.dtype != np.uint8 else flat


# Bytes one thread of a gather gets at least: a step's gather uses ceil(bytes / this) threads of the team, at most the
# team. On the H200 host (bench/gather_bench.py at 02f665e) 16 threads gathered a T = 1 step's 6 MB (3 experts) at
# 1.0 GB/s against 18 on 4 threads, while 64 MB (32 experts, T = 8) took 61 GB/s on 16 against 23 on 4: 1.5 MiB a
# thread puts both on their measured best (4 and 16 threads).
GATHER_BYTES_PER_THREAD = 3 << 19


def gather_threads(team: int, nbytes: int) -> int:
    """The threads a gather of nbytes uses out of a team of `team` (at least 1)."""
    return max(1, min(int(team), -(-int(nbytes) // GATHER_BYTES_PER_THREAD)))


def gather_rows(lib, threads: int, outs: list[np.ndarray], srcs: list[np.ndarray], experts: np.ndarray,
                size_by_bytes: bool = True) -> None:
    """outs[p][i] = srcs[p][experts[i]] for every projection p (srcs [E, expert bytes] uint8, outs [n, expert bytes]
    uint8, both row-contiguous): one strata_gather call on the calling thread's OpenMP team (lib: the pool's native
    library; `threads` the team, of which gather_threads picks by the bytes; size_by_bytes=False: all of them, for
    bench/gather_bench.py's fixed counts), or numpy's take per projection without it (lib None)."""
    gather_blocks(lib, threads, [(out, src, experts) for out, src in zip(outs, srcs)], size_by_bytes)


def gather_blocks(lib, threads: int, blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                  size_by_bytes: bool = True) -> None:
    """out[i] = src[experts[i]] for every block (out, src, experts) (src [E, row bytes] uint8, out [n, row bytes]
    uint8, both row-contiguous; each block its own experts, e.g. one per (layer, projection) of an adaptive cache's
    fill batch, engine/gpu/residency_fill.py): every block's rows in ONE strata_gather call on the calling thread's
    OpenMP team (of it the threads the bytes call for, gather_threads), or numpy's take per block without the
    library (lib None)."""
    if lib is None:
        for out, src, experts in blocks:
            # mode "clip": with "raise" numpy buffers `out` (a second copy); the plan's expert ids are in range
            np.take(src, experts, axis=0, out=out, mode="clip")
        return
    src_p, dst_p, nbytes = [], [], []
    for out, src, experts in blocks:
        e = np.asarray(experts, dtype=np.uint64)
        if e.size and int(e.max()) >= src.shape[0]:
            raise ValueError(f"expert {int(e.max())} out of range of {src.shape[0]}")
        if out.shape != (len(e), src.shape[1]) or src.strides[1] != 1 or out.strides[1] != 1:
            raise ValueError(f"gather of {len(e)} rows of {src.shape[1]} bytes into {out.shape}: rows must match")
        src_p.append(np.uint64(src.ctypes.data) + e * np.uint64(src.strides[0]))
        dst_p.append(np.uint64(out.ctypes.data) + np.arange(len(e), dtype=np.uint64) * np.uint64(out.strides[0]))
        nbytes.append(np.full(len(e), src.shape[1], dtype=np.int64))
    if not nbytes:
        return
    src_a, dst_a, len_a = (np.ascontiguousarray(np.concatenate(a)) for a in (src_p, dst_p, nbytes))
    if size_by_bytes:
        threads = gather_threads(threads, int(len_a.sum()))
    rc = lib.strata_gather(int(threads), len(len_a), _ptr(src_a.ctypes.data), _ptr(dst_a.ctypes.data),
                           _ptr(len_a.ctypes.data))
    if rc != 0:
        raise RuntimeError(f"strata_gather failed (code {rc})")
