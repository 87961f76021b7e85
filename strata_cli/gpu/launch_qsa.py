"""CuPy launchers of kernels/qsa.cu and qsa_select.cu, mirroring strata_cli/ops/qsa.py.

Arrays are CuPy, float32 (positions, cells, counts int32), C-contiguous unless said otherwise; `out=`-style buffers
are checked, never reallocated (graph capture), `stream=None` is the current stream. Rope tables are whole
tables by absolute position, cos/sin [P, n_rot] (rope_tables below); the ops take per-row tables instead.
K/V cells and pooled blocks are written live by a window; the indexer tail is snapshotted by indexer_append
and rebuilt by indexer_commit (engine/state.py).

Legend: T window rows, H query heads, Hk kv heads, Hi indexer heads, d head dim, N cells, NB pooled blocks.
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
ATT_WARPS, ATT_MAXR = 16, 8  # kernels/qsa.cu
SEL_BLOCK = 256  # kernels/qsa_select.cu
MAX_SHARED = 48 * 1024


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


@dataclass
class IndexerKeys:
    """The indexer's key append inside prep: keys [T, di] the window's raw keys (a view of its GEMV's rows), raw
    [>= r0 + T, di] the layer's raw-key buffer (rows r0.. receive keys; the commit re-appends them), r0 the group's
    first row (rows [0, r0) are an earlier group's, already in raw), positions [r0 + T] of rows [0, r0 + T), tail
    and snapshot [ratio, di], pooled [NB, di], k_norm_w [di]."""

    keys: object
    raw: object
    r0: int
    positions: object
    tail: object
    snapshot: object
    pooled: object
    k_norm_w: object


def prep(k, v, q, k_w, q_w, k_cache, v_cache, cos, sin, positions, eps: float, out_qn=None, qr=None, qi_w=None,
         out_qi=None, indexer: IndexerKeys | None = None, stream=None):
    """A QSA layer's window rows after its projection GEMV in one launch (kernels/qsa.cu qsa_prep; reference
    ops.qsa.prep_window with whole rope tables): k_cache[positions] = rope(rms_norm(k) * k_w), v_cache[positions] =
    v (in place), returns qn = rope(rms_norm(q) * q_w) [T, H, d] and, with the indexer query qr, qi =
    rope(rms_norm(qr) * qi_w) [T, Hi, di] (else None). indexer (with qr): the window's indexer keys appended too, as
    indexer_append(raw[:r0 + T], snapshot=) after raw[r0:r0 + T] = keys, by one more block of the launch.

    k, v [T, Hk, d], q [T, H, d], qr [T, Hi, di]: views whose last axis is contiguous (rows of the layer's one
    GEMV); k and v heads d values apart, qr's di apart; caches [N, Hk, d]; cos, sin [P, n_rot] by position."""
    with U.on_stream(stream):
        U.check_array("k_cache", k_cache, np.float32, (None, None, None))
        N, Hk, d = k_cache.shape
        U.check_array("v_cache", v_cache, np.float32, (N, Hk, d))
        ks, kh = S.check_rows_view("k", k, 3, (None, Hk, d))
        T = k.shape[0]
        vs, vh = S.check_rows_view("v", v, 3, (T, Hk, d))
        qs, qh = S.check_rows_view("q", q, 3, (T, None, d))
        H = q.shape[1]
        for name, h_stride in (("k", kh), ("v", vh)):  # a head axis of one element may carry any stride
            if Hk > 1 and h_stride != d:
                raise ValueError(f"{name}: its heads are {h_stride} values apart, expected {d}")
        U.check_array("k_w", k_w, np.float32, (d,))
        U.check_array("q_w", q_w, np.float32, (d,))
        n_rot = _check_tables(cos, sin, d)
        S.check_positions("positions", positions, T)
        Hi, di, is_ = 0, 1, np.int64(0)
        if qr is not None:
            is_, ih = S.check_rows_view("qr", qr, 3, (T, None, None))
            Hi, di = qr.shape[1:]
            if Hi > 1 and ih != di:
                raise ValueError(f"qr: its heads are {ih} values apart, expected {di}")
            if n_rot > di:
                raise ValueError(f"cos: {n_rot} rotated dims exceed the indexer head dim {di}")
            U.check_array("qi_w", qi_w, np.float32, (di,))
        elif qi_w is not None or out_qi is not None or indexer is not None:
            raise ValueError("qi_w / out_qi / indexer: given without the indexer query qr")
        idx_args = (U.null_or(None), np.int64(0), U.null_or(None), np.int32(0), U.null_or(None), U.null_or(None),
                    U.null_or(None), U.null_or(None), U.null_or(None), np.int32(1))
        if indexer is not None:
            ix = indexer
            (iks,) = S.check_rows_view("indexer.keys", ix.keys, 2, (T, di))
            U.check_array("indexer.tail", ix.tail, np.float32, (None, di))
            ratio = ix.tail.shape[0]
            U.check_array("indexer.snapshot", ix.snapshot, np.float32, (ratio, di))
            U.check_array("indexer.pooled", ix.pooled, np.float32, (None, di))
            U.check_array("indexer.raw", ix.raw, np.float32, (None, di))
            if not 0 <= ix.r0 or ix.raw.shape[0] < ix.r0 + T:
                raise ValueError(f"indexer.raw: {ix.raw.shape[0]} rows, the window's group needs rows up to "
                                 f"{ix.r0} + {T}")
            S.check_positions("indexer.positions", ix.positions, ix.r0 + T)
            U.check_array("indexer.k_norm_w", ix.k_norm_w, np.float32, (di,))
            idx_args = (ix.keys, iks, ix.raw, np.int32(ix.r0), ix.positions, ix.tail, ix.snapshot, ix.pooled,
                        ix.k_norm_w, np.int32(ratio))
        out_qn = U.out_array("out_qn", out_qn, (T, H, d), np.float32, empty)
        if qr is not None:
            out_qi = U.out_array("out_qi", out_qi, (T, Hi, di), np.float32, empty)
        blocks = T * (2 * Hk + H + Hi) + (indexer is not None)
        nvrtc.kernel("qsa", "qsa_prep")((blocks, 1, 1), (QSA_BLOCK, 1, 1), (
            k, ks, v, vs, q, qs, qh, U.null_or(qr), is_, k_w, q_w, U.null_or(qi_w), k_cache, v_cache, out_qn,
            U.null_or(out_qi), cos, sin, positions, np.int32(T), np.int32(Hk), np.int32(H), np.int32(Hi),
            np.int32(d), np.int32(di), np.int32(n_rot), np.float32(eps), *idx_args), shared_mem=max(d, di) * 4)
    return out_qn, (out_qi if qr is not None else None)


def _indexer(tail, pooled, raw_keys, positions, k_norm_w, eps, cos, sin, n_keep, n_keep_dev, save, restore):
    """n_keep None: append every row (the run)."""
    U.check_array("tail", tail, np.float32, (None, None))
    ratio, d = tail.shape
    U.check_array("pooled", pooled, np.float32, (None, d))
    U.check_array("raw_keys", raw_keys, np.float32, (None, d))
    T = raw_keys.shape[0]
    S.check_positions("positions", positions, T)
    U.check_array("k_norm_w", k_norm_w, np.float32, (d,))
    n_rot = _check_tables(cos, sin, d)
    for snap in (save, restore):
        if snap is not None:
            U.check_array("snapshot", snap, np.float32, (ratio, d))
    n, n_dev = S.commit_count(T if n_keep is None else n_keep, n_keep_dev, T)
    nvrtc.kernel("qsa", "qsa_indexer_append")((1, 1, 1), (QSA_BLOCK, 1, 1), (
        tail, pooled, raw_keys, positions, np.int32(T), n, n_dev, U.null_or(save), U.null_or(restore), k_norm_w,
        cos, sin, np.int32(ratio), np.int32(d), np.int32(n_rot), np.float32(eps)), shared_mem=d * 4)


def indexer_append(tail, pooled, raw_keys, positions, k_norm_w, eps: float, cos, sin, snapshot=None, stream=None):
    """Append raw indexer keys [T, d] at consecutive positions into tail [ratio, d] / pooled [NB, d], in place
    (ops.qsa.indexer_append with whole rope tables); snapshot [ratio, d], if given, receives the tail first and the
    tail goes back to it at the end (the window's run: only the blocks it completes are pooled)."""
    with U.on_stream(stream):
        _indexer(tail, pooled, raw_keys, positions, k_norm_w, eps, cos, sin, None, None, snapshot, None)


def indexer_commit(tail, pooled, snapshot, raw_keys, positions, n_keep, k_norm_w, eps: float, cos, sin,
                   n_keep_dev=None, stream=None):
    """tail <- snapshot, then the window's first n_keep raw keys re-appended at their positions (re-pools any
    block they complete)."""
    with U.on_stream(stream):
        if snapshot is None:
            raise ValueError("snapshot: None (the commit restores the tail the window snapshotted)")
        _indexer(tail, pooled, raw_keys, positions, k_norm_w, eps, cos, sin, n_keep, n_keep_dev, None, snapshot)


@dataclass
class SelectScratch:
    """Per-row scratch of score_select: keys (uint32), idx and flags (int32), each [T, NB]; done [T] int32, zero
    (the launch's per-row block counter: its last block puts it back to zero)."""

    keys: object
    idx: object
    flags: object
    done: object

    @classmethod
    def empty(cls, T: int, NB: int) -> "SelectScratch":
        return cls(empty((T, NB), np.uint32), empty((T, NB), np.int32), empty((T, NB), np.int32),
                   cupy().zeros((T,), np.int32))


def cell_capacity(ratio: int, budget: int) -> int:
    """Most cells a row selects: the kept blocks' cells plus up to ratio-1 cells after the last complete block."""
    return max((budget // ratio) * ratio + ratio - 1, 1)


def score_select(q_idx, pooled, positions, ratio: int, budget: int, scores=None, cells=None, counts=None,
                 scratch: SelectScratch | None = None, stream=None):
    """Block scores and the cell selection of every row in one launch (kernels/qsa_select.cu qsa_score_select):
    scores [T, NB], row t = ops.qsa.block_scores(q_idx[t], pooled[:n_blocks]) with n_blocks = (pos+1) // ratio,
    then -inf; cells [T, cell_capacity] int32, row t = ops.qsa.select_cells(scores[t], positions[t] + 1, ratio,
    budget) in its first counts[t] entries (ties as torch's CPU topk). Returns (scores, cells, counts); below the
    budget a row's scores are written but not read. q_idx [T, Hi, d] normed and rotated; pooled [NB, d]."""
    with U.on_stream(stream):
        U.check_array("q_idx", q_idx, np.float32, (None, None, None))
        T, Hi, d = q_idx.shape
        U.check_array("pooled", pooled, np.float32, (None, d))
        NB = pooled.shape[0]
        S.check_positions("positions", positions, T)
        if ratio < 1 or budget < 0:
            raise ValueError(f"ratio: {ratio} / budget {budget}, expected ratio >= 1 (ratio 0 is the dense path: no "
                             "scores) and budget >= 0")
        if Hi * d * 4 > MAX_SHARED:
            raise ValueError(f"q_idx: {Hi} x {d} floats exceed the kernel's {MAX_SHARED} bytes of shared memory")
        C = cell_capacity(ratio, budget)
        scores = U.out_array("scores", scores, (T, NB), np.float32, empty)
        cells = U.out_array("cells", cells, (T, C), np.int32, empty)
        counts = U.out_array("counts", counts, (T,), np.int32, empty)
        s = scratch if scratch is not None else SelectScratch.empty(T, NB)
        U.check_array("scratch.keys", s.keys, np.uint32, (T, NB))
        U.check_array("scratch.idx", s.idx, np.int32, (T, NB))
        U.check_array("scratch.flags", s.flags, np.int32, (T, NB))
        U.check_array("scratch.done", s.done, np.int32, (T,))
        nvrtc.kernel("qsa_select", "qsa_score_select")((T, -(-NB // (SEL_BLOCK // 32)), 1), (SEL_BLOCK, 1, 1), (
            q_idx, pooled, positions, scores, cells, counts, s.keys, s.idx, s.flags, s.done, np.int32(Hi),
            np.int32(d), np.int32(NB), np.int32(C), np.int32(ratio), np.int32(budget), np.float32(np.sqrt(d))),
            shared_mem=Hi * d * 4)
    return scores, cells, counts


def attend_selected(q, gate, k_cache, v_cache, positions, cells=None, counts=None, out=None, stream=None):
    """out [T, H*d]: row t = ops.qsa.attend_selected(q[t], gate[t], k_cache, v_cache, cells[t, :counts[t]]), or
    over cells 0..positions[t] when cells is None (the dense path). q [T, H, d]; gate [T, H, d] may be a view
    with a contiguous last axis (qg[..., d:]); caches [N, Hk, d]."""
    with U.on_stream(stream):
        U.check_array("q", q, np.float32, (None, None, None))
        T, H, d = q.shape
        gs_t, gs_h = S.check_rows_view("gate", gate, 3, (T, H, d))
        U.check_array("k_cache", k_cache, np.float32, (None, None, d))
        Hk = k_cache.shape[1]
        U.check_array("v_cache", v_cache, np.float32, k_cache.shape)
        S.check_positions("positions", positions, T)
        if H % Hk:
            raise ValueError(f"q: {H} heads are not a multiple of the cache's {Hk} kv heads")
        if d > 32 * ATT_MAXR:
            raise ValueError(f"q: head dim {d} exceeds the kernel's {32 * ATT_MAXR}")
        C = 1
        if cells is not None:
            U.check_array("cells", cells, np.int32, (T, None))
            U.check_array("counts", counts, np.int32, (T,))
            C = cells.shape[1]
        elif counts is not None:
            raise ValueError("counts: given without cells")
        out = U.out_array("out", out, (T, H * d), np.float32, empty)
        nvrtc.kernel("qsa", "qsa_attend")((T * H, 1, 1), (ATT_WARPS * 32, 1, 1), (
            q, gate, gs_t, gs_h, k_cache, v_cache, U.null_or(cells), U.null_or(counts), positions, out, np.int32(H),
            np.int32(Hk), np.int32(d), np.int32(C), np.float32(np.sqrt(d))), shared_mem=(d + ATT_WARPS * (d + 2)) * 4)
    return out
