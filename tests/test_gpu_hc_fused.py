"""The fused launches of the window against their numpy references on odd shapes with NaN-poisoned outputs:
the hyper-connection read (kernels/hyper.cu hc_write_norm + hc_mix_inject, launch_hyper.hc_read_fused;
ops/hyper.hc_write_read_raw), which windows of T >= 4 take (launch_util.WINDOW_PATHS). Then the window with each path at every T (GPUEngine(window_paths=)) against the
numpy engine, eager against graph replay, and its node counts (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import TYPES, assert_close, assert_replay_equals_eager, poisoned, raw_weight, to_dev

from strata_cli.engine.reference import ReferenceEngine
from strata_cli.gpu.launch_util import WindowPath
from strata_cli.model.gguf_file import open_model
from strata_cli.ops import hyper

pytestmark = pytest.mark.gpu


def every_t(fused_hc: bool, gemv_tc: bool = False):
    """A GPUEngine window_paths taking one path at every T."""
    return lambda T: WindowPath(fused_hc=fused_hc, gemv_tc=gemv_tc)


def _inputs(rng, T, C, D, L, ggml_type, inject, pending):
    R = rng.standard_normal((T, C, D)).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(C * D)).astype(np.float32)
    down = raw_weight(rng, (L, C * D), ggml_type, 0.2)
    up = raw_weight(rng, (C * D, L), ggml_type, 0.3)
    inj_w = raw_weight(rng, (C, C * D), ggml_type, 0.2) if inject else None
    pend = None
    if pending:
        pend = (rng.standard_normal((T, D)).astype(np.float32), (2.0 * rng.random((T, C))).astype(np.float32))
    return R, norm_w, down, up, inj_w, pend


def _type_shapes():
    """(type, C, D, L) cases: every type on each shape its rows can hold (Q8_0 rows need whole 32-wide blocks, and
    the up matrix is L wide, so L = 45 is for the float types only)."""
    from strata_cli.model import quants

    for t in TYPES:
        for C, D, L in [(4, 40, 32), (3, 32, 64), (5, 96, 45)]:
            if t != quants.Q8_0 or L % 32 == 0:
                yield pytest.param(t, C, D, L, id=f"{C}-{D}-{L}-{quants.TYPE_NAMES[t]}")


@pytest.mark.parametrize("ggml_type,C,D,L", list(_type_shapes()))
@pytest.mark.parametrize("T", (1, 3, 16))
@pytest.mark.parametrize("inject", (True, False), ids=("inject", "head"))
@pytest.mark.parametrize("pending", (True, False), ids=("write", "nowrite"))
def test_hc_read_fused_matches_reference(ggml_type, C, D, L, T, inject, pending):
    from strata_cli.gpu import launch_hyper

    rng = np.random.default_rng(T * 31 + C * 7 + ggml_type + 1000 * pending)
    R, norm_w, down, up, inj_w, pend = _inputs(rng, T, C, D, L, ggml_type, inject, pending)
    eps = 1e-6
    want_R, want_mixed, want_inj = hyper.hc_write_read_raw(R, pend, norm_w, down, ggml_type, up, ggml_type, inj_w,
                                                           ggml_type, eps)
    R_dev = to_dev(R)
    scratch = launch_hyper.HcScratch(poisoned((T + 2, C * D)), poisoned((T + 2, L)), poisoned((T + 2, C * D)),
                                     poisoned((T + 2, C * C)))
    out_mixed = poisoned((T, D))
    out_inj = poisoned((T, C)) if inject else None
    mixed, got_inj = launch_hyper.hc_read_fused(
        R_dev, to_dev(norm_w), to_dev(down), ggml_type, to_dev(up), ggml_type,
        None if inj_w is None else to_dev(inj_w), ggml_type, eps,
        pending=None if pend is None else (to_dev(pend[0]), to_dev(pend[1])), out_mixed=out_mixed,
        out_inj=out_inj, scratch=scratch)
    assert mixed is out_mixed
    # the write is hc_write's arithmetic (product rounded, then added): exact
    assert_close("R after the write", want_R, R_dev, rtol=0, atol=0)
    assert_close("mixed", want_mixed, mixed)
    if inject:
        assert got_inj is out_inj
        assert_close("inj", want_inj, got_inj)
    else:
        assert got_inj is None


def test_hc_read_fused_equals_unfused_launches():
    """The fused read's R and mixed equal hc_write + hc_read bit for bit (same norm, GEMVs and mix arithmetic)."""
    from strata_cli.gpu import launch_hyper
    from strata_cli.model import quants

    rng = np.random.default_rng(11)
    T, C, D, L = 3, 4, 64, 32
    R, norm_w, down, up, inj_w, pend = _inputs(rng, T, C, D, L, quants.Q8_0, True, True)
    args = (to_dev(norm_w), to_dev(down), quants.Q8_0, to_dev(up), quants.Q8_0, to_dev(inj_w), quants.Q8_0, 1e-6)
    R_old = to_dev(R)
    launch_hyper.hc_write(R_old, to_dev(pend[0]), to_dev(pend[1]), out=R_old)
    mixed_old, inj_old = launch_hyper.hc_read(R_old, *args)
    R_new = to_dev(R)
    mixed_new, inj_new = launch_hyper.hc_read_fused(R_new, *args, pending=(to_dev(pend[0]), to_dev(pend[1])))
    assert_close("R", R_old.get(), R_new, rtol=0, atol=0)
    assert_close("mixed", mixed_old.get(), mixed_new, rtol=0, atol=0)
    assert_close("inj (reassociated)", inj_old.get(), inj_new, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T,C,D,L", [(1, 4, 64, 32), (3, 4, 40, 64), (16, 5, 96, 32)])
def test_hc_read_pending_equals_write_then_read(T, C, D, L):
    """hc_read(pending=) (the unfused read of windows of T <= 3 after a mixer: write + norm in one kernel) equals
    hc_write + hc_read bit for bit: R, mixed and inj; NaN-poisoned outputs, and a graph replays the eager bits."""
    import cupy as cp

    from strata_cli.gpu import launch_hyper
    from strata_cli.model import quants

    rng = np.random.default_rng(T * 5 + C + D)
    R, norm_w, down, up, inj_w, pend = _inputs(rng, T, C, D, L, quants.Q8_0, True, True)
    args = (to_dev(norm_w), to_dev(down), quants.Q8_0, to_dev(up), quants.Q8_0, to_dev(inj_w), quants.Q8_0, 1e-6)
    R_old = to_dev(R)
    launch_hyper.hc_write(R_old, to_dev(pend[0]), to_dev(pend[1]), out=R_old)
    mixed_old, inj_old = launch_hyper.hc_read(R_old, *args)
    R0, pend_d = to_dev(R), (to_dev(pend[0]), to_dev(pend[1]))
    R_new, mixed, inj = cp.empty_like(R0), poisoned((T, D)), poisoned((T, C))
    scratch = launch_hyper.HcScratch.empty(T, C, D, L)

    def record(stream):
        with stream:
            cp.copyto(R_new, R0)
        launch_hyper.hc_read(R_new, *args, out_mixed=mixed, out_inj=inj, scratch=scratch, stream=stream,
                             pending=pend_d)

    got_R, got_mixed, got_inj = assert_replay_equals_eager(record, [R_new, mixed, inj])
    assert_close("R", R_old.get(), got_R, rtol=0, atol=0)
    assert_close("mixed", mixed_old.get(), got_mixed, rtol=0, atol=0)
    assert_close("inj", inj_old.get(), got_inj, rtol=0, atol=0)


def _rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("fused", [False, True], ids=("unfused", "fused"))
@pytest.mark.parametrize("name", ["model-q8_0.gguf", "model-f32.gguf"])
def test_window_path_matches_numpy_and_replays_eager(fixture_dir, name, fused):
    """Each path at every T (1, 3, 5, 7, 8), fused with tensor-core GEMVs, unfused without."""
    from strata_cli.engine.gpu import GPUEngine

    model = open_model(fixture_dir / name)
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    eng = GPUEngine(model, window_paths=every_t(fused, fused))
    runs = {}
    for eager in (True, False):
        eng.reset()
        rows, ids = [], []
        for pos, T in ((0, 8), (8, 1), (9, 3), (12, 5), (17, 7)):
            out = eng.run(tokens[pos:pos + T], pos, eager=eager)
            rows.append(out.logits)
            ids.append(out.ids)
            eng.commit(T, eager=eager)
        runs[eager] = np.concatenate(rows), np.concatenate(ids)
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    ref = ReferenceEngine(model).run(tokens[:24], 0)
    assert _rel_err(runs[False][0], ref.logits) <= 1e-3
    np.testing.assert_array_equal(runs[False][1], ref.ids)


def test_fused_window_has_fewer_nodes(fixture_dir):
    """2 nodes fewer per layer (two reads of 4 nodes instead of 5; the unfused window applies the mixer's write in
    its FFN read's norm kernel and the MoE's in the routed experts' combine), one write kept before a PLE layer that
    is not the first; GPUEngine.layer_nodes (graph-nodes' per-layer line) sees the same per layer."""
    from strata_cli.engine.gpu import GPUEngine

    model = open_model(fixture_dir / "model-q8_0.gguf")
    counts, per_layer = {}, {}
    for fused in ("0", "1"):
        eng = GPUEngine(model, window_paths=every_t(fused == "1"))
        counts[fused] = eng.graph(1).summary()
        per_layer[fused] = eng.layer_nodes(1)
        assert len(per_layer[fused]) == eng.g.n_layers and sum(per_layer[fused]) < counts[fused].nodes
        kinds = dict(counts[fused].kinds)
        if fused == "1":
            assert kinds.get("hc_write_norm", 0) == 2 * eng.g.n_layers + 1 and "hc_norm" not in kinds
        else:
            assert kinds.get("hc_norm", 0) == eng.g.n_layers + 1 and kinds.get("hc_write_norm", 0) == eng.g.n_layers
    g = eng.g
    kept = 1 if g.ple is not None and g.ple.layer > 0 else 0
    assert counts["0"].nodes - counts["1"].nodes == 2 * g.n_layers - kept
    assert [a - b for a, b in zip(per_layer["0"], per_layer["1"])] == [
        1 if g.ple is not None and layer == g.ple.layer > 0 else 2 for layer in range(g.n_layers)]
