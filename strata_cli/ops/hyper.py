"""Hyper-connections: C residual streams read through a low-rank gated mixer and written back per stream."""

from __future__ import annotations

import numpy as np

from .basic import grouped_rms_norm, linear, sigmoid, silu
from ..model import quants
from .gemv import dequant_rows

DN_ROW_GROUP = 32  # down_inject_rows pads to whole groups of this many rows (a Q8_0 matrix then repacks)


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
    """The reference of gpu/launch_hyper.hc_read (over down_inject_rows of down and inject): the pending write
    (block_out [T, D], inj [T, C]) or None, then hc_read_raw. Returns (R after the write, mixed, inj)."""
    if pending is not None:
        R = hc_write(R, *pending)
    mixed, inj = hc_read_raw(R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, eps)
    return R, mixed, inj


def broadcast_streams(emb: np.ndarray, C: int) -> np.ndarray:
    """emb [T, D] -> R [T, C, D]: a window's residual stack starts as C copies of its embedding rows."""
    return np.repeat(emb[:, None, :], C, axis=1)


def down_inject_rows(down_raw, down_type: int, inject_raw, inject_type: int | None, n_in: int):
    """W_dn = [W_down; W_inject; zero rows] as raw rows of one type: the matrix of the read's one down + inject GEMV
    (kernels/hyper.cu). Rows padded with zeros to a multiple of DN_ROW_GROUP (a Q8_0 matrix then repacks to
    Q8_0_R32; a zero row is zero in every type). Two types that differ are both dequantized to F32 (exact: every
    type's values are float32 numbers). down [L, n_in], inject [C, n_in] or None -> (uint8 rows [n_dn, *], type)."""
    parts = [(down_raw, down_type)] + ([] if inject_raw is None else [(inject_raw, inject_type)])
    if len({t for _, t in parts}) > 1:
        parts = [(dequant_rows(raw, t, n_in).astype(np.float32), quants.F32) for raw, t in parts]
    ggml_type = parts[0][1]
    row = quants.row_bytes(ggml_type, n_in)
    rows = [np.ascontiguousarray(raw).view(np.uint8).reshape(-1, row) for raw, _ in parts]
    n = sum(len(r) for r in rows)
    rows.append(np.zeros((-n % DN_ROW_GROUP, row), np.uint8))
    return np.concatenate(rows), ggml_type  # byte rows: every launcher and dequant_rows take them


def hc_up_mix(xn: np.ndarray, dn: np.ndarray, L: int, w_up: np.ndarray, C: int, n_inj: int):
    """The reference of kernels/hyper.cu hc_up_mix: xn [T, C*D] (the normed streams), dn [T, n_dn] (the down +
    inject GEMV, divided by C), w_up [C*D, L] -> mixed [T, D], inj [T, n_inj] (None when n_inj is 0)."""
    T = xn.shape[0]
    low = silu(dn[:, :L])                                                # [T, L]
    gates = sigmoid(linear(low, w_up)).reshape(T, C, -1)                 # [T, C, D]
    mixed = (gates * xn.reshape(T, C, -1)).mean(axis=1).astype(np.float32)
    inj = (2.0 * sigmoid(dn[:, L:L + n_inj])).astype(np.float32) if n_inj else None
    return mixed, inj
