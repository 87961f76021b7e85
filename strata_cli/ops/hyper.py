"""Hyper-connections: C residual streams read through a low-rank gated mixer and written back per stream."""

from __future__ import annotations

import numpy as np

from .basic import grouped_rms_norm, linear, sigmoid, silu
from .gemv import dequant_rows


def hc_read(R: np.ndarray, norm_w: np.ndarray, w_down: np.ndarray, w_up: np.ndarray,
            w_inject: np.ndarray | None, eps: float) -> tuple[np.ndarray, np.ndarray | None]:
    """Mix the streams into one block input.

    R [T, C, D]; norm_w [C*D]; w_down [L, C*D]; w_up [C*D, L]; w_inject [C, C*D] or None (the head's mixer).
    Returns mixed [T, D] and the write gates inj [T, C] = 2*sigmoid(w_inject @ xn / C) (None without inject).
    """
    T, C, D = R.shape
    xn = grouped_rms_norm(R.reshape(T, C * D), norm_w, D, eps)          # [T, C*D]
    low = silu(linear(xn, w_down) / np.float32(C))                       # [T, L]
    gates = sigmoid(linear(low, w_up)).reshape(T, C, D)                  # [T, C, D]
    mixed = (gates * xn.reshape(T, C, D)).mean(axis=1).astype(np.float32)
    if w_inject is None:
        return mixed, None
    inj = 2.0 * sigmoid(linear(xn, w_inject) / np.float32(C))           # [T, C]
    return mixed, inj.astype(np.float32)


def hc_write(R: np.ndarray, block_out: np.ndarray, inj: np.ndarray) -> np.ndarray:
    """R [T, C, D] + block_out [T, D] weighted per stream by inj [T, C]."""
    return (R + block_out[:, None, :] * inj[:, :, None]).astype(np.float32)


def hc_read_raw(R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, eps):
    """hc_read over raw weights (gpu/launch_hyper.hc_read's signature): down [L, C*D], up [C*D, L], inject [C, C*D]
    or None."""
    T, C, D = R.shape
    w_down = dequant_rows(down_raw, down_type, C * D)
    w_up = dequant_rows(up_raw, up_type, w_down.shape[0])
    w_inject = None if inject_raw is None else dequant_rows(inject_raw, inject_type, C * D)
    return hc_read(R, norm_w, w_down, w_up, w_inject, eps)


def hc_write_read_raw(R, pending, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, eps):
    """The reference of gpu/launch_hyper.hc_read_fused: the pending write (block_out [T, D], inj [T, C]) or None,
    then hc_read_raw. Returns (R after the write, mixed, inj)."""
    if pending is not None:
        R = hc_write(R, *pending)
    mixed, inj = hc_read_raw(R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, eps)
    return R, mixed, inj


def broadcast_streams(emb: np.ndarray, C: int) -> np.ndarray:
    """emb [T, D] -> R [T, C, D]: a window's residual stack starts as C copies of its embedding rows."""
    return np.repeat(emb[:, None, :], C, axis=1)
