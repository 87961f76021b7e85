"""The split-K workspace of the dense GEMVs whose input axis is split over grid z (kernels/common.cuh zsplit_finish):
launch_gemv (Q8_0, F16, ...) and launch_quant (the block types) both take it from here, so neither imports the
other for it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import launch_util as U
from .runtime import cupy, empty

ZSPLIT_TILES = 4096  # tiles (blocks along x times y) a z-split GEMV launch may have: n_out <= 16384, T <= 16


@dataclass
class SplitK:
    """The workspace of split-K GEMVs split over grid z: partial [GEMV_PARTIAL_FLOATS] f32 (raw sums of the z
    slices) and tile_done [ZSPLIT_TILES] uint32 arrival counters, which must start at zero (the last block of a tile
    resets its counter). Launches sharing one SplitK must run in order (one stream): an engine carves its own from
    its arena, so two engines on two streams never share one."""

    partial: object
    tile_done: object

    @classmethod
    def empty(cls) -> "SplitK":
        return cls(empty((U.GEMV_PARTIAL_FLOATS,), np.float32), cupy().zeros((ZSPLIT_TILES,), np.uint32))

    def check(self) -> "SplitK":
        U.check_array("split.partial", self.partial, np.float32, (U.GEMV_PARTIAL_FLOATS,))
        U.check_array("split.tile_done", self.tile_done, np.uint32, (ZSPLIT_TILES,))
        return self


def zsplit_args(grid: tuple, zsplit: int, split: SplitK | None) -> tuple:
    """The (partial, tile_done) kernel arguments of a dense GEMV launch on `grid`: null pointers without a z split,
    else the checked workspace (None: a fresh one, outside a capture only)."""
    if zsplit == 1:
        return U.null_or(None), U.null_or(None)
    if grid[0] * grid[1] > ZSPLIT_TILES:
        raise ValueError(f"y: a z-split launch of {grid[0] * grid[1]} tiles exceeds {ZSPLIT_TILES}")
    work = (split or SplitK.empty()).check()
    return work.partial, work.tile_done
