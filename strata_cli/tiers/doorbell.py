"""The doorbell words of the expert tiers, host side: their layout, and the bounded wait for one 32-bit word (the
host writes its flags as plain numpy stores into the mapped words).

The protocol itself (per step: wait for the GPU's ring on `seq`, plan, flagA / flagB / flag) is served by
`tiers/host.py` TierHost (in Python per step, or in one C loop, `tiers/serve_loop.py`, for a window without a PCIe
share); its CPU tests drive both against a simulated GPU side (tests/test_tiers_doorbell.py, tests/test_tier_engine_host.py). The wait here is a pause-spin in C without the
GIL (tiers/native.py) in slices the caller chooses, so the serving thread reacts in microseconds and still looks,
between slices, at releases and at the GPU stream.
"""

from __future__ import annotations

import time

import numpy as np

from . import native

RELEASED = 0xFFFFFFFF
# the mapped u32 words (engine/gpu/tiers.py records the GPU's side, host.py serves the host's), then the first
# timed-out wait's code
SEQ, FLAG_A, FLAG_B, FLAG, ERR = range(5)
N_WORDS = 8


class StepRange:
    """The steps of a tiered window over layers [lo, hi) (the whole model, or one stage of the layer split): step
    k = (layer - lo) * G + group, rung as ring k + 1 (the GPU's ring() and wait codes, the host's serving loop and its
    stall lines all map here, so a stage that starts at layer lo > 0 numbers its steps from 0 and its wait-time table
    has a row per step of its own layers). Layer indexes stay global everywhere else."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = int(lo), int(hi)

    @property
    def layers(self) -> range:
        return range(self.lo, self.hi)

    def count(self, G: int) -> int:
        return (self.hi - self.lo) * G

    def ring(self, layer: int, grp: int, G: int) -> int:
        return (layer - self.lo) * G + grp + 1

    def at(self, step: int, G: int) -> tuple[int, int]:
        """(layer, group) of step k."""
        local, grp = divmod(step, G)
        return self.lo + local, grp


# ---- the wait: C (no GIL) when the host kernels are built, numpy otherwise
def _addr(word: np.ndarray) -> int:
    return word.ctypes.data


def wait_word(word: np.ndarray, want: int, max_s: float) -> int:
    """Spin until word >= want or max_s passed; returns the last value seen."""
    lib = native.load()
    if lib is not None:
        return int(lib.strata_wait_geq(_addr(word), want, int(max_s * 1e9)))
    deadline = time.perf_counter() + max_s
    while True:
        value = int(word[0])
        if value >= want or time.perf_counter() >= deadline:
            return value
        time.sleep(20e-6)
