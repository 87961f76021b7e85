"""CuPy launchers of kernels/hyper.cu, mirroring strata_cli/ops/hyper.py (hc_read_raw, hc_write,
broadcast_streams). Same conventions as launch_gemv: CuPy arrays, float32, C-contiguous, `out=` and scratch
preallocated for graph capture, `stream=` None for the current stream. The down, up and inject projections are
launch_gemv launches with fused epilogues. hc_read_fused is the same read in 4 launches that also applies the
previous block's pending hc_write (reference: ops/hyper.hc_write_read_raw).

Legend: T window rows, C streams, D hidden, L low rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import quants
from . import compile as nvrtc
from . import launch_util as U
from .launch_gemv import SplitK, launch_gemv
from .runtime import empty


@dataclass
class HcScratch:
    """Intermediates of hc_read: xn [T, C*D], low [T, L], gates [T, C*D], and for hc_read_fused the inject partial
    dots inj_part [T, C*C]; may hold more rows than the window."""

    xn: object
    low: object
    gates: object
    inj_part: object = None

    @classmethod
    def empty(cls, T: int, C: int, D: int, L: int) -> "HcScratch":
        return cls(empty((T, C * D), np.float32), empty((T, L), np.float32), empty((T, C * D), np.float32),
                   empty((T, C * C), np.float32))


def _read_operands(R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, out_mixed, out_inj,
                   scratch):
    """The checked operands of an HC read (both launch sequences): T, C, D, L, the scratch, its xn / low / gates
    rows, and the outputs (mixed, inj or None)."""
    U.check_array("R", R, np.float32, (None, None, None))
    T, C, D = R.shape
    CD = C * D
    U.check_array("norm_w", norm_w, np.float32, (CD,))
    L = U.weight_rows("down_raw", down_raw, down_type, CD)
    U.weight_rows("up_raw", up_raw, up_type, L, n_out=CD)
    if inject_raw is not None:
        U.weight_rows("inject_raw", inject_raw, inject_type, CD, n_out=C)
    elif out_inj is not None:
        raise ValueError("out_inj: given, but inject_raw is None (no inject gates to write)")
    s = scratch if scratch is not None else HcScratch(None, None, None)
    xn = U.scratch_rows("scratch.xn", s.xn, T, (CD,), empty)
    low = U.scratch_rows("scratch.low", s.low, T, (L,), empty)
    gates = U.scratch_rows("scratch.gates", s.gates, T, (CD,), empty)
    out_mixed = U.out_array("out_mixed", out_mixed, (T, D), np.float32, empty)
    if inject_raw is not None:
        out_inj = U.out_array("out_inj", out_inj, (T, C), np.float32, empty)
    return T, C, D, L, s, xn, low, gates, out_mixed, out_inj


def hc_read(R, norm_w, down_raw, down_type: int, up_raw, up_type: int, inject_raw, inject_type: int | None,
            eps: float, out_mixed=None, out_inj=None, scratch: HcScratch | None = None, split: SplitK | None = None,
            stream=None, mark=None, pending=None):
    """R [T, C, D] -> (mixed [T, D], inj [T, C] or None when inject_raw is None); see kernels/hyper.cu.

    norm_w [C*D] f32; down_raw [L, C*D], up_raw [C*D, L], inject_raw [C, C*D] raw rows of their GGML types.
    pending = (block_out [T, D], inj_prev [T, C]): the norm's kernel applies that write to R in place first
    (hc_write_norm without inject partials: hc_write + hc_norm bit for bit, one node). mark(part) is called after
    the "norm" ("write+norm"), "down" and "up" launches (the profiling graph's stamps)."""
    with U.on_stream(stream):
        T, C, D, L, _, xn, low, gates, out_mixed, out_inj = _read_operands(
            R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, out_mixed, out_inj, scratch)
        CD = C * D

        if pending is None:
            nvrtc.kernel("hyper", "hc_norm")((T * C, 1, 1), (U.BLOCK, 1, 1), (
                R, norm_w, xn, np.int32(C), np.int32(D), np.float32(eps)))
        else:
            _write_norm(R, pending, norm_w, xn, None, 0, None, C, D, eps)
        _mark(mark, "norm" if pending is None else "write+norm")
        launch_gemv(down_raw, down_type, CD, xn, low, split, act=U.ACT_SILU, div=float(C))
        _mark(mark, "down")
        launch_gemv(up_raw, up_type, L, low, gates, split, act=U.ACT_SIGMOID)
        _mark(mark, "up")
        grid, block = U.elementwise_grid(T * D)
        nvrtc.kernel("hyper", "hc_mix")(grid, block, (xn, gates, out_mixed, np.int32(T), np.int32(C), np.int32(D)))
        if inject_raw is not None:
            launch_gemv(inject_raw, inject_type, CD, xn, out_inj, split, act=U.ACT_2SIGMOID, div=float(C))
    return out_mixed, (out_inj if inject_raw is not None else None)


FUSED_INJECT_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)  # hc_write_norm's raw_at decodes these


def hc_read_fused(R, norm_w, down_raw, down_type: int, up_raw, up_type: int, inject_raw, inject_type: int | None,
                  eps: float, pending=None, out_mixed=None, out_inj=None, scratch: HcScratch | None = None,
                  split: SplitK | None = None, stream=None, mark=None):
    """hc_read of R after the pending write: pending = (block_out [T, D], inj_prev [T, C]) or None, and R [T, C, D]
    is updated in place to R + block_out * inj_prev first (hc_write). Returns (mixed, inj) as hc_read does.

    Launches hc_write_norm, the down and up GEMVs, hc_mix_inject (4 nodes; hc_write + hc_read take 6). The inject
    GEMV becomes per-stream partial dots summed over the streams (reassociated). An inject matrix of another type
    than F32/F16/BF16/Q8_0 takes hc_read(pending=) instead. mark(part): after "norm" (write + norm + inject
    partials), "down" and "up"."""
    if inject_raw is not None and inject_type not in FUSED_INJECT_TYPES:
        return hc_read(R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, eps,
                       out_mixed=out_mixed, out_inj=out_inj, scratch=scratch, split=split, stream=stream, mark=mark,
                       pending=pending)
    with U.on_stream(stream):
        T, C, D, L, s, xn, low, gates, out_mixed, out_inj = _read_operands(
            R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, out_mixed, out_inj, scratch)
        CD = C * D
        injp = U.scratch_rows("scratch.inj_part", s.inj_part, T, (C * C,), empty) if inject_raw is not None else None
        inj_stride = U.row_stride(inject_type, CD) if inject_raw is not None else 0
        _write_norm(R, pending, norm_w, xn, inject_raw, inj_stride, injp, C, D, eps,
                    inject_type if inject_raw is not None else 0)
        _mark(mark, "write+norm" if pending is not None else "norm")
        launch_gemv(down_raw, down_type, CD, xn, low, split, act=U.ACT_SILU, div=float(C))
        _mark(mark, "down")
        launch_gemv(up_raw, up_type, L, low, gates, split, act=U.ACT_SIGMOID)
        _mark(mark, "up")
        grid, block = U.elementwise_grid(T * D)
        nvrtc.kernel("hyper", "hc_mix_inject")(grid, block, (
            xn, gates, out_mixed, U.null_or(injp), U.null_or(out_inj if inject_raw is not None else None),
            np.int32(T), np.int32(C), np.int32(D)))
    return out_mixed, (out_inj if inject_raw is not None else None)


def _write_norm(R, pending, norm_w, xn, inject_raw, inj_stride: int, injp, C: int, D: int, eps: float,
                inject_type: int = 0) -> None:
    """hc_write_norm over R [T, C, D]: the pending write (block_out, inj_prev) or None (checked here), the norm into
    xn, and with inject_raw the inject partial dots into injp."""
    T = R.shape[0]
    if pending is not None:
        U.check_array("block_out", pending[0], np.float32, (T, D))
        U.check_array("inj_prev", pending[1], np.float32, (T, C))
    bo, inj_prev = pending if pending is not None else (None, None)
    nvrtc.kernel("hyper", "hc_write_norm")((T * C, 1, 1), (U.BLOCK, 1, 1), (
        R, U.null_or(bo), U.null_or(inj_prev), norm_w, xn, U.null_or(inject_raw), np.int64(inj_stride),
        np.int32(inject_type), U.null_or(injp), np.int32(C), np.int32(D), np.float32(eps)))


def _mark(mark, part: str) -> None:
    if mark is not None:
        mark(part)


def hc_write(R, block_out, inj, out=None, stream=None):
    """R [T, C, D] + block_out [T, D] * inj [T, C] per stream -> out [T, C, D] (pass out=R to update in place)."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        U.check_array("block_out", block_out, np.float32, (T, D))
        U.check_array("inj", inj, np.float32, (T, C))
        out = U.out_array("out", out, (T, C, D), np.float32, empty)
        grid, block = U.elementwise_grid(T * C * D)
        nvrtc.kernel("hyper", "hc_write")(grid, block, (
            R, block_out, inj, out, np.int32(T), np.int32(C), np.int32(D)))
    return out


def broadcast_streams(emb, C: int, out=None, stream=None):
    """emb [T, D] -> R [T, C, D]: the residual stack of a window starts as C copies of its embedding rows."""
    with U.on_stream(stream):
        U.check_array("emb", emb, np.float32, (None, None))
        T, D = emb.shape
        out = U.out_array("out", out, (T, C, D), np.float32, empty)
        n = T * C * D
        nvrtc.kernel("hyper", "broadcast_streams")((-(-n // U.BLOCK), 1, 1), (U.BLOCK, 1, 1), (
            emb, out, np.int32(T), np.int32(C), np.int32(D)))
    return out
