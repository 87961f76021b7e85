"""Elementwise and normalisation primitives shared by every layer kind."""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return (x * sigmoid(x)).astype(np.float32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0.0), x).astype(np.float32, copy=False)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x [..., n] / rms over the last axis, times gamma w [n] (stored already folded as 1+w)."""
    x = x.astype(np.float32, copy=False)
    out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return out if w is None else out * w


def grouped_rms_norm(x: np.ndarray, w: np.ndarray, group: int, eps: float) -> np.ndarray:
    """x [..., G*group]: RMS norm within each group (stream) of `group` values, gamma w [G*group]."""
    shape = x.shape
    xg = x.reshape(*shape[:-1], -1, group)
    return (rms_norm(xg, None, eps).reshape(shape) * w).astype(np.float32, copy=False)


def l2_norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis (the eps floors the SUM, as FLA and transformers do)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(eps))


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y [T, out] = x [T, in] @ w[out, in]^T, rounded to float32.

    Pass w as float64 (engine/weights.py does): float32 BLAS picks different kernels for different row
    counts and rounds differently, while the window/commit property wants every row's result independent
    of the window size T. Accumulating in float64 makes the row results T-independent after rounding."""
    return np.matmul(x, w.T).astype(np.float32)


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (logprob dumps are compared across engines at 1e-6)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
