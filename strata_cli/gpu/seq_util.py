"""Helpers shared by the sequence-mixer launchers (launch_gdn, launch_qsa, launch_ple), on top of launch_util.

Like launch_util, nothing here touches the device: every check raises ValueError naming the argument.
"""

from __future__ import annotations

import numpy as np

from . import launch_util as U

def check_rows_view(name: str, a, ndim: int, shape: tuple | None = None):
    """A float32 view whose last axis is contiguous (e.g. the q half of attn_q's heads); returns its strides in
    elements for the leading axes."""
    if a is None or not hasattr(a, "strides"):
        raise ValueError(f"{name}: expected an array, got {type(a).__name__}")
    if np.dtype(a.dtype) != np.float32:
        raise ValueError(f"{name}: dtype {np.dtype(a.dtype)}, expected float32")
    if a.ndim != ndim or (shape is not None and any(w is not None and g != w for g, w in zip(a.shape, shape))):
        want = "*" * ndim if shape is None else tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {want}")
    if any(s == 0 for s in a.shape):
        raise ValueError(f"{name}: empty shape {tuple(a.shape)}")
    if a.strides[-1] != 4 or any(s < 0 or s % 4 for s in a.strides):
        raise ValueError(f"{name}: the last axis must be contiguous (strides {a.strides})")
    return tuple(np.int64(s // 4) for s in a.strides[:-1])


def check_positions(name: str, positions, T: int):
    return U.check_array(name, positions, np.int32, (T,))


def commit_count(n_keep, n_keep_dev, T: int):
    """Kernel arguments (n_keep, n_keep_dev) of a commit over a window of T stored rows. With n_keep_dev (int32 [1]
    on the device, read when the kernel runs: a captured commit graph replays with any n_keep) n_keep is ignored;
    the kernels clamp either to 0..T."""
    if n_keep_dev is not None:
        U.check_array("n_keep_dev", n_keep_dev, np.int32, (1,))
        return np.int32(0), n_keep_dev
    if n_keep is None or not 0 <= int(n_keep) <= T:
        raise ValueError(f"n_keep: {n_keep} outside 0..{T} (the window's rows)")
    return np.int32(n_keep), U.null_or(None)


def rolling_commit(state_name: str, state, rows_name: str, rows, n_keep, n_keep_dev, block: int):
    """(grid, block, kernel arguments) of a rolling-history commit, thread per column: state [S, W] <- rows
    [n_keep, n_keep + S) of [state | rows [T, W]], in place (kernels gdn_conv_commit and ple_history_commit); rows
    may be a view of rows of a wider buffer (its last axis contiguous)."""
    U.check_array(state_name, state, np.float32, (None, None))
    n_rows, width = state.shape
    (ld,) = check_rows_view(rows_name, rows, 2, (None, width))  # rows of a wider buffer (gdn: qkv of [qkv | z])
    T = rows.shape[0]
    n, n_dev = commit_count(n_keep, n_keep_dev, T)
    grid, block = U.elementwise_grid(width, block)
    return grid, block, (state, rows, np.int32(T), np.int32(n_rows), np.int32(width), np.int32(ld), n, n_dev)
