"""model/packed.py (the Q8_0_R32 layout) and its use by the references and launch checks, on CPU."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import raw_weight

from strata_cli.gpu import launch_gemv
from strata_cli.gpu import launch_util as U
from strata_cli.model import packed, quants
from strata_cli.ops import gemv as ref
from strata_cli.ops import moe

Q8_0, R32 = quants.Q8_0, packed.Q8_0_R32


@pytest.mark.parametrize("shape", [(32, 32), (96, 160), (3, 64, 96), (1, 32, 2592)])
def test_pack_round_trips_and_places_each_block(shape):
    rng = np.random.default_rng(sum(shape))
    raw = raw_weight(rng, shape, Q8_0)
    got = packed.pack_q8_0(raw, shape[-1])
    assert got.shape == raw.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(packed.unpack_q8_0(got, shape[-1]), raw)
    nb = shape[-1] // 32
    rows = raw.reshape(-1, nb * 34)
    groups = got.reshape(-1, nb * 1088)
    for row in (0, 31, rows.shape[0] - 1):  # first and last lane of the first group, and the very last row
        g, lane = divmod(row, 32)
        for b in (0, nb - 1):
            for h in (0, 1):
                q = groups[g, ((b * 2 + h) * 32 + lane) * 16:][:16]
                np.testing.assert_array_equal(q, rows[row, b * 34 + 2 + 16 * h:][:16])
            np.testing.assert_array_equal(groups[g, nb * 1024 + (b * 32 + lane) * 2:][:2], rows[row, b * 34:][:2])


def _dequant(raw, n_in):
    """gguf-py's Q8_0 dequantization (independent of strata) of raw rows -> float64 [..., rows, n_in]."""
    import gguf

    rows = raw.reshape(-1, quants.row_bytes(Q8_0, n_in))
    out = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType.Q8_0).astype(np.float64)
    return out.reshape(*raw.shape[:-1], n_in)


def _swiglu(x, gate, up, down):
    h = x @ gate.T
    return ((h / (1 + np.exp(-h))) * (x @ up.T)) @ down.T


def test_references_read_packed_weights_as_the_raw_ones():
    """The references on packed weights against float64 products of gguf-dequantized raw weights."""
    rng = np.random.default_rng(3)
    raw = raw_weight(rng, (64, 96), Q8_0)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    want = (x.astype(np.float64) @ _dequant(raw, 96).T).astype(np.float32)
    np.testing.assert_allclose(ref.gemv(packed.pack_q8_0(raw, 96), R32, 96, x), want, rtol=1e-6, atol=1e-6)
    E, F, D = 3, 32, 64
    gate, up, down = (raw_weight(rng, s, Q8_0) for s in ((E, F, D), (E, F, D), (E, D, F)))
    ids, w = np.array([[0, 2], [1, 0]], np.int32), np.array([[0.7, 0.3], [0.4, 0.6]], np.float32)
    xs = rng.standard_normal((2, D)).astype(np.float32)
    g, u, d = _dequant(gate, D), _dequant(up, D), _dequant(down, F)
    want = np.stack([sum(w[t, j] * _swiglu(xs[t].astype(np.float64), g[e], u[e], d[e])
                         for j, e in enumerate(ids[t])) for t in range(2)])
    got = moe.routed_experts_raw(xs, ids, w, packed.pack_q8_0(gate, D), packed.pack_q8_0(up, D),
                                 packed.pack_q8_0(down, F), (R32,) * 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_packable_needs_whole_row_groups_of_q8_0():
    assert packed.packable((64, 34), Q8_0) and packed.packable((5, 640, 85), Q8_0)
    assert not packed.packable((48, 34), Q8_0)  # 48 rows: one and a half groups
    assert not packed.packable((64, 64), quants.BF16) and not packed.packable((64,), Q8_0)


def test_pack_rejects_partial_groups_and_bad_widths():
    raw = raw_weight(np.random.default_rng(0), (48, 64), Q8_0)
    with pytest.raises(ValueError, match="not a whole number of 32-row groups"):
        packed.pack_q8_0(raw, 64)
    with pytest.raises(ValueError, match="n_in: 40 is not a positive multiple"):
        packed.pack_q8_0(raw, 40)


def test_launch_checks_refuse_bad_packed_weights_and_unaligned_x():
    rng = np.random.default_rng(1)
    good = packed.pack_q8_0(raw_weight(rng, (64, 96), Q8_0), 96)
    x = np.zeros((2, 96), np.float32)
    with pytest.raises(ValueError, match=r"^w_raw: 48 rows is not a whole number of 32-row Q8_0_R32 groups"):
        launch_gemv.gemv(raw_weight(rng, (48, 96), Q8_0), R32, 96, x)
    with pytest.raises(ValueError, match=r"^w_raw: data not 16-byte aligned"):
        launch_gemv.gemv(np.zeros(good.nbytes + 2, np.uint8)[2:], R32, 96, x)
    with pytest.raises(ValueError, match=r"^w_raw: input width 40 is not a positive multiple of the Q8_0_R32"):
        launch_gemv.gemv(good, R32, 40, x)
    buf = np.zeros(2 * 96 + 4, np.float32)
    start = next(i for i in range(4) if (buf[i:].ctypes.data % 16) == 4)
    unaligned = buf[start:start + 2 * 96].reshape(2, 96)
    with pytest.raises(ValueError, match=r"^x: data not 16-byte aligned"):
        launch_gemv.gemv(good, R32, 96, unaligned, out=np.zeros((2, 64), np.float32))
    with pytest.raises(ValueError, match=r"^gate_raw: 48 rows per expert is not a whole number"):
        U.expert_geometry("gate_raw", raw_weight(rng, (2, 48, 64), Q8_0), R32, 64)


@pytest.mark.parametrize("n_out,n_in,T,max_z,want", [
    (248320, 2560, 1, 8, (2, 1)),  # the head: thousands of row groups, split once to shorten each warp's chain
    (320, 10240, 1, 8, (8, 8)),  # hyper-connection down: 10 groups, a long input axis
    (2560, 6144, 1, 8, (8, 4)),  # 2560 rows, split across blocks too: 6 blocks per warp
    (2560, 640, 8, 1, (8, 1)),  # T = 8: 4 row groups per warp
    (32, 64, 1, 8, (1, 1)),  # too short to split
])
def test_q8r_split(n_out, n_in, T, max_z, want):
    assert U.q8r_split(n_out, n_in, T, max_z=max_z) == want


@pytest.mark.parametrize("n_out,n_in,T,want", [
    (352, 10240, 1, (8, 24)),  # hc_down: 88 -> 264 blocks (two an SM), 5 -> 1-2 Q8_0 blocks a warp
    (352, 10240, 2, (8, 12)),  # T = 2: one resident block an SM, 48 -> 72 blocks
    (640, 2560, 1, (8, 10)),  # the shared expert's gate / up: 80 -> 200 blocks, one Q8_0 block a warp (the cap)
    (640, 2560, 2, (8, 6)),  # the gate/up kernel's 20 tiles x 6 = 120 blocks: one wave
    (2560, 640, 1, (8, 1)),  # shexp_down: no z split to raise (its tail is not added)
    (2560, 6144, 1, (8, 4)),  # gdn_out: 320 blocks already
    (2560, 6144, 2, (8, 8)),
    (16384, 2560, 1, (4, 1)),  # gdn_qkvz and the head: unchanged
    (248320, 2560, 1, (2, 1)),
    (96, 2592, 1, (8, 10)),  # 81 blocks: at least one a warp (8 x 10 = 80 slices)
    (32, 10240, 16, (8, 32)),  # Q8R_FILL_MAX_Z
])
def test_q8r_split_fills_the_sms(n_out, n_in, T, want):
    """q8r_split's fill (the dense CUDA-core launches): a z split is raised to a resident wave of blocks, never
    lowered, never introduced; every warp keeps a Q8_0 block; the slices fit the partial buffer (gate/up: 2F)."""
    base = U.q8r_split(n_out, n_in, T, max_z=U.GEMV_MAX_ZSPLIT)
    got = U.q8r_split(n_out, n_in, T, max_z=U.GEMV_MAX_ZSPLIT, fill_sms=132)
    assert got == want
    ksplit, zsplit = got
    assert ksplit == base[0] and zsplit >= base[1] and (zsplit == 1) == (base[1] == 1)
    assert zsplit * ksplit <= n_in // 32
    assert zsplit * T * 2 * n_out <= U.GEMV_PARTIAL_FLOATS
    nt = U.nt_bucket(T)
    gateup_tiles = U.gemv_grid(n_out, T, ksplit, zsplit, rpw=U.Q8R_GROUP * U.Q8R_GATEUP_ROWS[nt])[0]
    if zsplit > base[1]:
        assert gateup_tiles[0] * gateup_tiles[1] * zsplit <= U.Q8R_RESIDENT_BLOCKS.get(nt, 1) * 132
    assert U.q8r_split(n_out, n_in, T, fill_sms=132) == U.q8r_split(n_out, n_in, T)  # no z: nothing to fill
