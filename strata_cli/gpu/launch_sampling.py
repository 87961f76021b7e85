"""CuPy launchers of kernels/sampling.cu, mirroring strata_cli/ops/sampling.py (argmax_rows, sample_rows).
Same conventions as launch_gemv: `out=` and scratch preallocated for graph capture, `stream=` None for the
current stream.

Legend: T window rows, V vocabulary, P stage-1 partials per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import compile as nvrtc
from . import launch_util as U
from .runtime import empty

ARGMAX_CHUNK = 4096  # logits per stage-1 block
ARGMAX_MAX_PARTS = 1024
SAMPLE_BLOCK = 256  # kernels/sampling.cu sample_rows' shared arrays


@dataclass
class ArgmaxScratch:
    """Stage-1 partials of argmax_rows: values [GEMV_MAXT * ARGMAX_MAX_PARTS] f32, ids and non-finite flags (int32),
    and row_bad [GEMV_MAXT] int32, where the per-row non-finite flags go when the caller gives no `nonfinite`."""

    values: object
    ids: object
    bad: object
    row_bad: object

    @classmethod
    def empty(cls) -> "ArgmaxScratch":
        n = U.GEMV_MAXT * ARGMAX_MAX_PARTS
        return cls(empty((n,), np.float32), empty((n,), np.int32), empty((n,), np.int32),
                   empty((U.GEMV_MAXT,), np.int32))


def argmax_rows(logits, out=None, scratch: ArgmaxScratch | None = None, stream=None, nonfinite=None):
    """logits [T, V] f32 -> ids [T] int32, ties -> lower id (NaN logits are never picked). The same pass writes
    nonfinite [T] int32 (1 where the row holds a NaN/Inf; default: scratch.row_bad), as ops.sampling.nonfinite_rows."""
    with U.on_stream(stream):
        U.check_array("logits", logits, np.float32, (None, None))
        T, V = logits.shape
        out = U.out_array("out", out, (T,), np.int32, empty)
        parts = -(-V // ARGMAX_CHUNK)
        chunk = ARGMAX_CHUNK
        if parts > ARGMAX_MAX_PARTS:
            parts, chunk = ARGMAX_MAX_PARTS, -(-V // ARGMAX_MAX_PARTS)
        if T > U.GEMV_MAXT:
            raise ValueError(f"logits: {T} rows exceed {U.GEMV_MAXT}")
        s = scratch if scratch is not None else ArgmaxScratch.empty()
        n = U.GEMV_MAXT * ARGMAX_MAX_PARTS
        U.check_array("scratch.values", s.values, np.float32, (n,))
        U.check_array("scratch.ids", s.ids, np.int32, (n,))
        U.check_array("scratch.bad", s.bad, np.int32, (n,))
        U.check_array("scratch.row_bad", s.row_bad, np.int32, (U.GEMV_MAXT,))
        flags = s.row_bad[:T] if nonfinite is None else nonfinite
        U.check_array("nonfinite", flags, np.int32, (T,))
        nvrtc.kernel("sampling", "argmax_partial")((parts, T, 1), (256, 1, 1), (
            logits, np.int32(V), np.int32(chunk), s.values, s.ids, s.bad))
        nvrtc.kernel("sampling", "argmax_rows")((T, 1, 1), (256, 1, 1), (
            s.values, s.ids, s.bad, np.int32(parts), out, flags))
    return out


def sample_rows(logits, positions, temperature: float, seed: int, out=None, stream=None):
    """logits [T, V] f32, positions [T] int32 -> ids [T] int32: argmax(logits / temperature + gumbel(seed, pos)),
    the draws of ops.sampling.sample_rows (Philox keyed by absolute position). temperature must be > 0."""
    with U.on_stream(stream):
        U.check_array("logits", logits, np.float32, (None, None))
        T, V = logits.shape
        U.check_array("positions", positions, np.int32, (T,))
        if not temperature > 0:
            raise ValueError(f"temperature: {temperature}, expected > 0 (greedy ids come from argmax_rows)")
        out = U.out_array("out", out, (T,), np.int32, empty)
        nvrtc.kernel("sampling", "sample_rows")((T, 1, 1), (SAMPLE_BLOCK, 1, 1), (
            logits, np.int32(V), positions, np.float64(1.0 / temperature), np.uint64(seed), out))
    return out
