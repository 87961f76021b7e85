"""kernels/gemv_q8r.cu (Q8_0 repacked by 32-row groups) against the numpy references, on odd shapes and through
every launcher that takes a weight type (skipped without a GPU). Outputs are NaN-poisoned before each launch."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import assert_close, assert_replay_equals_eager, hc_weights, poisoned, raw_weight, to_dev

from strata_cli.model import packed, quants
from strata_cli.ops import gemv as ref
from strata_cli.ops import hyper, moe

pytestmark = pytest.mark.gpu

Q8_0, R32, F32 = quants.Q8_0, packed.Q8_0_R32, quants.F32


def _packed(rng, shape, scale=0.5):
    """(raw Q8_0, the same weights packed on the host) of random weights of a numpy-order float shape."""
    raw = raw_weight(rng, shape, Q8_0, scale)
    return raw, packed.pack_q8_0(raw, shape[-1])


@pytest.mark.parametrize("shape", [(32, 32), (96, 160), (3, 64, 96), (288, 2592)])
def test_pack_kernel_matches_numpy_bit_for_bit(shape):
    import cupy as cp

    from strata_cli.gpu import launch_pack

    raw = raw_weight(np.random.default_rng(sum(shape)), shape, Q8_0)
    out = cp.full(raw.shape, 0xAB, dtype=cp.uint8)
    got = launch_pack.pack_q8_0(to_dev(raw), shape[-1], out=out)
    assert got is out
    np.testing.assert_array_equal(got.get(), packed.pack_q8_0(raw, shape[-1]))


def _gemv_against_reference(label: str, seed: int, n_out: int, n_in: int, T: int,
                            tensor_cores: bool | None = None) -> None:
    """A repacked Q8_0 GEMV of random weights and inputs (NaN-poisoned output) against the numpy reference on the
    raw blocks; tensor_cores: launch_gemv.gemv's (None: the path window_path picks for T)."""
    from strata_cli.gpu import launch_gemv

    rng = np.random.default_rng(seed)
    raw = raw_weight(rng, (n_out, n_in), Q8_0)
    w = packed.pack_q8_0(raw, n_in)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    got = launch_gemv.gemv(to_dev(w), R32, n_in, to_dev(x), out=poisoned((T, n_out)), tensor_cores=tensor_cores)
    assert_close(label, ref.gemv(raw, Q8_0, n_in, x), got, floor=1.0)


@pytest.mark.parametrize("n_out,n_in", [(32, 32), (96, 160), (288, 2592), (32, 10240), (4096, 256), (2560, 6144)])
@pytest.mark.parametrize("T", (1, 2, 3, 7, 16, 19))  # every bucket (rows per lane 1, 2, 4, 4, 2) and two chunks
def test_gemv_matches_reference(n_out, n_in, T):
    _gemv_against_reference(f"gemv q8r {n_out}x{n_in}", n_out + n_in + T, n_out, n_in, T, tensor_cores=False)


@pytest.mark.parametrize("T", (1, 3, 16))
@pytest.mark.parametrize("inject", (True, False), ids=("inject", "head"))
def test_hc_read_with_packed_down_inject(T, inject):
    """The down + inject GEMV (no epilogue but the division by C) on the packed path, as the engine packs that
    stacked matrix (its rows padded to whole 32-row groups); the up matrix stays raw Q8_0 (hc_up_mix reads it)."""
    from strata_cli.gpu import launch_hyper

    rng = np.random.default_rng(T + 50 * inject)
    C, D, L = 4, 40, 32
    R = rng.standard_normal((T, C, D)).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(C * D)).astype(np.float32)
    down = raw_weight(rng, (L, C * D), Q8_0, 0.2)
    up = raw_weight(rng, (C * D, L), Q8_0, 0.3)
    inj = raw_weight(rng, (C, C * D), Q8_0, 0.2) if inject else None
    want_mixed, want_inj = hyper.hc_read_raw(R, norm_w, down, Q8_0, up, Q8_0, inj, Q8_0, 1e-6)
    w = hc_weights(norm_w, down, Q8_0, up, Q8_0, inj, Q8_0, pack=True)
    assert w.dn_type == R32
    mixed, got_inj = launch_hyper.hc_read(to_dev(R), w, 1e-6, out_mixed=poisoned((T, D)),
                                          out_inj=poisoned((T, C)) if inject else None)
    assert_close("hc_read mixed", want_mixed, mixed)
    if inject:
        assert_close("hc_read inj", want_inj, got_inj)


@pytest.mark.parametrize("T", (1, 2, 3, 7, 16))
@pytest.mark.parametrize("K", (1, 4))
@pytest.mark.parametrize("tc", (False, True), ids=("cuda", "tc"))
def test_routed_experts_match_reference(T, K, tc):
    """Both grouped expert kernels (gemv_expert_q8r_t* and, for a window whose path has gemv_tc, T >= 2,
    gemv_expert_q8r_tc_t*): 96-row experts (a tensor-core warp's 64 rows then half empty in its second warp), 5-block
    rows, groups of 1 .. 16 entries (16: two MMA column tiles), a bad id."""
    from strata_cli.gpu import launch_moe
    from strata_cli.gpu import launch_util as U

    rng = np.random.default_rng(T * 10 + K)
    E, F, D = 7, 96, 160
    gate, gate_p = _packed(rng, (E, F, D), 0.3)
    up, up_p = _packed(rng, (E, F, D), 0.3)
    down, down_p = _packed(rng, (E, D, F), 0.3)
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)
    if T >= 7:  # several rows on one expert: groups with several entries (a row's experts stay distinct, as the
        # router's top-k are: a group never holds more entries than the window has rows)
        ids[ids == 2] = np.repeat(ids[:, :1], K, axis=1)[ids == 2]
        ids[:, 0] = 2
        assert all(len(set(row)) == K for row in ids.tolist())
    want = moe.routed_experts_raw(x, ids, w, gate, up, down, (Q8_0,) * 3)
    with U.recording_path(U.WindowPath(gemv_tc=tc)):
        assert U.q8r_tensor_cores(T) == (tc and T >= 2)
        got = launch_moe.routed_experts(to_dev(x), to_dev(ids), to_dev(w), to_dev(gate_p), to_dev(up_p),
                                        to_dev(down_p), (R32,) * 3, out=poisoned((T, D)))
        assert_close(f"routed_experts q8r {'tc' if tc else 'cuda'}", want, got)
        if T == 3:  # an expert id out of range turns only its row NaN
            bad = ids.copy()
            bad[1, 0] = E
            got = launch_moe.routed_experts(to_dev(x), to_dev(bad), to_dev(w), to_dev(gate_p), to_dev(up_p),
                                            to_dev(down_p), (R32,) * 3, out=poisoned((T, D))).get()
            assert np.isnan(got[1]).all()
            assert_close("good rows", want[[0, 2]], got[[0, 2]])


@pytest.mark.parametrize("T,K", [(1, 5), (2, 3), (4, 2), (7, 3), (8, 4), (16, 1)])
@pytest.mark.parametrize("F", (96, 224))
def test_gate_up_is_one_launch_matching_reference(T, K, F):
    """gemv_q8r_gateup_t<NT> (gate and up of the grouped experts in one pass, launch_moe.launch_gateup_experts):
    h = silu(gate_e . x) * (up_e . x) per entry against the numpy reference (ops/moe.swiglu's h over the dequantized
    weights) on widths of odd row groups (3 and 7 groups of 32: a warp's last groups not live at T >= 4), groups of
    several entries, one launch, an expert id outside 0..E-1 leaving only its entries NaN; NaN-poisoned h, eager
    against graph replay."""
    from strata_cli.gpu import launch_moe
    from strata_cli.ops.basic import silu

    rng = np.random.default_rng(T * 13 + K + F)
    E, D = 5, 160
    gate, gate_p = _packed(rng, (E, F, D), 0.3)
    up, up_p = _packed(rng, (E, F, D), 0.3)
    x = rng.standard_normal((T, D)).astype(np.float32)
    # every row on expert 1 (a group of T entries), its other experts distinct, as the router's top-k are
    ids = np.array([[1, *rng.permutation([e for e in range(E) if e != 1])[:K - 1]] for _ in range(T)], np.int32)
    J = T * K
    G, U_ = (ref.dequant_rows(w.reshape(E * F, -1), Q8_0, D).reshape(E, F, D) for w in (gate, up))
    want = np.stack([silu(G[e] @ x[j // K]) * (U_[e] @ x[j // K]) for j, e in enumerate(ids.reshape(-1))])
    scratch = launch_moe.MoeScratch.empty(J, F, D)
    groups = launch_moe._group_buffers(scratch, J)
    dx, dg, du = to_dev(x), to_dev(gate_p), to_dev(up_p)
    stride = gate_p.nbytes // E
    h = poisoned((J, F))

    def launch(dids, stream=None):
        launch_moe.group_entries(dids, J, groups)
        launch_moe.launch_gateup_experts((dg, R32, stride), (du, R32, stride), E, groups, J, T, dx, K, h)

    def record(stream):
        with stream:
            launch(dids, stream)

    calls, real = [], launch_moe.nvrtc.kernel

    def counted(module, name):
        calls.append(name)
        return real(module, name)

    dids = to_dev(ids)
    launch_moe.nvrtc.kernel = counted
    try:
        launch(dids)
    finally:
        launch_moe.nvrtc.kernel = real
    assert calls == ["moe_group", f"gemv_q8r_gateup_t{launch_moe.U.nt_bucket(T)}"], calls
    got = assert_replay_equals_eager(record, [h])[0]
    assert_close("gate/up h", want, got)
    if T >= 2:  # an id out of range: its entry's row NaN only
        bad = ids.copy()
        bad[T - 1, K - 1] = E
        h.fill(np.nan)
        launch(to_dev(bad))
        got = h.get()
        assert np.isnan(got[J - 1]).all()
        assert_close("gate/up h, good entries", want[:J - 1], got[:J - 1])


@pytest.mark.parametrize("T", (1, 5, 16))
def test_shared_expert_matches_reference(T):
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(T)
    F, D = 64, 96
    gate, gate_p = _packed(rng, (F, D), 0.3)
    up, up_p = _packed(rng, (F, D), 0.3)
    down, down_p = _packed(rng, (D, F), 0.3)
    sg = raw_weight(rng, (D,), F32, 0.2)
    x = rng.standard_normal((T, D)).astype(np.float32)
    want = moe.shared_expert_raw(x, gate, up, down, sg, (Q8_0, Q8_0, Q8_0, F32))
    got = launch_moe.shared_expert(to_dev(x), to_dev(gate_p), to_dev(up_p), to_dev(down_p), to_dev(sg),
                                   (R32, R32, R32, F32), out=poisoned((T, D)))
    assert_close("shared_expert q8r", want, got)


# Shapes whose dense CUDA-core launch takes q8r_split's fill (a z split raised to a resident wave of blocks): the
# hyper-connection down (352 x 10240), the shared expert's gate / up (640 x 2560), 81 and 125 blocks a row (the
# slices' last warps one block short), a single row group on a long input (the Q8R_FILL_MAX_Z cap).
FILL_SHAPES = [(352, 10240), (640, 2560), (96, 2592), (160, 4000), (32, 10240)]


def _fills(n_out: int, n_in: int, T: int) -> bool:
    from strata_cli.gpu import launch_util as U

    plain = U.q8r_split(n_out, n_in, T, max_z=U.GEMV_MAX_ZSPLIT)
    return U.q8r_split(n_out, n_in, T, max_z=U.GEMV_MAX_ZSPLIT, fill_sms=U.sm_count())[1] > plain[1] > 1


@pytest.mark.parametrize("n_out,n_in", FILL_SHAPES)
@pytest.mark.parametrize("T", (1, 2, 3))
def test_filled_zsplit_gemv_matches_reference(n_out, n_in, T):
    """gemv_q8r_t<NT> split over 10-32 blocks along z (launch_gemv's fill on the CUDA-core path), NaN-poisoned
    output, against the numpy reference; then again with an epilogue (silu, div, mul) which only the tile's last
    block applies."""
    from strata_cli.gpu import launch_gemv
    from strata_cli.gpu import launch_util as U

    assert _fills(n_out, n_in, T)
    _gemv_against_reference(f"gemv q8r fill {n_out}x{n_in} T={T}", 7 * n_out + n_in + T, n_out, n_in, T,
                            tensor_cores=False)
    rng = np.random.default_rng(n_out + 3 * T)
    raw = raw_weight(rng, (n_out, n_in), Q8_0)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    mul = rng.standard_normal((T, n_out)).astype(np.float32)
    y = poisoned((T, n_out))
    launch_gemv.launch_gemv(to_dev(packed.pack_q8_0(raw, n_in)), R32, n_in, to_dev(x), y, None, act=U.ACT_SILU,
                            div=3.0, mul=to_dev(mul), mul_strides=(n_out, 1), tensor_cores=False)
    lin = ref.gemv(raw, Q8_0, n_in, x).astype(np.float64) / 3.0
    assert_close(f"gemv q8r fill epilogue {n_out}x{n_in} T={T}", (lin / (1.0 + np.exp(-lin)) * mul).astype(np.float32),
                 y.get(), floor=1.0)


@pytest.mark.parametrize("T", (1, 2))
def test_filled_zsplit_repeats_and_replays_bit_for_bit(T):
    """The filled z splits share one SplitK (the engine's arena workspace) across launches of different tile counts:
    every tile counter is reset by its last block, so launches repeated in any order write the same bits, and a
    captured graph of them (the dense GEMVs and the fused gate/up) replays the eager bits."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv
    from strata_cli.gpu.splitk import SplitK

    rng = np.random.default_rng(40 + T)
    split = SplitK.empty()
    mats, outs = [], []
    for n_out, n_in in FILL_SHAPES[:3]:
        assert _fills(n_out, n_in, T)
        raw = raw_weight(rng, (n_out, n_in), Q8_0)
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        mats.append((to_dev(packed.pack_q8_0(raw, n_in)), n_in, to_dev(x), ref.gemv(raw, Q8_0, n_in, x)))
        outs.append(poisoned((T, n_out)))
    F, D = 640, 2560
    gate, gate_p = _packed(rng, (F, D), 0.3)
    up, up_p = _packed(rng, (F, D), 0.3)
    gx = rng.standard_normal((T, D)).astype(np.float32)
    dg, du, dgx = to_dev(gate_p), to_dev(up_p), to_dev(gx)
    h = poisoned((T, F))
    outs.append(h)

    def one(i, stream=None):
        w, n_in, x, _ = mats[i]
        launch_gemv.gemv(w, R32, n_in, x, out=outs[i], split=split, stream=stream, tensor_cores=False)

    def record(stream):
        for i in range(len(mats)):
            one(i, stream)
        with stream:
            launch_gemv.launch_q8r_gateup(dg, du, D, dgx, h, split)

    first = []
    for i in range(len(mats)):
        one(i)
        first.append(outs[i].get())
        assert_close(f"fill {i} T={T}", mats[i][3], first[i], floor=1.0)
    for order in ([2, 0, 1, 0], [1, 1, 2, 0, 2]):  # again and again, in other orders: counters back at zero
        for i in order:
            outs[i].fill(np.nan)
            one(i)
            cp.cuda.Device().synchronize()
            np.testing.assert_array_equal(outs[i].get(), first[i])
    assert not split.tile_done.any()
    got = assert_replay_equals_eager(record, outs)
    for i in range(len(mats)):
        np.testing.assert_array_equal(got[i], first[i])
    from strata_cli.ops.basic import silu

    assert_close(f"fill gate/up T={T}", silu(ref.gemv(gate, Q8_0, D, gx)) * ref.gemv(up, Q8_0, D, gx), got[-1])
    assert not split.tile_done.any()


@pytest.mark.parametrize("T", (1, 2))
@pytest.mark.parametrize("F,D", [(96, 160), (224, 2560), (640, 2560), (32, 10240)])
def test_dense_gate_up_is_one_launch_with_the_two_launch_bits(F, D, T):
    """gemv_q8r_gateup_dense_t<NT> (the shared expert's gate and up in one launch, launch_gemv.launch_q8r_gateup,
    T <= 2): h = silu(gate . x) * (up . x) bit for bit what up, then gate with mul = h gave as two launches, and
    against the numpy reference; widths of 3, 7 and 20 row groups (a block's last warps not live), no z split
    (160 inputs) and z splits raised by q8r_split's fill (the real shape 640 x 2560: 10 slices at T = 1, a long 10240
    input: 32), NaN-poisoned h, eager
    against graph replay (the z-split tile counters reset)."""
    from strata_cli.gpu import launch_gemv, launch_moe
    from strata_cli.gpu import launch_util as U
    from strata_cli.gpu.splitk import SplitK
    from strata_cli.ops.basic import silu

    rng = np.random.default_rng(F + D + T)
    gate, gate_p = _packed(rng, (F, D), 0.3)
    up, up_p = _packed(rng, (F, D), 0.3)
    x = rng.standard_normal((T, D)).astype(np.float32)
    want = silu(ref.gemv(gate, Q8_0, D, x)) * ref.gemv(up, Q8_0, D, x)
    dx, dg, du = to_dev(x), to_dev(gate_p), to_dev(up_p)
    split = SplitK.empty()
    assert launch_gemv.gateup_fuses((R32, R32), T) and not launch_gemv.gateup_fuses((R32, Q8_0), T)
    two = poisoned((T, F))  # the two-launch path's bits
    launch_gemv.launch_gemv(du, R32, D, dx, two, split)
    launch_gemv.launch_gemv(dg, R32, D, dx, two, split, act=U.ACT_SILU, mul=two, mul_strides=(F, 1))
    h = poisoned((T, F))
    calls, real = [], launch_gemv.nvrtc.kernel

    def counted(module, name):
        calls.append(name)
        return real(module, name)

    def record(stream):
        with stream:
            launch_gemv.launch_q8r_gateup(dg, du, D, dx, h, split)

    launch_gemv.nvrtc.kernel = counted
    try:
        launch_gemv.launch_q8r_gateup(dg, du, D, dx, h, split)
    finally:
        launch_gemv.nvrtc.kernel = real
    assert calls == [f"gemv_q8r_gateup_dense_t{T}"], calls
    np.testing.assert_array_equal(h.get(), two.get())
    got = assert_replay_equals_eager(record, [h])[0]
    np.testing.assert_array_equal(got, two.get())
    assert_close("dense gate/up h", want, got)
    # through shared_expert: one gate/up launch, then down (its gate given: no scalar-gate GEMV)
    down, down_p = _packed(rng, (D, F), 0.3)
    sg_w = raw_weight(rng, (D,), F32, 0.2)
    sg = (1.0 / (1.0 + np.exp(-(x @ sg_w)))).astype(np.float32).reshape(T, 1)
    calls.clear()
    launch_moe.nvrtc.kernel = counted
    try:
        out = launch_moe.shared_expert(dx, dg, du, to_dev(down_p), None, (R32, R32, R32, F32), out=poisoned((T, D)),
                                       split=split, sg=to_dev(sg))
    finally:
        launch_moe.nvrtc.kernel = real
    assert calls == [f"gemv_q8r_gateup_dense_t{T}", f"gemv_q8r_t{T}"], calls
    assert_close("shared_expert q8r, one gate/up launch", moe.shared_expert_raw(x, gate, up, down, sg_w,
                                                                               (Q8_0, Q8_0, Q8_0, F32)), out)


@pytest.mark.parametrize("tc", (False, True), ids=("cuda", "tc"))
def test_graph_replay_is_bit_identical_to_eager(tc):
    """Dense (with the z-split reduce) and grouped packed GEMVs captured in one graph replay to the same bits, on
    either window path (the grouped experts' CUDA-core or tensor-core kernels)."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv, launch_moe
    from strata_cli.gpu import launch_util as U

    rng = np.random.default_rng(9)
    T, K, E, F, D = 5, 3, 6, 64, 10240
    _, w_p = _packed(rng, (32, D))
    gate_p, up_p, down_p = (_packed(rng, s, 0.3)[1] for s in ((E, F, D), (E, F, D), (E, D, F)))
    x = to_dev(rng.standard_normal((T, D)).astype(np.float32))
    ids, w = (to_dev(a) for a in moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K))
    dev = [to_dev(a) for a in (w_p, gate_p, up_p, down_p)]
    y, out = cp.empty((T, 32), cp.float32), cp.empty((T, D), cp.float32)
    scratch = launch_moe.MoeScratch.empty(T * K, F, D)
    split = launch_gemv.SplitK.empty()  # the z-split workspace, allocated before the capture

    def record(stream):
        launch_gemv.gemv(dev[0], R32, D, x, out=y, split=split, stream=stream)
        launch_moe.routed_experts(x, ids, w, dev[1], dev[2], dev[3], (R32,) * 3, out=out, scratch=scratch,
                                  stream=stream)

    assert U.q8r_split(32, D, T, max_z=U.GEMV_MAX_ZSPLIT)[1] > 1  # the dense GEMV splits across blocks
    with U.recording_path(U.WindowPath(gemv_tc=tc)):
        assert_replay_equals_eager(record, (y, out))


# The tensor-core kernels (gemv_q8r_tc_t<NT>, tensor_cores=True; windows of T >= 4 by default) for T >= 2. Their error against the exact
# dequantized weights: x split into f16 hi + lo leaves <= 2^-22 |x| + 2^-25 per input (2^-24 max|x| of the block in a
# block split from x * 2^-16), and the per-block sums are reassociated (MMA, then d once): relative to sum |w x|
# that is ~1e-6, so the CUDA-core path's 1e-4 tolerance (of the output scale) holds with a wide margin on n_in up
# to 10240 while a wrong fragment (one swapped k or row) misses it by orders of magnitude.
TC_T = (2, 3, 5, 8, 9, 13, 16, 17, 19)  # every bucket 2..16, padded column tiles, and a second grid-y chunk


@pytest.mark.parametrize("n_out,n_in", [(32, 32), (96, 160), (288, 2592), (32, 10240), (4096, 256), (2560, 6144),
                                        (20512, 64)])
@pytest.mark.parametrize("T", TC_T)
def test_tensor_core_gemv_matches_reference(n_out, n_in, T):
    """Odd shapes: n_out not a multiple of the 64-row warp tile (96, 288, 20512), one-block rows, z-split heads."""
    _gemv_against_reference(f"gemv q8r tc {n_out}x{n_in} T={T}", 3 * n_out + n_in + T, n_out, n_in, T,
                            tensor_cores=True)


@pytest.mark.parametrize("T", (2, 8, 16))
def test_tensor_core_gemv_keeps_tiny_and_huge_inputs(T):
    """Inputs f16 cannot hold: |x| up to 3e6 (a block split from x * 2^-16) next to 1e-7 (f16 subnormals) in other
    blocks, and one window row of all zeros; epilogues (silu / div, mul) as the engine uses them."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv
    from strata_cli.gpu import launch_util as U

    rng = np.random.default_rng(70 + T)
    n_out, n_in = 160, 512
    raw = raw_weight(rng, (n_out, n_in), Q8_0)
    w = packed.pack_q8_0(raw, n_in)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    x[:, 32:64] *= 3e6
    x[:, 64:96] *= 1e-7
    x[:, 100] = 70000.0
    x[-1] = 0.0
    mul = rng.standard_normal((T, n_out)).astype(np.float32)
    y = poisoned((T, n_out))
    launch_gemv.launch_gemv(to_dev(w), R32, n_in, to_dev(x), y, None, act=U.ACT_SILU, div=3.0, mul=to_dev(mul),
                            mul_strides=(n_out, 1), tensor_cores=True)
    lin = ref.gemv(raw, Q8_0, n_in, x).astype(np.float64) / 3.0
    want = (lin / (1.0 + np.exp(np.clip(-lin, -700.0, 700.0))) * mul).astype(np.float32)
    cp.cuda.Device().synchronize()
    assert_close(f"gemv q8r tc huge/tiny T={T}", want, y, floor=1.0)


@pytest.mark.parametrize("T", (2, 5, 8, 16))
def test_tensor_core_gemv_one_huge_row_costs_the_others_nothing(T):
    """One window row of |x| ~ 1e5 (its blocks split from x * 2^-16) beside rows of |x| ~ 1: the split is per window
    row (B column), so the small rows keep their own precision (a warp-wide split left them in f16 subnormals, ~1e-3
    off); every row is compared at its own scale."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv

    rng = np.random.default_rng(90 + T)
    n_out, n_in = 96, 640
    raw = raw_weight(rng, (n_out, n_in), Q8_0)
    w = packed.pack_q8_0(raw, n_in)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    x[T // 2] *= 1e5
    y = poisoned((T, n_out))
    launch_gemv.launch_gemv(to_dev(w), R32, n_in, to_dev(x), y, None, tensor_cores=True)
    want = ref.gemv(raw, Q8_0, n_in, x)
    cp.cuda.Device().synchronize()
    got = y.get()
    for t in range(T):
        assert_close(f"gemv q8r tc T={T} row {t} (row {T // 2} huge)", want[t], got[t], floor=1.0)


@pytest.mark.parametrize("n_out,n_in,T", [(8224, 2560, 8), (320, 10240, 5), (2560, 640, 16), (96, 2560, 3)])
def test_tensor_core_graph_replay_equals_eager_bit_for_bit(n_out, n_in, T):
    """Deterministic reductions (MMA order, ksplit and zsplit sums): a replayed graph writes the eager bits, and
    the CUDA-core path (tensor_cores=False) agrees within the tolerance."""
    from strata_cli.gpu import launch_gemv

    rng = np.random.default_rng(n_out + T)
    raw = raw_weight(rng, (n_out, n_in), Q8_0)
    w, x = to_dev(packed.pack_q8_0(raw, n_in)), to_dev(rng.standard_normal((T, n_in)).astype(np.float32))
    out = poisoned((T, n_out))
    split = launch_gemv.SplitK.empty()
    eager, = assert_replay_equals_eager(lambda s: launch_gemv.gemv(w, R32, n_in, x, out=out, split=split, stream=s,
                                                                   tensor_cores=True), (out,))
    assert_close("tc vs numpy", ref.gemv(raw, Q8_0, n_in, x.get()), eager, floor=1.0)
    cuda_cores = launch_gemv.gemv(w, R32, n_in, x, out=poisoned((T, n_out)), tensor_cores=False)
    assert_close("tc vs cuda cores", cuda_cores.get(), eager, floor=1.0)
