"""The numpy references of the hyper-connection read's kernels (ops/hyper.py): the stacked down + inject matrix
(down_inject_rows) and hc_up_mix, composed as kernels/hyper.cu composes them, equal hc_read."""

from __future__ import annotations

import numpy as np
import pytest

from strata_cli.model import quants
from strata_cli.ops import hyper
from strata_cli.ops.basic import grouped_rms_norm, linear
from strata_cli.ops.gemv import dequant_rows


def _raw(rng, shape, t):
    return quants.quantize((0.3 * rng.standard_normal(shape)).astype(np.float32), t)


@pytest.mark.parametrize("down_type,inject_type", [(quants.Q8_0, quants.Q8_0), (quants.BF16, quants.BF16),
                                                   (quants.F16, quants.Q8_0), (quants.F32, None)])
@pytest.mark.parametrize("L,C", [(16, 4), (32, 4), (45, 3)])
def test_down_inject_rows_stack_and_pad(down_type, inject_type, L, C):
    """Down rows, then inject rows, then zero rows up to a multiple of 32, as byte rows of one type (two types:
    F32, value for value)."""
    rng = np.random.default_rng(L + C + down_type)
    n_in = 96
    down = _raw(rng, (L, n_in), down_type)
    inject = None if inject_type is None else _raw(rng, (C, n_in), inject_type)
    raw, t = hyper.down_inject_rows(down, down_type, inject, inject_type, n_in)
    n = L + (0 if inject is None else C)
    assert raw.dtype == np.uint8 and raw.shape[0] == -(-n // hyper.DN_ROW_GROUP) * hyper.DN_ROW_GROUP
    assert t == (down_type if inject_type in (None, down_type) else quants.F32)
    W = dequant_rows(raw, t, n_in)
    np.testing.assert_array_equal(W[:L], dequant_rows(down, down_type, n_in))
    if inject is not None:
        np.testing.assert_array_equal(W[L:n], dequant_rows(inject, inject_type, n_in))
    assert not W[n:].any()


@pytest.mark.parametrize("T,C,D,L", [(1, 4, 40, 16), (3, 3, 33, 45), (16, 5, 8, 32)])
@pytest.mark.parametrize("inject", (True, False), ids=("inject", "head"))
def test_norm_stacked_gemv_and_up_mix_are_the_read(T, C, D, L, inject):
    rng = np.random.default_rng(T * 3 + C + D + L)
    R = rng.standard_normal((T, C, D)).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(C * D)).astype(np.float32)
    down, up = _raw(rng, (L, C * D), quants.F32), _raw(rng, (C * D, L), quants.BF16)
    inj = _raw(rng, (C, C * D), quants.F32) if inject else None
    want_mixed, want_inj = hyper.hc_read_raw(R, norm_w, down, quants.F32, up, quants.BF16, inj, quants.F32, 1e-6)
    dn_raw, dn_type = hyper.down_inject_rows(down, quants.F32, inj, quants.F32 if inject else None, C * D)
    xn = grouped_rms_norm(R.reshape(T, C * D), norm_w, D, 1e-6)
    dn = linear(xn, dequant_rows(dn_raw, dn_type, C * D)) / np.float32(C)
    mixed, got_inj = hyper.hc_up_mix(xn, dn, L, dequant_rows(up, quants.BF16, L), C, C if inject else 0)
    np.testing.assert_allclose(mixed, want_mixed, rtol=1e-6, atol=1e-7)
    if inject:
        np.testing.assert_allclose(got_inj, want_inj, rtol=1e-6, atol=1e-7)
    else:
        assert got_inj is None


def test_combine_sums_the_slots_in_order():
    """ops/moe.combine: entry t*K + k weighted by weights[t, k], rows past T*K ignored, shared added."""
    from strata_cli.ops import moe

    rng = np.random.default_rng(3)
    T, K, D = 3, 4, 10
    parts = rng.standard_normal((T * K + 2, D)).astype(np.float32)
    w = rng.random((T, K)).astype(np.float32)
    shared = rng.standard_normal((T, D)).astype(np.float32)
    want = np.einsum("tk,tkd->td", w.astype(np.float64), parts[:T * K].reshape(T, K, D).astype(np.float64))
    np.testing.assert_allclose(moe.combine(parts, w), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(moe.combine(parts, w, shared), want + shared, rtol=1e-6, atol=1e-6)
    assert moe.combine(parts, w).dtype == np.float32
