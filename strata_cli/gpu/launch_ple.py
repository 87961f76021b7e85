"""CuPy launchers of kernels/ple.cu, mirroring strata_cli/ops/ple.py (and the PLE part of engine/reference.py).

Arrays are CuPy, C-contiguous: float32 activations, int64 tokens / table rows / hash constants. `out=`-style
buffers are checked, never reallocated (graph capture); `stream=None` is the current stream. A window never
writes the conv history or the n-gram predecessors; ple_history_commit / ple_prev_commit advance them in place.
The key and value projections are launch_gemv.gemv launches over raw GGUF rows (one where the engine stacks
them); ngram_gather hashes and gathers the table rows in one launch (tables of the element-wise types; else
ngram_rows, then launch_embed.gather_rows). ple_mix applies the layer's pending hyper-connection
write in its gate kernel (no write launch before it).

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
from .launch_hyper import PleWrite, pending_args
from .runtime import empty

PLE_BLOCK = 256  # kernels/ple.cu
PLE_MAXN = 8


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
    """Intermediates of ple_mix: key, a float32 buffer of at least T * (CD + D) values (its leading [T, CD] view, or
    [T, CD + D] rows [key | value] where key and value are one GEMV), value [T, D], gated [T, CD]; may hold more
    rows than the window."""

    key: object
    value: object
    gated: object

    @classmethod
    def empty(cls, T: int, C: int, D: int) -> "PLEWork":
        return cls(empty((T, C * D + D), np.float32), empty((T, D), np.float32), empty((T, C * D), np.float32))


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


def ple_mix_write(R, emb, history, w_key, w_value, norm_key, norm_query, norm_conv, conv_w, dilation: int,
                  eps: float, *, key_type: int = quants.F32, value_type: int = quants.F32, kv=None, pending=None,
                  normed=None, work: PLEWork | None = None, split: SplitK | None = None, stream=None):
    """The PLE block up to its last step: returns (the PleWrite that adds it to R, normed [T, CD]); the read that
    follows applies it (launch_hyper.hc_read(pending=)), or ple_mix's ple_conv_out launch does.

    emb [T, P]; history [Hh, CD]; w_key raw [CD, P] and w_value raw [D, P] of key_type / value_type, or kv = (raw
    [CD + D, P], type): the two stacked (one GEMV; w_key and w_value None); norms [CD]; conv_w [CD, Kc].
    pending: the previous block's hyper-connection write ((block_out [T, D], inj [T, C]) or a CombineWrite,
    launch_hyper.hc_write's arithmetic), applied to R in place by the gate's kernel before it reads R (no write
    launch). ops.ple.ple_mix returns seq = [history | normed]; here only normed is written and ple_history_commit
    keeps rows of that sequence."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        CD = C * D
        U.check_array("emb", emb, np.float32, (T, None))
        P = emb.shape[1]
        U.check_array("conv_w", conv_w, np.float32, (CD, None))
        Kc = conv_w.shape[1]
        if Kc < 2 or dilation < 1:
            raise ValueError(f"conv_w: {Kc} taps at dilation {dilation}, expected >= 2 taps and dilation >= 1")
        U.check_array("history", history, np.float32, ((Kc - 1) * dilation, CD))
        for name, gamma in (("norm_key", norm_key), ("norm_query", norm_query), ("norm_conv", norm_conv)):
            U.check_array(name, gamma, np.float32, (CD,))
        if kv is not None:
            if w_key is not None or w_value is not None:
                raise ValueError("kv: given with w_key / w_value (the stacked matrix replaces both)")
            U.weight_rows("kv", kv[0], kv[1], P, n_out=CD + D)
        else:
            U.weight_rows("w_key", w_key, key_type, P, n_out=CD)
            U.weight_rows("w_value", w_value, value_type, P, n_out=D)
        bo, combine, inj_prev = pending_args(pending, T, C, D)
        w = work if work is not None else PLEWork(None, None, None)
        gated = U.scratch_rows("work.gated", w.gated, T, (CD,), empty)
        normed = U.out_array("normed", normed, (T, CD), np.float32, empty)

        if kv is not None:  # rows [key | value]
            rows = _flat_rows("work.key", w.key, T, CD + D)
            gemv(kv[0], kv[1], P, emb, out=rows, split=split)
            key, value, ld = rows, rows[:, CD:], CD + D
        else:
            key = _flat_rows("work.key", w.key, T, CD)
            value = U.scratch_rows("work.value", w.value, T, (D,), empty)
            gemv(w_key, key_type, P, emb, out=key, split=split)
            gemv(w_value, value_type, P, emb, out=value, split=split)
            ld = None
        nvrtc.kernel("ple", "ple_gate")((T * C, 1, 1), (PLE_BLOCK, 1, 1), (
            key, np.int64(ld or CD), value, np.int64(ld or D), R, U.null_or(bo), *combine, U.null_or(inj_prev),
            norm_key, norm_query, norm_conv, gated, normed, np.int32(C), np.int32(D), np.float32(np.sqrt(D)),
            np.float32(eps)))
    return PleWrite(gated, history, normed, conv_w, dilation), normed


def ple_mix(R, emb, history, w_key, w_value, norm_key, norm_query, norm_conv, conv_w, dilation: int, eps: float,
            *, out=None, stream=None, **kwargs):
    """Add the PLE block to R [T, C, D]: returns (R_new [T, C, D], normed [T, CD]): ple_mix_write (its arguments
    and keywords), then its last step in a launch of its own (ple_conv_out). out may be R (updated in place)."""
    with U.on_stream(stream):
        U.check_array("R", R, np.float32, (None, None, None))
        T, C, D = R.shape
        CD = C * D
        if out is not None:  # checked before anything launches
            out = U.out_array("out", out, (T, C, D), np.float32, empty)
        write, normed = ple_mix_write(R, emb, history, w_key, w_value, norm_key, norm_query, norm_conv, conv_w,
                                      dilation, eps, **kwargs)
        out = U.out_array("out", out, (T, C, D), np.float32, empty)
        grid, block = U.elementwise_grid(T * CD, PLE_BLOCK)
        nvrtc.kernel("ple", "ple_conv_out")(grid, block, (
            R, write.gated, history, normed, conv_w, out, np.int32(T), np.int32(CD), np.int32(conv_w.shape[1]),
            np.int32(dilation)))
    return out, normed


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
