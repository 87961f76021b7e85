"""The PCIe share's host gather: a step's PCIe experts copied from the memory-mapped expert tensors into staging
rows, on the calling thread's OpenMP team (kernels/expert_pool.c strata_gather: 64 KiB chunks of memcpy over the
team), so that the thread that runs the pool gathers on the pool's own team, one call after the
other (engine/gpu/pcie_stage.py says why; tiers/share.py times it for --pcie-frac auto)."""

from __future__ import annotations

import ctypes

import numpy as np

_ptr = ctypes.c_void_p


def expert_bytes_view(raw: np.ndarray, n_expert: int) -> np.ndarray:
    """A tensor's memory-mapped rows [E, ...] seen as [E, expert bytes] uint8 (no copy)."""
    flat = raw.reshape(n_expert, -1)
    return flat.view(np.uint8) if flat.dtype != np.uint8 else flat


def gather_rows(lib, threads: int, outs: list[np.ndarray], srcs: list[np.ndarray], experts: np.ndarray) -> None:
    """outs[p][i] = srcs[p][experts[i]] for every projection p (srcs [E, expert bytes] uint8, outs [n, expert bytes]
    uint8, both row-contiguous): one strata_gather call on the calling thread's OpenMP team (lib: the pool's native
    library), or numpy's take per projection without it (lib None)."""
    gather_blocks(lib, threads, [(out, src, experts) for out, src in zip(outs, srcs)])


def gather_blocks(lib, threads: int, blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """out[i] = src[experts[i]] for every block (out, src, experts) (src [E, row bytes] uint8, out [n, row bytes]
    uint8, both row-contiguous; each block its own experts, e.g. one per (layer, projection) of an adaptive cache's
    fill batch, engine/gpu/residency_fill.py): every block's rows in ONE strata_gather call on the calling thread's
    OpenMP team, or numpy's take per block without the library (lib None)."""
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
    rc = lib.strata_gather(int(threads), len(len_a), _ptr(src_a.ctypes.data), _ptr(dst_a.ctypes.data),
                           _ptr(len_a.ctypes.data))
    if rc != 0:
        raise RuntimeError(f"strata_gather failed (code {rc})")
