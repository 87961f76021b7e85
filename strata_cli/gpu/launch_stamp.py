"""CuPy launcher of kernels/stamp.cu: one `%globaltimer` stamp of the profiling window graph.

Legend: slots [S] uint64 ns, one per (layer, stage) (strata_cli/engine/stage_timing.py lays them out).
"""

from __future__ import annotations

import numpy as np

from . import compile as nvrtc
from . import launch_util as U


def stamp_kernel():
    """The stamp kernel, loaded (call before a capture: nothing may compile or load under capture)."""
    return nvrtc.kernel("stamp", "stamp_globaltimer")


def stamp(slots, slot: int, stream=None) -> None:
    """slots[slot] <- the GPU's nanosecond clock once every launch before it on the stream has finished."""
    with U.on_stream(stream):
        U.check_array("slots", slots, np.uint64, (None,))
        if not 0 <= slot < slots.shape[0]:
            raise ValueError(f"slot: {slot} outside 0..{slots.shape[0] - 1}")
        stamp_kernel()((1, 1, 1), (1, 1, 1), (slots, np.int32(slot)))
