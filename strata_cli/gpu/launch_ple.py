"""CuPy launchers of kernels/ple.cu, mirroring strata_cli/ops/ple.py (and the PLE part of engine/reference.py).

Arrays are CuPy, C-contiguous (the key and value rows: row-strided views): float32 activations, int64 tokens /
table rows / hash constants. `out=`-style buffers are checked, never reallocated (graph capture); `stream=None` is
the current stream. A window never writes the conv history or the n-gram predecessors; ple_history_commit /
ple_prev_commit advance them in place.

The PLE of a window is two parts. What reads only the window's tokens (the window's inputs section, before layer
0): ngram_gather hashes and gathers the table rows in one launch (tables of the element-wise types; else
ngram_rows, then launch_embed.gather_rows), ple_kv projects them to key and value (launch_gemv.gemv: one GEMV
where the engine stacks the matrices). What reads the residual stream is the PLE layer's first hyper-connection
read: with a PleMix as its pending write, launch_hyper.hc_read's first kernel is ple.cu ple_mix_norm (the previous
layer's write, the gate, the conv step and the read's norm; ple_mix_norm here) instead of hc_write_norm.

Legend: T window rows, n n-gram size, Hn = (n-1)*heads_per_ngram table rows per token, hd table row length,
P = Hn*hd embedding width, C streams, D hidden, CD = C*D, Kc conv taps, Hh = (Kc-1)*dilation history rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import quants
from . import compile as nvrtc
from . import launch_util as U
from . import seq_util as S
from .launch_embed import gather_rows
from .launch_gemv import SplitK, gemv
from .launch_hyper import ReadNorm, norm_threads, pending_args
from .runtime import empty

PLE_BLOCK = 256  # kernels/ple.cu
PLE_MAXN = 8
PLE_EPT = 5  # ple_mix_norm: elements of a stream's row a thread holds (one pass where D <= PLE_EPT x block)
PLE_MAX_TAPS = 33  # ple_mix_norm: a thread of the first warp waits for each earlier tap's row


def _hash_args(tokens, prev, multipliers, heads_per_ngram: int, vocab_sizes, offsets):
    """(T, n, Hn) of the n-gram hash's arguments, checked (ngram_rows, ngram_gather)."""
    U.check_array("tokens", tokens, np.int64, (None,))
    U.check_array("prev", prev, np.int64, (None,))
    n = prev.shape[0] + 1
    if not 2 <= n <= PLE_MAXN:
        raise ValueError(f"prev: {n}-grams, the kernels take 2..{PLE_MAXN}")
    U.check_array("multipliers", multipliers, np.int64, (n,))
    Hn = (n - 1) * heads_per_ngram
    U.check_array("vocab_sizes", vocab_sizes, np.int64, (Hn,))
    U.check_array("offsets", offsets, np.int64, (Hn,))
    return tokens.shape[0], n, Hn


def ngram_rows(tokens, prev, eos: int, multipliers, heads_per_ngram: int, vocab_sizes, offsets, out=None,
               stream=None):
    """rows [T, Hn] int64: for each window token, ops.ple.ngram_rows(ops.ple.ngram_context(token, predecessors
    newest first, eos), ...), the predecessors being the window's earlier tokens, then prev [n-1] (oldest first)."""
    with U.on_stream(stream):
        T, n, Hn = _hash_args(tokens, prev, multipliers, heads_per_ngram, vocab_sizes, offsets)
        out = U.out_array("out", out, (T, Hn), np.int64, empty)
        grid, block = U.elementwise_grid(T, PLE_BLOCK)
        nvrtc.kernel("ple", "ple_ngram_rows")(grid, block, (
            tokens, prev, multipliers, vocab_sizes, offsets, out, np.int32(T), np.int32(n), np.int32(heads_per_ngram),
            np.int64(eos)))
    return out


GATHER_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)  # tables ple_gather decodes (table_at)


def ngram_gather(tokens, prev, eos: int, multipliers, heads_per_ngram: int, vocab_sizes, offsets, table,
                 table_type: int, row_len: int, out=None, rows=None, stream=None):
    """emb [T, Hn*row_len]: the table rows ngram_rows gives (rows [T, Hn]) gathered as launch_embed.gather_rows
    does, in one launch (ple_gather) for tables of GATHER_TYPES; other types (the block types' gathers are
    gemv_quant.cu's) write rows (a [T, Hn] int64 buffer, allocated if None) and gather from them."""
    with U.on_stream(stream):
        if table_type not in GATHER_TYPES:
            rows = ngram_rows(tokens, prev, eos, multipliers, heads_per_ngram, vocab_sizes, offsets, out=rows)
            return gather_rows(rows, table, table_type, row_len, out=out)
        T, n, Hn = _hash_args(tokens, prev, multipliers, heads_per_ngram, vocab_sizes, offsets)
        U.weight_rows("table", table, table_type, row_len)
        out = U.out_array("out", out, (T, Hn * row_len), np.float32, empty)
        nvrtc.kernel("ple", "ple_gather")((T * Hn, 1, 1), (PLE_BLOCK, 1, 1), (
            tokens, prev, multipliers, vocab_sizes, offsets, np.int32(n), np.int32(heads_per_ngram), np.int64(eos),
            table, np.int64(U.row_stride(table_type, row_len)), np.int32(table_type), out, np.int32(row_len)))
    return out


@dataclass
class PLEWork:
    """ple_kv's outputs: key, a float32 buffer of at least T * (CD + D) values (its leading [T, CD] view, or
    [T, CD + D] rows [key | value] where key and value are one GEMV), value [T, D] (two GEMVs); may hold more rows
    than the window."""

    key: object
    value: object

    @classmethod
    def empty(cls, T: int, C: int, D: int) -> "PLEWork":
        return cls(empty((T, C * D + D), np.float32), empty((T, D), np.float32))


def _flat_rows(name: str, buf, T: int, width: int):
    """A contiguous [T, width] view at the start of a float32 buffer of at least T * width values (a new one for
    None)."""
    if buf is None:
        return empty((T, width), np.float32)
    if getattr(buf, "dtype", None) != np.float32 or not buf.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous float32 buffer")
    if buf.size < T * width:
        raise ValueError(f"{name}: {buf.size} values, the window needs {T} x {width}")
    return buf.reshape(-1)[:T * width].reshape(T, width)


def ple_kv(emb, C: int, w_key=None, w_value=None, *, key_type: int = quants.F32, value_type: int = quants.F32,
           kv=None, work: PLEWork | None = None, split: SplitK | None = None, stream=None):
    """(key [T, CD], value [T, D]) = emb [T, P] @ w_key^T, emb @ w_value^T: w_key raw [CD, P] and w_value raw
    [D, P] of key_type / value_type (two GEMVs), or kv = (raw [CD + D, P], type): the two stacked (one GEMV; key and
    value are then views of its rows [key | value], row stride CD + D; w_key and w_value None)."""
    with U.on_stream(stream):
        U.check_array("emb", emb, np.float32, (None, None))
        T, P = emb.shape
        w = work if work is not None else PLEWork(None, None)
        if kv is not None:
            if w_key is not None or w_value is not None:
                raise ValueError("kv: given with w_key / w_value (the stacked matrix replaces both)")
            rows = U.weight_rows("kv", kv[0], kv[1], P)
            if rows % (C + 1):
                raise ValueError(f"kv: {rows} rows, expected C*D + D ({C} streams)")
            D = rows // (C + 1)
            out = _flat_rows("work.key", w.key, T, C * D + D)
            gemv(kv[0], kv[1], P, emb, out=out, split=split)
            return out[:, :C * D], out[:, C * D:]
        CD = U.weight_rows("w_key", w_key, key_type, P)
        D = U.weight_rows("w_value", w_value, value_type, P)
        if CD != C * D:
            raise ValueError(f"w_key: {CD} rows, expected C x D = {C * D} (w_value's {D} rows, {C} streams)")
        key = _flat_rows("work.key", w.key, T, CD)
        value = U.scratch_rows("work.value", w.value, T, (D,), empty)
        gemv(w_key, key_type, P, emb, out=key, split=split)
        gemv(w_value, value_type, P, emb, out=value, split=split)
    return key, value


def sync_words(T: int, C: int) -> int:
    """ple_mix_norm's sync words for a window of T rows and C streams: the arrival counter and a flag a block."""
    return 1 + T * C


@dataclass
class PleMix(ReadNorm):
    """The PLE layer's mix as the pending write of its first read (launch_hyper.hc_read(pending=)): the read's first
    kernel is ple.cu ple_mix_norm (ple_mix_norm below) instead of hc_write_norm, so the mix, its conv step and the
    read's norm are one launch. key [T, CD], value [T, D]: ple_kv's (row-strided views); history [Hh, CD]; norms
    [CD]; conv_w [CD, Kc]; normed [T, CD] (written: what ple_history_commit keeps); pending: the previous block's
    write (None, (block_out [T, D], inj [T, C]) or a CombineWrite), applied to R first; sync: uint32 [>=
    sync_words(T, C)], zero (and zero again after the launch), needed where T > dilation (the conv then reads
    other rows' normed values), else unused."""

    key: object
    value: object
    history: object
    norm_key: object
    norm_query: object
    norm_conv: object
    conv_w: object
    dilation: int
    normed: object
    pending: object = None
    sync: object = None

    def launch_norm(self, R, norm_w, xn, eps: float) -> None:
        ple_mix_norm(R, self, norm_w, xn, eps)


def ple_mix_norm(R, mix: PleMix, norm_w, xn, eps: float, stream=None):
    """R [T, C, D] <- the PLE block added (the pending write first), in place, and xn [T, CD] <- its grouped RMS
    norm times norm_w [CD] (hc_write_norm's output); mix.normed written. Reference: ops.ple.ple_mix_after_write
    (R_new, seq[Hh:]), then ops.basic.grouped_rms_norm(R_new, norm_w). Returns xn."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        CD = C * D
        ks, = S.check_rows_view("mix.key", mix.key, 2, (T, CD))
        vs, = S.check_rows_view("mix.value", mix.value, 2, (T, D))
        U.check_array("mix.conv_w", mix.conv_w, np.float32, (CD, None))
        Kc, dilation = mix.conv_w.shape[1], int(mix.dilation)
        if not 2 <= Kc <= PLE_MAX_TAPS or dilation < 1:
            raise ValueError(f"mix.conv_w: {Kc} taps at dilation {dilation}, expected 2..{PLE_MAX_TAPS} taps and "
                             "dilation >= 1")
        U.check_array("mix.history", mix.history, np.float32, ((Kc - 1) * dilation, CD))
        for name in ("norm_key", "norm_query", "norm_conv"):
            U.check_array(f"mix.{name}", getattr(mix, name), np.float32, (CD,))
        U.check_array("norm_w", norm_w, np.float32, (CD,))
        U.check_array("mix.normed", mix.normed, np.float32, (T, CD))
        U.check_array("xn", xn, np.float32, (T, CD))
        sync = None
        if T > dilation:  # a row's conv reads earlier rows of the window
            U.check_array("mix.sync", mix.sync, np.uint32, (None,))
            if mix.sync.shape[0] < sync_words(T, C):
                raise ValueError(f"mix.sync: {mix.sync.shape[0]} words, a window of {T} x {C} needs "
                                 f"{sync_words(T, C)}")
            sync = mix.sync
        bo, combine, inj_prev = pending_args(mix.pending, T, C, D)
        block = norm_threads(D)
        name = "ple_mix_norm" if D <= PLE_EPT * block else "ple_mix_norm_passes"
        nvrtc.kernel("ple", name)((T * C, 1, 1), (block, 1, 1), (
            R, U.null_or(bo), *combine, U.null_or(inj_prev), mix.key, ks, mix.value, vs, mix.norm_key,
            mix.norm_query, mix.norm_conv, mix.history, mix.conv_w, np.int32(Kc), np.int32(dilation), mix.normed,
            U.null_or(sync), norm_w, xn, np.int32(C), np.int32(D), np.float32(np.sqrt(D)), np.float32(eps)))
    return xn


def ple_history_commit(history, normed, n_keep, n_keep_dev=None, stream=None):
    """history [Hh, CD] <- rows [n_keep, n_keep+Hh) of [history | normed [T, CD]], in place."""
    with U.on_stream(stream):
        grid, block, args = S.rolling_commit("history", history, "normed", normed, n_keep, n_keep_dev, PLE_BLOCK)
        nvrtc.kernel("ple", "ple_history_commit")(grid, block, args)
    return history


def ple_prev_commit(prev, tokens, n_keep, n_keep_dev=None, stream=None):
    """prev [n-1] <- the last n-1 of [prev | tokens[:n_keep]] (tokens [T] int64), in place."""
    with U.on_stream(stream):
        U.check_array("prev", prev, np.int64, (None,))
        U.check_array("tokens", tokens, np.int64, (None,))
        T = tokens.shape[0]
        n, n_dev = S.commit_count(n_keep, n_keep_dev, T)
        nvrtc.kernel("ple", "ple_prev_commit")((1, 1, 1), (32, 1, 1), (
            prev, tokens, np.int32(T), np.int32(prev.shape[0]), n, n_dev))
    return prev
