"""CuPy launchers of kernels/qsa.cu, mirroring strata_cli/ops/qsa.py.

Arrays are CuPy, float32 (positions, cells, counts int32), C-contiguous unless said otherwise; `out=`-style buffers
are checked, never reallocated (graph capture), `stream=None` is the current stream. Rope tables are whole
tables by absolute position, cos/sin [P, n_rot] (rope_tables below); the ops take positions and build per-row tables
instead. A window (qsa_mix) writes its rows' K/V cells live and only reads the indexer's tail and pooled keys; the
commit appends the kept keys (indexer_commit; engine/state.py).

Legend: T window rows, H query heads, Hk kv heads, Hi indexer heads, d head dim, di indexer head dim, N cells, NB
pooled blocks, C selected-cell capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import qsa as ops_qsa
from . import compile as nvrtc
from . import launch_util as U
from . import seq_util as S
from .runtime import cupy, empty

QSA_BLOCK = 128  # kernels/qsa.cu
MIX_WARPS, ATT_MAXR = 16, 8  # kernels/qsa.cu
MIX_THREADS = MIX_WARPS * 32
# dynamic shared memory of one qsa_mix block: 48 KB less its static part (select_row's histogram and scan, 4.1 KB)
MIX_SHARED = 44 * 1024


def rope_tables(n_pos: int, n_rot: int, base: float):
    """cos, sin [n_pos, n_rot] on the device for positions 0..n_pos-1 (float64 angles on the host)."""
    cos, sin = ops_qsa.rope_tables(np.arange(n_pos), n_rot, base)
    return cupy().asarray(cos), cupy().asarray(sin)


def _check_tables(cos, sin, d: int) -> int:
    U.check_array("cos", cos, np.float32, (None, None))
    U.check_array("sin", sin, np.float32, cos.shape)
    n_rot = cos.shape[1]
    if n_rot % 2 or n_rot > d:
        raise ValueError(f"cos: {n_rot} rotated dims, expected an even number <= head dim {d}")
    return n_rot


def norm_rope(x, w, eps: float, cos, sin, positions=None, out=None, stream=None):
    """rope_neox(rms_norm(x, w, eps), cos[row], sin[row]) -> out [T, H, d], row = positions[t] (None: row t).

    x [T, H, d] may be a view whose last axis is contiguous, e.g. qg[..., :d] of attn_q's [T, H, 2d]."""
    with U.on_stream(stream):
        xs_t, xs_h = S.check_rows_view("x", x, 3)
        T, H, d = x.shape
        U.check_array("w", w, np.float32, (d,))
        n_rot = _check_tables(cos, sin, d)
        if positions is None:
            if cos.shape[0] < T:
                raise ValueError(f"cos: {cos.shape[0]} rows, the window has {T} (pass positions for whole tables)")
        else:
            S.check_positions("positions", positions, T)
        out = U.out_array("out", out, (T, H, d), np.float32, empty)
        nvrtc.kernel("qsa", "qsa_norm_rope")((T * H, 1, 1), (QSA_BLOCK, 1, 1), (
            x, xs_t, xs_h, w, cos, sin, U.null_or(positions), out, np.int32(H), np.int32(d), np.int32(n_rot),
            np.float32(eps)), shared_mem=d * 4)
    return out


def indexer_commit(tail, pooled, raw_keys, positions, n_keep, k_norm_w, eps: float, cos, sin, n_keep_dev=None,
                   stream=None):
    """The window's first n_keep raw indexer keys raw_keys [T, di] appended at their positions to tail [ratio, di] and
    pooled [NB, di], in place (ops.qsa.indexer_append with whole rope tables; re-pools any block they complete). The
    window only read the tail, so it holds the committed keys. n_keep_dev: int32 [1] on the device, read when the
    kernel runs (a captured commit serves every n_keep)."""
    with U.on_stream(stream):
        U.check_array("tail", tail, np.float32, (None, None))
        ratio, d = tail.shape
        U.check_array("pooled", pooled, np.float32, (None, d))
        U.check_array("raw_keys", raw_keys, np.float32, (None, d))
        T = raw_keys.shape[0]
        S.check_positions("positions", positions, T)
        U.check_array("k_norm_w", k_norm_w, np.float32, (d,))
        n_rot = _check_tables(cos, sin, d)
        n, n_dev = S.commit_count(n_keep, n_keep_dev, T)
        nvrtc.kernel("qsa", "qsa_indexer_append")((1, 1, 1), (QSA_BLOCK, 1, 1), (
            tail, pooled, raw_keys, positions, np.int32(T), n, n_dev, k_norm_w, cos, sin, np.int32(ratio),
            np.int32(d), np.int32(n_rot), np.float32(eps)), shared_mem=d * 4)


@dataclass
class SelectScratch:
    """qsa_mix's selection state of T rows over NB pooled blocks, C cells a row: scores [T, NB] float32, cells [T, C]
    and counts [T] int32 (written for the rows above the budget only), the selection's scratch keys (uint32), idx and
    flags (int32) [T, NB]; and its counters, zero between launches (each launch puts them back): done [T] (a row's
    score blocks arrived), ready [T] (its cells are written), seen [T] (its attention blocks passed), ticket [1]
    (the blocks' start order)."""

    scores: object
    cells: object
    counts: object
    keys: object
    idx: object
    flags: object
    done: object
    ready: object
    seen: object
    ticket: object

    @classmethod
    def empty(cls, T: int, NB: int, C: int) -> "SelectScratch":
        cp = cupy()
        return cls(empty((T, NB), np.float32), empty((T, C), np.int32), empty((T,), np.int32),
                   empty((T, NB), np.uint32), empty((T, NB), np.int32), empty((T, NB), np.int32),
                   *(cp.zeros((n,), np.int32) for n in (T, T, T, 1)))

    def check(self, T: int, NB: int, C: int) -> None:
        for name, dtype, shape in (("scores", np.float32, (T, NB)), ("cells", np.int32, (T, C)),
                                   ("counts", np.int32, (T,)), ("keys", np.uint32, (T, NB)),
                                   ("idx", np.int32, (T, NB)), ("flags", np.int32, (T, NB)),
                                   ("done", np.int32, (T,)), ("ready", np.int32, (T,)), ("seen", np.int32, (T,)),
                                   ("ticket", np.int32, (1,))):
            U.check_array(f"scratch.{name}", getattr(self, name), dtype, shape)


def cell_capacity(ratio: int, budget: int) -> int:
    """Most cells a row selects: the kept blocks' cells plus up to ratio-1 cells after the last complete block."""
    return max((budget // ratio) * ratio + ratio - 1, 1)


def score_blocks(NB: int, T: int, sms: int) -> int:
    """Score blocks a row of qsa_mix (SY): one per MIX_WARPS pooled blocks, at most about two blocks an SM over the
    window's rows (each loops over its chunks): a row below the budget, the common case, launches them for nothing."""
    return max(1, min(-(-NB // MIX_WARPS), -(-2 * sms // T)))


@dataclass
class Indexer:
    """qsa_mix's indexer operands: qr [T, Hi, di] the query rows and qi_w [di] their norm, keys [T, di] the raw keys
    (views whose last axis is contiguous: the layer's GEMV rows), k_norm_w [di] the pooled keys' norm, tail [ratio,
    di] and pooled [NB, di] (only read: the window pools the blocks it completes itself), budget the cells a row
    keeps; raw [>= T, di] receives the keys for the commit (None: keys already are raw's first rows); scratch (None:
    allocated)."""

    qr: object
    qi_w: object
    keys: object
    k_norm_w: object
    tail: object
    pooled: object
    budget: int
    raw: object = None
    scratch: SelectScratch | None = None


def qsa_mix(k, v, q, gate, k_w, q_w, k_cache, v_cache, cos, sin, positions, eps: float,
            indexer: Indexer | None = None, out=None, stream=None):
    """A QSA layer's window after its projection GEMV in one launch (kernels/qsa.cu qsa_mix; reference ops.qsa.qsa_mix
    with whole rope tables): k_cache / v_cache [N, Hk, d] get the rows' rope(rms_norm(k) * k_w) and v at positions
    (in place); returns out [T, H*d], row t = attend_selected of rope(rms_norm(q[t]) * q_w) gated by gate[t] over
    every cell 0..positions[t], or with the indexer over select_cells of its block scores (the selection of the rows
    above the budget left in indexer.scratch). Positions are the window's: consecutive.

    k, v [T, Hk, d], q, gate [T, H, d] (qg[..., :d] and qg[..., d:] of attn_q's [T, H, 2d]): views whose last axis
    is contiguous, k and v heads d values apart; cos, sin [P, n_rot] by position."""
    with U.on_stream(stream):
        U.check_array("k_cache", k_cache, np.float32, (None, None, None))
        N, Hk, d = k_cache.shape
        U.check_array("v_cache", v_cache, np.float32, (N, Hk, d))
        ks, kh = S.check_rows_view("k", k, 3, (None, Hk, d))
        T = k.shape[0]
        vs, vh = S.check_rows_view("v", v, 3, (T, Hk, d))
        qs, qh = S.check_rows_view("q", q, 3, (T, None, d))
        H = q.shape[1]
        gs, gh = S.check_rows_view("gate", gate, 3, (T, H, d))
        for name, h_stride in (("k", kh), ("v", vh)):  # a head axis of one element may carry any stride
            if Hk > 1 and h_stride != d:
                raise ValueError(f"{name}: its heads are {h_stride} values apart, expected {d}")
        if H % Hk:
            raise ValueError(f"q: {H} heads are not a multiple of the cache's {Hk} kv heads")
        if d > 32 * ATT_MAXR:
            raise ValueError(f"q: head dim {d} exceeds the kernel's {32 * ATT_MAXR}")
        U.check_array("k_w", k_w, np.float32, (d,))
        U.check_array("q_w", q_w, np.float32, (d,))
        n_rot = _check_tables(cos, sin, d)
        S.check_positions("positions", positions, T)
        shared = (2 + T + MIX_WARPS) * d + 2 * MIX_WARPS
        idx_args = (U.null_or(None), np.int64(0), U.null_or(None), U.null_or(None), np.int64(0), U.null_or(None),
                    U.null_or(None), U.null_or(None), U.null_or(None), np.int32(0), np.int32(1), np.int32(0),
                    np.int32(0), np.int32(1), np.int32(1), np.int32(1), np.float32(1))
        sel_args = (U.null_or(None),) * 10
        SY = 0
        if indexer is not None:
            ix = indexer
            is_, ih = S.check_rows_view("indexer.qr", ix.qr, 3, (T, None, None))
            Hi, di = ix.qr.shape[1:]
            if Hi > 1 and ih != di:
                raise ValueError(f"indexer.qr: its heads are {ih} values apart, expected {di}")
            if n_rot > di:
                raise ValueError(f"cos: {n_rot} rotated dims exceed the indexer head dim {di}")
            U.check_array("indexer.qi_w", ix.qi_w, np.float32, (di,))
            (iks,) = S.check_rows_view("indexer.keys", ix.keys, 2, (T, di))
            U.check_array("indexer.k_norm_w", ix.k_norm_w, np.float32, (di,))
            U.check_array("indexer.tail", ix.tail, np.float32, (None, di))
            ratio = ix.tail.shape[0]
            U.check_array("indexer.pooled", ix.pooled, np.float32, (None, di))
            NB = ix.pooled.shape[0]
            if ix.budget < 0:
                raise ValueError(f"indexer.budget: {ix.budget}, expected >= 0")
            if ix.raw is not None:
                U.check_array("indexer.raw", ix.raw, np.float32, (None, di))
                if ix.raw.shape[0] < T:
                    raise ValueError(f"indexer.raw: {ix.raw.shape[0]} rows, the window has {T}")
            C = cell_capacity(ratio, ix.budget)
            sc = ix.scratch if ix.scratch is not None else SelectScratch.empty(T, NB, C)
            sc.check(T, NB, C)
            SY = score_blocks(NB, T, U.sm_count())
            shared = max(shared, (Hi + T + MIX_WARPS) * di)
            idx_args = (ix.qr, is_, ix.qi_w, ix.keys, iks, ix.k_norm_w, ix.tail, ix.pooled, U.null_or(ix.raw),
                        np.int32(Hi), np.int32(di), np.int32(ratio), np.int32(ix.budget), np.int32(NB), np.int32(C),
                        np.int32(SY), np.float32(np.sqrt(di)))
            sel_args = (sc.scores, sc.cells, sc.counts, sc.keys, sc.idx, sc.flags, sc.done, sc.ready, sc.seen,
                        sc.ticket)
        if shared * 4 > MIX_SHARED:
            raise ValueError(f"k: {T} rows of head dim {d} need {shared * 4} bytes of shared memory, the kernel has "
                             f"{MIX_SHARED}")
        out = U.out_array("out", out, (T, H * d), np.float32, empty)
        nvrtc.kernel("qsa", "qsa_mix")((T * (H + SY), 1, 1), (MIX_THREADS, 1, 1), (
            k, ks, v, vs, q, qs, qh, gate, gs, gh, k_w, q_w, k_cache, v_cache, cos, sin, positions, out, np.int32(T),
            np.int32(H), np.int32(Hk), np.int32(d), np.int32(n_rot), np.float32(eps), np.float32(np.sqrt(d)),
            *idx_args, *sel_args), shared_mem=shared * 4)
    return out
