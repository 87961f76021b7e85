"""Helpers of the sequence-mixer GPU tests (test_gpu_gdn/qsa/ple.py): NaN-poisoned outputs and comparisons."""

from __future__ import annotations

import numpy as np

RTOL = 1e-4


def cupy():
    import cupy as cp

    return cp


def nan_out(shape, dtype=np.float32):
    """An output buffer filled with NaN (float) or -1 (int): whatever a kernel leaves unwritten shows up."""
    fill = np.nan if np.dtype(dtype).kind == "f" else -1
    return cupy().full(shape, fill, dtype=dtype)


def host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def check(got, want, rtol: float = RTOL, what: str = "") -> None:
    """No NaN left, and got ~= want to rtol relative to want's largest magnitude (and elementwise)."""
    got, want = host(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN left in a kernel output"
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(scale, 1e-30), err_msg=what)


def exact(got, want, what: str = "") -> None:
    got = host(got)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape} != {np.shape(want)}"
    assert np.array_equal(got, want), f"{what}: differs\n got {got}\nwant {np.asarray(want)}"


def f32(rng, *shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)
