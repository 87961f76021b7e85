"""PLE: hashed n-gram embedding rows per token, gated into every stream, plus a dilated depthwise conv."""

from __future__ import annotations

import numpy as np

from .basic import grouped_rms_norm, sigmoid, silu
from .hyper import hc_write


def ngram_context(token: int, prev_newest_first: np.ndarray, eos: int) -> np.ndarray:
    """[token, p1, p2, ...]: a predecessor becomes EOS once an EOS lies between it and the token
    (an EOS predecessor itself stays EOS). prev_newest_first [n-1] holds EOS where there is none."""
    ctx = np.empty(len(prev_newest_first) + 1, dtype=np.int64)
    ctx[0] = token
    cut = False
    for s, t in enumerate(prev_newest_first, start=1):
        cut = cut or int(t) == eos
        ctx[s] = eos if cut else t
    return ctx


def ngram_rows(ctx: np.ndarray, multipliers: np.ndarray, heads_per_ngram: int, vocab_sizes: np.ndarray,
               offsets: np.ndarray) -> np.ndarray:
    """Table rows [(n-1)*heads_per_ngram] of one token: for n-gram order m = 2..n, the XOR of ctx[j]*mult[j]
    (wrapping int64, as transformers computes it) modulo each head's prime, plus the head's offset."""
    prods = ctx.astype(np.int64) * multipliers.astype(np.int64)           # wraps like torch int64
    rows = []
    mixed = prods[0]
    for order in range(2, len(ctx) + 1):
        mixed = mixed ^ prods[order - 1]
        heads = slice((order - 2) * heads_per_ngram, (order - 1) * heads_per_ngram)
        rows.append(np.remainder(mixed, vocab_sizes[heads]) + offsets[heads])
    return np.concatenate(rows)


def ple_mix(R: np.ndarray, emb: np.ndarray, history: np.ndarray, w_key: np.ndarray, w_value: np.ndarray,
            norm_key: np.ndarray, norm_query: np.ndarray, norm_conv: np.ndarray, conv_w: np.ndarray,
            dilation: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Add the PLE block to the residual streams of T consecutive rows.

    R [T, C, D]; emb [T, P] gathered n-gram rows; history [Hh, C*D] previous conv inputs, oldest first
    (Hh = (Kc-1)*dilation); w_key [C*D, P]; w_value [D, P]; norms [C*D]; conv_w [C*D, Kc].
    Returns the new R and the conv input sequence seq [Hh+T, C*D]: the history after the first n rows is
    seq[n:n+Hh] (what commit keeps).
    """
    T, C, D = R.shape
    key = grouped_rms_norm(emb @ w_key.T, norm_key, D, eps).reshape(T, C, D)
    value = emb @ w_value.T                                               # [T, D]
    query = grouped_rms_norm(R.reshape(T, C * D), norm_query, D, eps).reshape(T, C, D)
    s = (key * query).sum(axis=-1) / np.float32(np.sqrt(D))               # [T, C]
    s = np.sign(s) * np.sqrt(np.maximum(np.abs(s), np.float32(1e-6)))
    gated = sigmoid(s)[:, :, None] * value[:, None, :]                    # [T, C, D]
    normed = grouped_rms_norm(gated.reshape(T, C * D), norm_conv, D, eps)
    seq = np.concatenate([history, normed], axis=0)                       # [Hh + T, C*D]
    Kc, Hh = conv_w.shape[1], history.shape[0]
    conv = np.zeros((T, C * D), dtype=np.float32)
    for k in range(Kc):
        back = (Kc - 1 - k) * dilation
        conv += seq[Hh - back:Hh - back + T] * conv_w[:, k]
    R_new = R + gated + silu(conv).reshape(T, C, D)
    return R_new.astype(np.float32), seq


def ple_mix_after_write(R: np.ndarray, pending, emb: np.ndarray, history: np.ndarray, w_kv: np.ndarray,
                        norm_key: np.ndarray, norm_query: np.ndarray, norm_conv: np.ndarray, conv_w: np.ndarray,
                        dilation: int, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference of the GPU's PLE layer mix (gpu/launch_ple.ple_kv over the stacked projection, then
    ple_mix_norm with a pending write, whose xn is grouped_rms_norm of R_new): R += block_out * inj per stream (pending = (block_out [T, D], inj [T, C]) or None; ops/hyper.hc_write), then ple_mix with
    w_kv [C*D + D, P] = [w_key; w_value]. Returns (R after the write, R_new, seq)."""
    T, C, D = R.shape
    if pending is not None:
        R = hc_write(R, *pending)
    R_new, seq = ple_mix(R, emb, history, w_kv[:C * D], w_kv[C * D:], norm_key, norm_query, norm_conv, conv_w,
                         dilation, eps)
    return R, R_new, seq
