"""The host side of an adaptive cache's fill batch (engine/gpu/residency_fill.py issues its DMAs): the admitted
experts' rows gathered from the memory-mapped file into the pinned staging buffer in ONE strata_gather call on the
pool's OpenMP team (tiers/gather.gather_blocks; 16 threads reach ~61 GB/s on the H200 host where numpy's copy on one
thread reached 5-10, which was issue 20's ~110 ms a window), laid out so that each run of consecutive slots is one
DMA.

Staging layout of a batch: per layer of the batch (ascending), per projection p (gate, up, down): the layer's
copies' rows of p [n, row bytes of p], in ascending slot order. A layer's slots k, k+1, ... are one run: their rows
are contiguous in staging and in the slot array [n_slots, row bytes], so one cudaMemcpyAsync moves them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import StrataError
from .gather import gather_blocks


@dataclass(frozen=True)
class Run:
    """One DMA: `count` rows of `row_bytes` from staging[offset:] into slots slot .. slot+count-1 of layer's
    projection p."""
    layer: int
    p: int
    slot: int
    count: int
    offset: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.count * self.row_bytes


def stage_batch(copies, srcs, staging: np.ndarray, lib, threads: int) -> list[Run]:
    """copies (tiers/cache_policy.Copy: layer, expert, slot) gathered into staging (uint8 [capacity], from its
    front); srcs[layer][p]: the file's rows of layer's projection p [E, row bytes] uint8 (gather.expert_bytes_view).
    lib, threads: the pool's native library and team size (None: numpy's take). Returns the DMAs, in staging order."""
    by_layer: dict[int, list] = {}
    for c in copies:
        by_layer.setdefault(int(c.layer), []).append(c)
    blocks, runs, offset = [], [], 0
    for layer in sorted(by_layer):
        batch = sorted(by_layer[layer], key=lambda c: c.slot)
        slots = np.array([c.slot for c in batch], dtype=np.int64)
        if (np.diff(slots) == 0).any():
            raise StrataError(f"--expert-policy: layer {layer}'s batch copies two experts into one slot")
        experts = np.array([c.expert for c in batch], dtype=np.intp)
        first = np.flatnonzero(np.diff(slots, prepend=slots[0] - 2) != 1)  # the rows that start a run
        counts = np.diff(np.append(first, len(slots)))
        for p, src in enumerate(srcs[layer]):
            row = int(src.shape[1])
            end = offset + len(batch) * row
            if end > staging.nbytes:  # the policy keeps a batch within --expert-max-copy, the buffer's size
                raise StrataError(f"--expert-policy: a batch past the {staging.nbytes}-byte staging buffer")
            blocks.append((staging[offset:end].reshape(len(batch), row), src, experts))
            runs += [Run(layer, p, int(slots[i]), int(k), offset + int(i) * row, row) for i, k in zip(first, counts)]
            offset = end
    gather_blocks(lib, threads, blocks)
    return runs
