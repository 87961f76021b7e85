"""CuPy launchers of kernels/hyper.cu, mirroring strata_cli/ops/hyper.py (hc_write_read_raw, hc_up_mix, hc_write,
broadcast_streams). Same conventions as launch_gemv: CuPy arrays, float32, C-contiguous, `out=` and scratch
preallocated for graph capture, `stream=` None for the current stream.

hc_read is 3 launches: hc_write_norm (the pending write of the previous block and the norm; with a ReadNorm pending
that write's own kernel instead, the PLE layer's ple.cu ple_mix_norm), one GEMV over W_dn = [W_down; W_inject]
(ops/hyper.down_inject_rows: both projections read the same xn), and hc_up_mix (the up projection, the gates, the
mix and the inject gates).

Legend: T window rows, C streams, D hidden, L low rank, n_dn the rows of W_dn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import quants
from . import compile as nvrtc
from . import launch_util as U
from .launch_gemv import SplitK, launch_gemv
from .runtime import empty

UP_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)  # hc_up_mix reads W_up by raw_at
UP_SMEM_FLOATS = 48 * 1024 // 4  # hc_up_mix holds low [T, L] and its columns of xn in the default 48 KiB


def up_mix_smem_floats(T: int, C: int, L: int) -> int:
    """hc_up_mix's dynamic shared memory in floats: low [T, L] and the block's GEMV_WARPS columns of xn [T, C, 8]."""
    return T * (L + C * U.GEMV_WARPS)


@dataclass
class HcWeights:
    """One read's weights on the device: norm_w [C*D] f32, dn_raw [n_dn, C*D] raw rows of dn_type (W_down; W_inject;
    zero rows), L the low rank, n_inj the inject rows (C, or 0 for the head's read), up_raw [C*D, L] raw rows of
    up_type (one of UP_TYPES, not repacked)."""

    norm_w: object
    dn_raw: object
    dn_type: int
    L: int
    n_inj: int
    up_raw: object
    up_type: int


@dataclass
class CombineWrite:
    """A pending write whose block output is the MoE's combine (launch_moe.combine's arithmetic), computed by the
    read's first kernel: parts [>= T*K, D] the unweighted expert outputs (entry t*K + k), weights [T, K], shared
    [T, D] or None (added), inj [T, C] the write's gates."""

    parts: object
    weights: object
    shared: object
    inj: object


class ReadNorm:
    """A pending write whose read's first kernel another launcher module owns, in place of hc_write_norm:
    launch_norm(R, norm_w, xn, eps) checks its arguments and launches it, writing R (the write applied) and xn
    (the norm) as hc_write_norm does (launch_ple.PleMix: the PLE layer's mix, ple.cu ple_mix_norm)."""


@dataclass
class HcScratch:
    """Intermediates of hc_read: xn [>= T, C*D] and dn, a float32 buffer of at least T * n_dn values (its leading
    [T, n_dn] view is used)."""

    xn: object
    dn: object

    @classmethod
    def empty(cls, T: int, C: int, D: int, n_dn: int) -> "HcScratch":
        return cls(empty((T, C * D), np.float32), empty((T, n_dn), np.float32))


def _leading_rows(name: str, buf, T: int, width: int, xp_empty):
    """A contiguous [T, width] view at the start of a float32 buffer of at least T * width values."""
    if buf is None:
        return xp_empty((T, width), dtype=np.float32)
    if getattr(buf, "dtype", None) != np.float32 or not buf.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous float32 buffer")
    if buf.size < T * width:
        raise ValueError(f"{name}: {buf.size} values, the read needs {T} x {width}")
    return buf.reshape(-1)[:T * width].reshape(T, width)


def hc_read(R, w: HcWeights, eps: float, pending=None, out_mixed=None, out_inj=None,
            scratch: HcScratch | None = None, split: SplitK | None = None, stream=None, mark=None):
    """R [T, C, D] -> (mixed [T, D], inj [T, C] or None when w.n_inj is 0); reference ops/hyper.hc_write_read_raw.

    pending = (block_out [T, D], inj_prev [T, C]): the previous block's write R += block_out * inj_prev is applied
    to R in place first (hc_write's arithmetic), in the norm's kernel; a CombineWrite: block_out is the MoE's
    combine, computed there (no combine launch); a ReadNorm (launch_ple.PleMix): its own first kernel instead of
    hc_write_norm (the PLE layer's mix).
    out_inj may be inj_prev's buffer (the norm's kernel has read it before hc_up_mix writes). mark(part) is called
    after the "norm" ("write+norm") and "down" launches (the profiling graph's stamps)."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        CD = C * D
        if T > U.GEMV_MAXT:
            raise ValueError(f"R: {T} rows exceed hc_up_mix's {U.GEMV_MAXT}")
        U.check_array("norm_w", w.norm_w, np.float32, (CD,))
        n_dn = U.weight_rows("dn_raw", w.dn_raw, w.dn_type, CD)
        if n_dn < w.L + w.n_inj:
            raise ValueError(f"dn_raw: {n_dn} rows, expected at least L + n_inj = {w.L + w.n_inj}")
        if w.n_inj not in (0, C):
            raise ValueError(f"n_inj: {w.n_inj}, expected 0 (no inject gates) or C = {C}")
        if w.up_type not in UP_TYPES:
            raise ValueError(f"up_raw: type {U.type_name(w.up_type)} is not one of F32, F16, BF16, Q8_0 "
                             "(hc_up_mix reads it element-wise)")
        if not quants.fits(w.up_type, w.L):
            raise ValueError(f"up_raw: low rank {w.L} is not whole {U.type_name(w.up_type)} blocks")
        U.weight_rows("up_raw", w.up_raw, w.up_type, w.L, n_out=CD)
        if up_mix_smem_floats(T, C, w.L) > UP_SMEM_FLOATS:
            raise ValueError(f"up_raw: {T} rows x (low rank {w.L} + {C} streams x {U.GEMV_WARPS} columns) exceed "
                             f"hc_up_mix's shared memory ({UP_SMEM_FLOATS} floats)")
        if not w.n_inj and out_inj is not None:
            raise ValueError("out_inj: given, but the read has no inject rows (n_inj 0)")
        own_norm = isinstance(pending, ReadNorm)
        if not own_norm:
            bo, combine, inj_prev = pending_args(pending, T, C, D)
        s = scratch if scratch is not None else HcScratch(None, None)
        xn = U.scratch_rows("scratch.xn", s.xn, T, (CD,), empty)
        dn = _leading_rows("scratch.dn", s.dn, T, n_dn, empty)
        out_mixed = U.out_array("out_mixed", out_mixed, (T, D), np.float32, empty)
        if w.n_inj:
            out_inj = U.out_array("out_inj", out_inj, (T, C), np.float32, empty)

        if own_norm:
            pending.launch_norm(R, w.norm_w, xn, eps)
        else:
            nvrtc.kernel("hyper", "hc_write_norm")((T * C, 1, 1), (norm_threads(D), 1, 1), (
                R, U.null_or(bo), *combine, U.null_or(inj_prev), w.norm_w, xn, np.int32(C), np.int32(D),
                np.float32(eps)))
        _mark(mark, "norm" if pending is None else "write+norm")
        launch_gemv(w.dn_raw, w.dn_type, CD, xn, dn, split, div=float(C))
        _mark(mark, "down")
        nvrtc.kernel("hyper", "hc_up_mix")((-(-D // U.GEMV_WARPS), 1, 1), (U.GEMV_WARPS * 32, 1, 1), (
            xn, dn, np.int32(n_dn), np.int32(w.L), w.up_raw, np.int64(U.row_stride(w.up_type, w.L)),
            np.int32(w.up_type), out_mixed, U.null_or(out_inj if w.n_inj else None), np.int32(w.n_inj),
            np.int32(T), np.int32(C), np.int32(D)), shared_mem=4 * up_mix_smem_floats(T, C, w.L))
    return out_mixed, (out_inj if w.n_inj else None)


HC_NORM_THREADS = 512  # kernels/hyper.cu


def norm_threads(D: int) -> int:
    """hc_write_norm's block (and ple.cu ple_mix_norm's): about 4 of a stream's D elements a thread (held in
    registers, loaded together), whole warps, at most HC_NORM_THREADS."""
    return min(HC_NORM_THREADS, -(-D // 128) * 32)


def pending_args(pending, T: int, C: int, D: int):
    """(block_out or None, the combine's (parts, weights, shared, K) kernel arguments, inj_prev or None), checked:
    the kernel arguments of a pending write (None, (block_out [T, D], inj_prev [T, C]) or a CombineWrite) for the
    kernels that apply it (hyper.cu, ple.cu ple_mix_norm)."""
    none = (U.null_or(None),) * 3 + (np.int32(0),)
    if pending is None:
        return None, none, None
    if isinstance(pending, ReadNorm):
        raise ValueError(f"pending: a {type(pending).__name__} is a read's first kernel (hc_read) only")
    if isinstance(pending, CombineWrite):
        U.check_array("pending.weights", pending.weights, np.float32, (T, None))
        K = pending.weights.shape[1]
        U.check_array("pending.parts", pending.parts, np.float32, (None, D))
        if pending.parts.shape[0] < T * K:
            raise ValueError(f"pending.parts: {pending.parts.shape[0]} rows, the combine needs {T} x {K}")
        if pending.shared is not None:
            U.check_array("pending.shared", pending.shared, np.float32, (T, D))
        U.check_array("pending.inj", pending.inj, np.float32, (T, C))
        return None, (pending.parts, pending.weights, U.null_or(pending.shared), np.int32(K)), pending.inj
    bo, inj_prev = pending
    U.check_array("block_out", bo, np.float32, (T, D))
    U.check_array("inj_prev", inj_prev, np.float32, (T, C))
    return bo, none, inj_prev


def _mark(mark, part: str) -> None:
    if mark is not None:
        mark(part)


def hc_write(R, pending, out=None, stream=None):
    """R [T, C, D] + block_out [T, D] * inj [T, C] per stream -> out [T, C, D] (pass out=R to update in place);
    pending = (block_out, inj), or a CombineWrite (block_out the MoE's combine, computed in the same kernel)."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        if pending is None:
            raise ValueError("pending: None, expected (block_out, inj) or a CombineWrite")
        bo, combine, inj = pending_args(pending, T, C, D)
        out = U.out_array("out", out, (T, C, D), np.float32, empty)
        grid, block = U.elementwise_grid(T * C * D)
        nvrtc.kernel("hyper", "hc_write")(grid, block, (
            R, U.null_or(bo), *combine, inj, out, np.int32(T), np.int32(C), np.int32(D)))
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
