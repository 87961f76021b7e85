"""Gated DeltaNet: causal depthwise conv over a saved conv state, gates, delta-rule recurrence, gated norm.

Value head h reads key/query head h % Hk: the converter stores value heads in tiled order.
"""

from __future__ import annotations

import numpy as np

from .basic import l2_norm, rms_norm, sigmoid, silu, softplus
from .gemv import gemv


def gdn_conv(qkv: np.ndarray, conv_state: np.ndarray, conv_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qkv [T, Ch] raw projections; conv_state [K-1, Ch] previous raw rows, oldest first; conv_w [Ch, K]
    (tap K-1 multiplies the current row). Returns silu(conv) [T, Ch] and the conv input sequence
    seq [K-1+T, Ch]: the state after the first n rows is seq[n:n+K-1] (what commit keeps)."""
    K = conv_w.shape[1]
    seq = np.concatenate([conv_state, qkv], axis=0)                     # [K-1+T, Ch]
    T = qkv.shape[0]
    out = np.zeros_like(qkv, dtype=np.float32)
    for i in range(K):
        out += seq[i:i + T] * conv_w[:, i]
    return silu(out), seq


def gdn_split(h: np.ndarray, nk: int, dk: int, nv: int, dv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """h [T, Ch] -> q [T, Hk, dk] (L2-normed, scaled by 1/sqrt(dk)), k [T, Hk, dk] (L2-normed), v [T, Hv, dv]."""
    T = h.shape[0]
    q = l2_norm(h[:, :nk * dk].reshape(T, nk, dk)) * np.float32(dk ** -0.5)
    k = l2_norm(h[:, nk * dk:2 * nk * dk].reshape(T, nk, dk))
    v = h[:, 2 * nk * dk:].reshape(T, nv, dv)
    return q.astype(np.float32), k.astype(np.float32), np.ascontiguousarray(v, dtype=np.float32)


def gdn_conv_split(qkv, conv_state, conv_w, nk: int, dk: int, nv: int, dv: int):
    """gdn_split of gdn_conv's output (q, k, v only): the first part of gdn_mix_raw."""
    return gdn_split(gdn_conv(qkv, conv_state, conv_w)[0], nk, dk, nv, dv)


def gdn_gates(alpha: np.ndarray, beta_in: np.ndarray, dt_bias: np.ndarray, ssm_a: np.ndarray):
    """alpha, beta_in [T, Hv] projections -> log-decay g = ssm_a * softplus(alpha + dt_bias) (ssm_a < 0) and
    write strength beta = sigmoid(beta_in)."""
    return (ssm_a * softplus(alpha + dt_bias)).astype(np.float32), sigmoid(beta_in)


def gdn_ab_gates_raw(x, alpha_raw, alpha_type, beta_raw, beta_type, dt_bias, ssm_a):
    """gdn_gates over the alpha and beta projections of x [T, n_in] (raw [Hv, n_in] weights): gdn_mix_raw's gates
    of ab_raw."""
    n_in = x.shape[1]
    alpha = gemv(alpha_raw, alpha_type, n_in, x).astype(np.float32)
    beta_in = gemv(beta_raw, beta_type, n_in, x).astype(np.float32)
    return gdn_gates(alpha, beta_in, dt_bias, ssm_a)


def gdn_recurrence(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                   beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Delta rule from a saved state, which is not modified.

    state [Hv, dk, dv]; q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv].
    Per row: S *= exp(g); S += k (x) beta*(v - S^T k); o = S^T q. Returns o [T, Hv, dv] and S after T rows.
    """
    nv, nk = v.shape[1], q.shape[1]
    kmap = np.arange(nv) % nk
    S = state.astype(np.float32, copy=True)
    out = np.empty_like(v)
    for t in range(v.shape[0]):
        kt, qt = k[t, kmap], q[t, kmap]                                   # [Hv, dk]
        S *= np.exp(g[t])[:, None, None]
        mem = np.einsum("hij,hi->hj", S, kt)
        delta = (v[t] - mem) * beta[t][:, None]
        S += kt[:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hij,hi->hj", S, qt)
    return out, S


def gdn_gated_norm(o: np.ndarray, z: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """o, z [T, Hv, dv]: per-head RMS norm times gamma [dv] times sigmoid(z)."""
    return (rms_norm(o, norm_w, eps) * sigmoid(z)).astype(np.float32)


def gdn_mix_raw(qkv, conv_state, conv_w, state, x, dt_bias, ssm_a, z, norm_w, eps: float, nk: int, dk: int, nv: int,
                dv: int, ab_raw=None, ab_proj=None, gates_before=None):
    """The reference of gpu/launch_gdn.gdn_mix: gdn_conv_split, the gates of x's rows (ab_raw = (alpha_raw,
    alpha_type, beta_raw, beta_type) projected here, or ab_proj = (alpha, beta_in)), the recurrence from state and
    the gated norm with z. gates_before = (g, beta) of earlier rows [0, r0) (a split window's first group), whose
    y rows are not returned. Returns (y [T - r0, Hv, dv], q, k, v, g, beta) with g, beta of all T rows."""
    q, k, v = gdn_conv_split(qkv, conv_state, conv_w, nk, dk, nv, dv)
    if ab_raw is not None:
        g, beta = gdn_ab_gates_raw(x, *ab_raw, dt_bias, ssm_a)
    else:
        g, beta = gdn_gates(*ab_proj, dt_bias, ssm_a)
    r0 = 0
    if gates_before is not None:
        r0 = gates_before[0].shape[0]
        g, beta = np.concatenate([gates_before[0], g]), np.concatenate([gates_before[1], beta])
    o, _ = gdn_recurrence(state, q, k, v, g, beta)
    return gdn_gated_norm(o[r0:], z, norm_w, eps), q, k, v, g, beta
