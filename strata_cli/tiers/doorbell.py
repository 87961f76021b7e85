"""The doorbell words of the expert tiers, host side: their layout, and the bounded wait for one 32-bit word (the
host writes its flags as plain numpy stores into the mapped words).

The protocol itself (per step: wait for the GPU's ring on `seq`, plan, flagA / flagB / flag) is served by one
implementation, `tiers/host.py` TierHost; its CPU tests drive it against a simulated GPU
side (tests/test_tiers_doorbell.py, tests/test_tier_engine_host.py). The wait here is a pause-spin in C without the
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
