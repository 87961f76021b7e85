"""kernels/moe.cu and the expert GEMVs against their numpy references, on odd shapes (skipped without a GPU).

Every output is poisoned (NaN, or -7 for ids) before the launch, so an element the kernel forgets to write fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import TYPES, assert_close, assert_replay_equals_eager, poisoned, raw_weight, to_dev

from strata_cli.model import quants
from strata_cli.ops import moe

pytestmark = pytest.mark.gpu

F32, F16, BF16, Q8_0 = quants.F32, quants.F16, quants.BF16, quants.Q8_0
EXPERT_TYPES = [(t, t, t) for t in TYPES] + [(Q8_0, BF16, F16)]
EXPERT_IDS = ["-".join(quants.TYPE_NAMES[t] for t in ts) for ts in EXPERT_TYPES]


@pytest.mark.parametrize("T", (1, 3, 7, 16))
@pytest.mark.parametrize("E,k", [(8, 1), (8, 8), (61, 4), (512, 10), (512, 16)])
@pytest.mark.parametrize("kind", ("normal", "ties"))
def test_router_topk_matches_reference(T, E, k, kind):
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(T * 1000 + E + k)
    if kind == "ties":  # few distinct values: equal probabilities must go to the lower id
        logits = rng.integers(-3, 3, (T, E)).astype(np.float32)
    else:
        logits = (2.0 * rng.standard_normal((T, E))).astype(np.float32)
    want_ids, want_w = moe.router_topk(logits, k)
    out_ids, out_w = poisoned((T, k), np.int32), poisoned((T, k))
    ids, w = launch_moe.router_topk(to_dev(logits), k, out_ids=out_ids, out_w=out_w)
    np.testing.assert_array_equal(ids.get(), want_ids)
    assert not np.isnan(w.get()).any()
    np.testing.assert_allclose(w.get(), want_w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("T", (1, 3, 16))
@pytest.mark.parametrize("E,k", [(8, 8), (61, 4), (512, 10), (512, 16)])
def test_router_topk_groups_the_entries(T, E, k):
    """groups=: the router's last block groups the T*k entries by expert as moe_group does (the same buffers bit for
    bit), launch after launch (its counter comes back to zero) and from a graph; ids and weights unchanged."""
    import cupy as cp

    from strata_cli.gpu import launch_moe
    from strata_cli.gpu.graphs import CapturedGraph, new_stream
    from strata_cli.gpu.launch_util import GEMV_MAXT

    rng = np.random.default_rng(T * 100 + E + k)
    logits = to_dev((2.0 * rng.standard_normal((T, E))).astype(np.float32))
    J = T * k
    want_ids, want_w = launch_moe.router_topk(logits, k)
    want = (poisoned((J,), np.int32), poisoned((J,), np.int32), poisoned((J, GEMV_MAXT), np.int32))
    want[2].fill(0)  # entries past a group's count are not written
    launch_moe.group_entries(want_ids, J, want)
    ids, w = poisoned((T, k), np.int32), poisoned((T, k))
    groups = (poisoned((J,), np.int32), poisoned((J,), np.int32), cp.zeros((J, GEMV_MAXT), np.int32))
    done = cp.zeros((1,), np.uint32)

    def record(stream):
        launch_moe.router_topk(logits, k, out_ids=ids, out_w=w, stream=stream, groups=groups, done=done)

    def check_groups():
        for name, got, ref in zip(("g_expert", "g_count", "g_entries"), groups, want):
            np.testing.assert_array_equal(got.get(), ref.get(), err_msg=name)
        assert int(done.get()[0]) == 0

    for _ in range(2):
        record(None)
        cp.cuda.Device().synchronize()
        check_groups()
    np.testing.assert_array_equal(ids.get(), want_ids.get())
    np.testing.assert_array_equal(w.get(), want_w.get())
    stream = new_stream()
    graph = CapturedGraph(record, stream)
    for _ in range(2):
        for buf in groups[:2]:
            buf.fill(-7)
        cp.cuda.Device().synchronize()
        graph.launch()
        stream.synchronize()
        check_groups()
    graph.destroy()


@pytest.mark.parametrize("sg_type", TYPES, ids=[quants.TYPE_NAMES[t] for t in TYPES])
@pytest.mark.parametrize("T,D", [(1, 96), (3, 2560), (16, 32)])
def test_router_topk_computes_the_shared_gate(sg_type, T, D):
    """scalar_gate=: the router's launch writes sigmoid(w_sg . x) per row, which shared_expert(sg=) then uses in
    place of its scalar-gate GEMV (the shared expert of ops/moe.shared_expert_raw)."""
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(T + D + sg_type)
    E, K, F = 61, 4, 64
    logits = (2.0 * rng.standard_normal((T, E))).astype(np.float32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    sg_w = raw_weight(rng, (D,), sg_type, 0.05)
    gate, up, down = raw_weight(rng, (F, D), Q8_0, 0.1), raw_weight(rng, (F, D), Q8_0, 0.1), raw_weight(
        rng, (D, F), Q8_0, 0.1)
    sg = poisoned((T, 1))
    ids, w = launch_moe.router_topk(to_dev(logits), K, scalar_gate=(to_dev(x), to_dev(sg_w), sg_type, sg))
    want_ids, want_w = moe.router_topk(logits, K)
    np.testing.assert_array_equal(ids.get(), want_ids)
    w_sg = quants.dequantize(sg_w, sg_type).reshape(-1).astype(np.float32)
    assert_close("sg", (1.0 / (1.0 + np.exp(-(x @ w_sg)))).reshape(T, 1).astype(np.float32), sg, rtol=1e-5)
    types = (Q8_0, Q8_0, Q8_0, sg_type)
    out = poisoned((T, D))
    got = launch_moe.shared_expert(to_dev(x), to_dev(gate), to_dev(up), to_dev(down), None, types, out=out, sg=sg)
    assert_close("shared_expert(sg=)", moe.shared_expert_raw(x, gate, up, down, sg_w, types), got)
    with pytest.raises(ValueError, match="scalar_gate: type Q4_K"):
        launch_moe.router_topk(to_dev(logits), K, scalar_gate=(to_dev(x), to_dev(sg_w), quants.Q4_K, sg))


def test_router_topk_groups_at_most_a_block():
    from strata_cli.gpu import launch_moe

    with pytest.raises(ValueError, match="logits: 272"):
        launch_moe.router_topk(to_dev(np.zeros((17, 64), np.float32)), 16, groups=(None, None, None))


def _experts(rng, E, F, D, types, scale=0.3):
    gt, ut, dt = types
    return (raw_weight(rng, (E, F, D), gt, scale), raw_weight(rng, (E, F, D), ut, scale),
            raw_weight(rng, (E, D, F), dt, scale))


def _routing(rng, T, E, K):
    return moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)


@pytest.mark.parametrize("types", EXPERT_TYPES, ids=EXPERT_IDS)
@pytest.mark.parametrize("T", (1, 3, 7, 16))
@pytest.mark.parametrize("K", (1, 2, 4))
def test_routed_experts_match_reference(types, T, K):
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(T * 10 + K + sum(types))
    E, F, D = 7, 64, 96
    gate, up, down = _experts(rng, E, F, D, types)
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = _routing(rng, T, E, K)
    want = moe.routed_experts_raw(x, ids, w, gate, up, down, types)
    out = poisoned((T, D))
    got = launch_moe.routed_experts(to_dev(x), to_dev(ids), to_dev(w), to_dev(gate), to_dev(up), to_dev(down),
                                    types, out=out)
    assert got is out
    assert_close(f"routed_experts {EXPERT_IDS[EXPERT_TYPES.index(types)]}", want, got)


def test_routed_experts_fuse_shared_add_and_reuse_scratch():
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(3)
    T, K, E, F, D = 5, 3, 9, 32, 64
    types = (Q8_0, Q8_0, Q8_0)
    gate, up, down = _experts(rng, E, F, D, types)
    x = rng.standard_normal((T, D)).astype(np.float32)
    shared = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = _routing(rng, T, E, K)
    scratch = launch_moe.MoeScratch.empty(16 * K, F, D)  # sized for a larger window
    got = launch_moe.routed_experts(to_dev(x), to_dev(ids), to_dev(w), to_dev(gate), to_dev(up), to_dev(down),
                                    types, out=poisoned((T, D)), shared=to_dev(shared), scratch=scratch)
    want = moe.routed_experts_raw(x, ids, w, gate, up, down, types) + shared
    assert_close("routed + shared", want, got)


def test_routed_experts_bad_id_poisons_only_its_row():
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(4)
    T, K, E, F, D = 3, 2, 4, 32, 32
    gate, up, down = _experts(rng, E, F, D, (F32, F32, F32))
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = _routing(rng, T, E, K)
    bad = ids.copy()
    bad[1, 1] = E  # out of range
    got = launch_moe.routed_experts(to_dev(x), to_dev(bad), to_dev(w), to_dev(gate), to_dev(up), to_dev(down),
                                    (F32, F32, F32)).get()
    assert np.isnan(got[1]).all()
    want = moe.routed_experts_raw(x, ids, w, gate, up, down, (F32, F32, F32))
    assert_close("good rows", want[[0, 2]], got[[0, 2]])


@pytest.mark.parametrize("T,D", [(1, 96), (3, 160), (16, 32)])
def test_routed_experts_with_the_shared_output_replay_eager(T, D):
    """The combine adds the shared expert's output (shared=) and a graph replays the eager bits (its residual write
    is the next hyper-connection read's: test_gpu_hc_read.py)."""
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(T * 3 + D)
    E, F, K = 9, 64, 3
    types = (Q8_0, Q8_0, BF16)
    gate, up, down = _experts(rng, E, F, D, types)
    x = rng.standard_normal((T, D)).astype(np.float32)
    shared = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = _routing(rng, T, E, K)
    want_out = moe.routed_experts_raw(x, ids, w, gate, up, down, types) + shared
    dx, dids, dw, dg, du, dd, dsh = (to_dev(a) for a in (x, ids, w, gate, up, down, shared))
    out = poisoned((T, D))
    scratch = launch_moe.MoeScratch.empty(T * K, F, D)

    def record(stream):
        launch_moe.routed_experts(dx, dids, dw, dg, du, dd, types, out=out, shared=dsh, scratch=scratch,
                                  stream=stream)

    (got_out,) = assert_replay_equals_eager(record, [out])
    assert_close("out", want_out, got_out)


@pytest.mark.parametrize("types", EXPERT_TYPES, ids=EXPERT_IDS)
@pytest.mark.parametrize("sg_type", (F32, BF16), ids=("sgF32", "sgBF16"))
@pytest.mark.parametrize("T", (1, 3, 7, 16))
def test_shared_expert_matches_reference(types, sg_type, T):
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(T * 7 + sg_type + sum(types))
    F, D = 64, 96
    gate, up, down = (raw_weight(rng, (F, D), types[0], 0.3), raw_weight(rng, (F, D), types[1], 0.3),
                      raw_weight(rng, (D, F), types[2], 0.3))
    sg = raw_weight(rng, (D,), sg_type, 0.2)
    x = rng.standard_normal((T, D)).astype(np.float32)
    all_types = (*types, sg_type)
    want = moe.shared_expert_raw(x, gate, up, down, sg, all_types)
    out = poisoned((T, D))
    got = launch_moe.shared_expert(to_dev(x), to_dev(gate), to_dev(up), to_dev(down), to_dev(sg), all_types,
                                   out=out)
    assert got is out
    assert_close("shared_expert", want, got)


def test_moe_block_captures_into_a_graph_without_allocating():
    """Router, routed experts and shared expert with preallocated outputs/scratch capture in thread-local mode."""
    import cupy as cp

    from strata_cli.gpu import launch_moe
    from strata_cli.gpu.graphs import CapturedGraph, new_stream

    rng = np.random.default_rng(12)
    T, K, E, F, D = 7, 4, 16, 64, 96
    types = (Q8_0, Q8_0, BF16)
    gate, up, down = _experts(rng, E, F, D, types)
    sh = (raw_weight(rng, (F, D), Q8_0), raw_weight(rng, (F, D), Q8_0), raw_weight(rng, (D, F), Q8_0),
          raw_weight(rng, (D,), BF16))
    sh_types = (Q8_0, Q8_0, Q8_0, BF16)
    x = rng.standard_normal((T, D)).astype(np.float32)
    logits = (2.0 * rng.standard_normal((T, E))).astype(np.float32)
    dx, dlog, dg, du, dd = (to_dev(a) for a in (x, logits, gate, up, down))
    dsh = [to_dev(a) for a in sh]
    ids, w = cp.empty((T, K), cp.int32), cp.empty((T, K), cp.float32)
    shared_out, out = cp.empty((T, D), cp.float32), cp.empty((T, D), cp.float32)
    moe_scratch = launch_moe.MoeScratch.empty(T * K, F, D)
    sh_scratch = launch_moe.SharedScratch.empty(T, F)

    def record(stream):
        launch_moe.router_topk(dlog, K, out_ids=ids, out_w=w, stream=stream)
        launch_moe.shared_expert(dx, *dsh, sh_types, out=shared_out, scratch=sh_scratch, stream=stream)
        launch_moe.routed_experts(dx, ids, w, dg, du, dd, types, out=out, shared=shared_out,
                                  scratch=moe_scratch, stream=stream)

    stream = new_stream()  # non-blocking: wait for the uploads made on the default stream
    cp.cuda.Device().synchronize()
    record(stream)
    stream.synchronize()
    graph = CapturedGraph(record, stream)
    out.fill(np.nan)
    cp.cuda.Device().synchronize()
    graph.launch()
    stream.synchronize()
    want_ids, want_w = moe.router_topk(logits, K)
    np.testing.assert_array_equal(ids.get(), want_ids)
    want = (moe.routed_experts_raw(x, want_ids, want_w, gate, up, down, types)
            + moe.shared_expert_raw(x, *sh, sh_types))
    assert_close("graph moe", want, out)
    graph.destroy()


@pytest.mark.parametrize("T", (1, 3, 16))
# D = 3360: rows past the kernel's one trip of registers (32 * 4 * ROUTER_J = 3072 router elements a warp row,
# 256 * ROUTER_SGJ = 3072 gate elements a block), so the longer-row loops run too. The gate's four types each have
# their own load body in the kernel (Q8_0 only where D is a multiple of its 32-element block).
@pytest.mark.parametrize("E,k,D", [(16, 4, 64), (61, 4, 100), (512, 10, 2560), (1024, 16, 96), (40, 6, 3360)])
@pytest.mark.parametrize("sg_type,shared", [(None, False), (F32, False), (F16, False), (BF16, False), (Q8_0, False),
                                            (BF16, True)],
                         ids=("nogate", "sgF32", "sgF16", "sgBF16", "sgQ8_0", "shared-slot"))
def test_router_gemv_topk_matches_reference(T, E, k, D, sg_type, shared):
    """router_gemv_topk (the window's router: GEMV, top-k, grouping and the shared gate in one launch) against the
    numpy router over x @ W^T: the same ids, weights and logits within rounding, the groups moe_group makes of those
    ids, the shared gate; NaN-poisoned outputs; eager and every graph replay give the same bits (the arrival counter
    back at zero each time). shared: slot k of every row is the shared expert (id E, weight its gate), grouped too."""
    import cupy as cp

    from strata_cli.gpu import launch_moe
    from strata_cli.gpu.launch_util import GEMV_MAXT
    from strata_cli.ops.gemv import gemv

    slots = k + shared
    if T * slots > 256:
        pytest.skip("the router groups at most 256 entries")
    if sg_type == Q8_0 and D % 32:
        pytest.skip("Q8_0 rows hold whole 32-element blocks")
    rng = np.random.default_rng(T * 1000 + E + k + D)
    x = rng.standard_normal((T, D)).astype(np.float32)
    W = (rng.standard_normal((E, D)) / np.sqrt(D)).astype(np.float32)
    want_logits = gemv(W, F32, D, x)
    want_ids, want_w = moe.router_topk(want_logits, k)
    J = T * slots
    dx, dW = to_dev(x), to_dev(W)
    logits, ids, w = poisoned((T, E)), poisoned((T, slots), np.int32), poisoned((T, slots))
    groups = (poisoned((J,), np.int32), poisoned((J,), np.int32), cp.zeros((J, GEMV_MAXT), np.int32))
    done = cp.zeros((1,), np.uint32)
    sg = poisoned((T, 1))
    gate = None
    if sg_type is not None:
        sg_w = raw_weight(rng, (D,), sg_type, 0.05)
        gate = (to_dev(sg_w), sg_type, sg)

    def record(stream):
        launch_moe.router_gemv_topk(dx, dW, F32, k, groups, done, out_logits=logits, out_ids=ids, out_w=w,
                                    scalar_gate=gate, shared_id=E if shared else None, stream=stream)

    outs = [logits, ids, w, *groups[:2]] + ([sg] if gate else [])
    got = assert_replay_equals_eager(record, [o for o in outs if o.dtype == np.float32])
    assert int(done.get()[0]) == 0
    assert_close("logits", want_logits, got[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ids.get()[:, :k], want_ids)
    np.testing.assert_allclose(w.get()[:, :k], want_w, rtol=0, atol=1e-6)
    if shared:
        assert (ids.get()[:, k] == E).all()
        np.testing.assert_array_equal(w.get()[:, k], sg.get()[:, 0])
    want_groups = (poisoned((J,), np.int32), poisoned((J,), np.int32), cp.zeros((J, GEMV_MAXT), np.int32))
    launch_moe.group_entries(ids, J, want_groups)
    for name, a, b in zip(("g_expert", "g_count", "g_entries"), groups, want_groups):
        np.testing.assert_array_equal(a.get(), b.get(), err_msg=name)
    if gate is not None:
        w_sg = quants.dequantize(sg_w, sg_type).reshape(-1).astype(np.float32)
        assert_close("sg", (1.0 / (1.0 + np.exp(-(x @ w_sg)))).reshape(T, 1).astype(np.float32), sg, rtol=1e-5)


@pytest.mark.parametrize("T", (1, 5, 9))
@pytest.mark.parametrize("E,k", [(512, 10), (77, 16)])
def test_router_gemv_topk_ties_go_to_the_lower_id(T, E, k):
    """Equal probabilities (router rows repeated, so their logits are the same bits) go to the lower id, as numpy's
    stable order does, across a lane's slots and across lanes (the top-k's per-lane tree and warp argmax); the gate
    blocks (min(T, 8) before the GEMV's, T = 9 loops one over two rows) write every row's gate; eager and graph
    replays equal."""
    import cupy as cp

    from strata_cli.gpu import launch_moe
    from strata_cli.gpu.launch_util import GEMV_MAXT
    from strata_cli.ops.gemv import gemv

    rng = np.random.default_rng(T * 7 + E + k)
    D = 256
    x = rng.standard_normal((T, D)).astype(np.float32)
    distinct = (rng.standard_normal((E // 4 + 1, D)) / np.sqrt(D)).astype(np.float32)
    W = distinct[rng.integers(0, distinct.shape[0], E)]  # ~4 copies of every row, at ids of every lane and slot
    want_logits = gemv(W, F32, D, x)
    want_ids, want_w = moe.router_topk(want_logits, k)
    J = T * k
    dx, dW = to_dev(x), to_dev(W)
    logits, ids, w, sg = poisoned((T, E)), poisoned((T, k), np.int32), poisoned((T, k)), poisoned((T, 1))
    groups = (poisoned((J,), np.int32), poisoned((J,), np.int32), cp.zeros((J, GEMV_MAXT), np.int32))
    done = cp.zeros((1,), np.uint32)
    sg_w = raw_weight(rng, (D,), F32, 0.05)
    d_sg_w = to_dev(sg_w)  # on the device before the capture (no allocation while a stream captures)

    def record(stream):
        launch_moe.router_gemv_topk(dx, dW, F32, k, groups, done, out_logits=logits, out_ids=ids, out_w=w,
                                    scalar_gate=(d_sg_w, F32, sg), stream=stream)

    got_logits, _, got_sg = assert_replay_equals_eager(record, [logits, w, sg])
    tied = np.array([len(set(row.tolist())) < len(row) for row in want_logits])
    assert tied.all()  # every row holds equal logits
    assert_close("logits", want_logits, got_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ids.get(), want_ids)
    np.testing.assert_allclose(w.get(), want_w, rtol=0, atol=1e-6)
    assert_close("sg", (1.0 / (1.0 + np.exp(-(x @ sg_w)))).reshape(T, 1).astype(np.float32), got_sg, rtol=1e-5)


@pytest.mark.parametrize("ggml_type", (F32, F16, BF16), ids=("F32", "F16", "BF16"))
@pytest.mark.parametrize("T,K", [(1, 1), (3, 4), (8, 2), (16, 3)])
@pytest.mark.parametrize("F,D", [(45, 97), (64, 96)])
def test_float_gateup_is_one_launch_and_matches_reference(ggml_type, T, K, F, D):
    """kernels/gemv.cu gemv_gateup_<type>_t<NT> (float experts' gate and up in one launch): h = silu(gate . x) *
    (up . x) per (row, slot) entry against numpy, on an output width past the warps' 4-row groups (45) and an input
    width past the 32-value steps (97); h and the output NaN-poisoned; one launch for both matrices (the kinds
    listed); eager against graph replay."""
    from strata_cli.gpu import compile as nvrtc
    from strata_cli.gpu import launch_moe
    from strata_cli.ops.gemv import dequant_rows

    rng = np.random.default_rng(T * 100 + K * 10 + F + ggml_type)
    E = 9
    types = (ggml_type,) * 3
    gate, up, down = _experts(rng, E, F, D, types)
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = _routing(rng, T, E, K)
    wg, wu = (dequant_rows(m, ggml_type, D).reshape(E, F, D) for m in (gate, up))
    g = np.einsum("tkfd,td->tkf", wg[ids], x)
    want_h = (g / (1 + np.exp(-g)) * np.einsum("tkfd,td->tkf", wu[ids], x)).reshape(T * K, F)
    want = moe.routed_experts_raw(x, ids, w, gate, up, down, types)
    scratch = launch_moe.MoeScratch.empty(T * K, F, D)
    out = poisoned((T, D))
    d_x, d_ids, d_w, d_g, d_u, d_d = (to_dev(a) for a in (x, ids, w, gate, up, down))

    scratch.h.fill(np.nan)

    def record(stream):
        launch_moe.routed_experts(d_x, d_ids, d_w, d_g, d_u, d_d, types, out=out, scratch=scratch, stream=stream)

    launched = []
    with nvrtc.observing(lambda name, args: launched.append(name.split("_t")[0])):
        got, h = assert_replay_equals_eager(record, [out, scratch.h])
    # eager and captured: each time one gate-up launch and one down launch (gemv_expert_<type>)
    suffix = quants.TYPE_NAMES[ggml_type].lower()
    assert launched.count(f"gemv_gateup_{suffix}") == launched.count(f"gemv_expert_{suffix}") == 2, launched
    assert_close("gate-up h", want_h, h)
    assert_close("routed experts", want, got)
