"""Gated full attention with QSA block-sparse selection.

An indexer keeps raw keys of the block being filled (the tail) and, per completed block of `ratio` cells,
a pooled key: mean of the raw keys, RMS-normed, rotated at the block's first cell. A query scores completed
blocks with sum over indexer heads of relu(q_h . pooled_b) / sqrt(d), keeps the best `budget/ratio` blocks,
and always keeps the cells after the last completed block. Below the budget every cell is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .basic import rms_norm, sigmoid
from .topk_ties import torch_topk_set


def rope_tables(positions: np.ndarray, n_rot: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, n_rot] for NeoX pairing (i, i + n_rot/2); angles in float64, stored float32."""
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, H, d]; rotates the first n_rot = cos.shape[-1] dims of every head, the rest pass through."""
    n_rot = cos.shape[-1]
    half = n_rot // 2
    xr = x[..., :n_rot]
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    out = x.copy()
    out[..., :n_rot] = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return out.astype(np.float32)


@dataclass
class WindowIndexer:
    """The indexer's operands of a window (qsa_mix): qr [T, Hi, di] its query rows and qi_w [di] their norm, keys
    [T, di] the window's raw keys and k_norm_w [di] the pooled keys' norm, tail [ratio, di] (read: the window fills a
    copy) and pooled [NB, di] (the blocks the window completes are written, live), budget the cells a row keeps."""

    qr: np.ndarray
    qi_w: np.ndarray
    keys: np.ndarray
    k_norm_w: np.ndarray
    tail: np.ndarray
    pooled: np.ndarray
    budget: int


def qsa_mix(k: np.ndarray, v: np.ndarray, qg: np.ndarray, k_w: np.ndarray, q_w: np.ndarray, k_cache: np.ndarray,
            v_cache: np.ndarray, positions: np.ndarray, eps: float, n_rot: int, base: float,
            indexer: WindowIndexer | None = None) -> np.ndarray:
    """A QSA layer's window after its projections (kernels/qsa.cu qsa_mix): k [T, Hk, d] normed and roped and v
    [T, Hk, d] written into k_cache / v_cache [N, Hk, d] at positions (in place); each row's q (qg [T, H, 2d]: q and
    gate per head) normed and roped attends, gated by its gate, to every visible cell, or with the indexer to the
    cells select_cells keeps by the block scores of its normed and roped indexer query. The window's keys are
    appended to a copy of the tail (the committed tail is never written: a window of more than ratio - n_past % ratio
    rows wraps over slots of committed positions; the commit re-appends the kept keys). Returns out [T, H*d]."""
    d = k.shape[-1]
    cos, sin = rope_tables(positions, n_rot, base)
    k_cache[positions] = rope_neox(rms_norm(k, k_w, eps), cos, sin)
    v_cache[positions] = v
    q = rope_neox(rms_norm(qg[..., :d], q_w, eps), cos, sin)
    ix = indexer
    if ix is not None:
        ratio = ix.tail.shape[0]
        indexer_append(ix.tail.copy(), ix.pooled, ix.keys, positions, ix.k_norm_w, eps, n_rot, base)
        qi = rope_neox(rms_norm(ix.qr, ix.qi_w, eps), cos, sin)
    out = np.empty((len(positions), qg.shape[1] * d), dtype=np.float32)
    for t, pos in enumerate(positions):
        n_cells = int(pos) + 1
        cells = np.arange(n_cells)
        if ix is not None:
            cells = select_cells(block_scores(qi[t], ix.pooled[:n_cells // ratio]), n_cells, ratio, ix.budget)
        out[t] = attend_selected(q[t], qg[t, :, d:], k_cache, v_cache, cells)
    return out


def indexer_append(tail: np.ndarray, pooled: np.ndarray, raw_keys: np.ndarray, positions: np.ndarray,
                   k_norm_w: np.ndarray, eps: float, n_rot: int, base: float) -> None:
    """Append raw indexer keys [T, d] at consecutive positions, in place.

    tail [ratio, d] holds the raw keys of the block being filled (slot = pos % ratio); when a position
    completes block b, pooled[b] = rope_{b*ratio}(rms_norm(mean of its raw keys) * k_norm_w).
    """
    ratio = tail.shape[0]
    for key, pos in zip(raw_keys, positions):
        pos = int(pos)
        tail[pos % ratio] = key
        if (pos + 1) % ratio == 0:
            block = pos // ratio
            mean = tail.mean(axis=0, dtype=np.float32)
            normed = rms_norm(mean, k_norm_w, eps)
            cos, sin = rope_tables(np.array([block * ratio]), n_rot, base)
            pooled[block] = rope_neox(normed[None, None, :], cos, sin)[0, 0]


def block_scores(q_idx: np.ndarray, pooled: np.ndarray) -> np.ndarray:
    """q_idx [Hi, d] (normed, rotated) x pooled [B, d] -> scores [B] = sum_h relu(q_h . k_b) / sqrt(d)."""
    dots = pooled @ q_idx.T                                               # [B, Hi]
    return (np.maximum(dots, 0).sum(axis=1) / np.float32(np.sqrt(q_idx.shape[-1]))).astype(np.float32)


def select_cells(scores: np.ndarray, n_cells: int, ratio: int, budget: int) -> np.ndarray:
    """Cells a query over n_cells visible cells attends to, ascending. scores [n_cells // ratio]."""
    n_blocks = n_cells // ratio
    keep_blocks = budget // ratio
    if ratio == 0 or n_blocks <= keep_blocks:
        return np.arange(n_cells)
    best = torch_topk_set(scores[:n_blocks], keep_blocks)               # ties kept as the oracle keeps them
    cells = (best[:, None] * ratio + np.arange(ratio)[None, :]).ravel()
    return np.concatenate([cells, np.arange(n_blocks * ratio, n_cells)])


def attend_selected(q: np.ndarray, gate: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                    cells: np.ndarray) -> np.ndarray:
    """One query row. q, gate [H, d]; caches [N, Hk, d]; cells [S] -> sigmoid(gate) * softmax(q.k/sqrt(d)) v,
    flattened [H*d]. Query head h reads kv head h // (H / Hk)."""
    H, d = q.shape
    rep = H // k_cache.shape[1]
    k = k_cache[cells][:, np.arange(H) // rep]                           # [S, H, d]
    v = v_cache[cells][:, np.arange(H) // rep]
    s = np.einsum("hd,shd->hs", q, k) / np.float32(np.sqrt(d))
    s = np.exp(s - s.max(axis=1, keepdims=True))
    w = s / s.sum(axis=1, keepdims=True)
    out = np.einsum("hs,shd->hd", w, v)
    return (out * sigmoid(gate)).reshape(-1).astype(np.float32)
