"""Gated full attention with QSA block-sparse selection.

An indexer keeps raw keys of the block being filled (the tail) and, per completed block of `ratio` cells,
a pooled key: mean of the raw keys, RMS-normed, rotated at the block's first cell. A query scores completed
blocks with sum over indexer heads of relu(q_h . pooled_b) / sqrt(d), keeps the best `budget/ratio` blocks,
and always keeps the cells after the last completed block. Below the budget every cell is kept.
"""

from __future__ import annotations

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


def prep_window(k: np.ndarray, v: np.ndarray, q: np.ndarray, k_w: np.ndarray, q_w: np.ndarray, cos: np.ndarray,
                sin: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, positions: np.ndarray, eps: float,
                qr: np.ndarray | None = None, qi_w: np.ndarray | None = None, indexer=None):
    """A QSA layer's rows after its projections (kernels/qsa.cu qsa_prep): k [T, Hk, d] normed and roped and v
    [T, Hk, d] written into k_cache / v_cache [N, Hk, d] at positions (in place); returns qn [T, H, d] (q [T, H, d]
    normed and roped) and, with the indexer query qr [T, Hi, di], its normed and roped rows (else None). cos, sin
    [T, n_rot] per row. indexer = (tail, pooled, raw_keys [n, di], key_positions [n], k_norm_w, n_rot, base): the
    window's raw keys appended as a run appends them (indexer_append, then the tail back to what it held: only
    pooled keeps the blocks they complete), in place."""
    k_cache[positions] = rope_neox(rms_norm(k, k_w, eps), cos, sin)
    v_cache[positions] = v
    qn = rope_neox(rms_norm(q, q_w, eps), cos, sin)
    qi = None if qr is None else rope_neox(rms_norm(qr, qi_w, eps), cos, sin)
    if indexer is not None:
        tail, pooled, raw_keys, key_positions, k_norm_w, n_rot, base = indexer
        snapshot = tail.copy()
        indexer_append(tail, pooled, raw_keys, key_positions, k_norm_w, eps, n_rot, base)
        tail[...] = snapshot
    return qn, qi


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
