"""The hyper-connection read (kernels/hyper.cu hc_write_norm + one down/inject GEMV + hc_up_mix,
launch_hyper.hc_read) against its numpy reference (ops/hyper.hc_write_read_raw) on odd shapes with NaN-poisoned
outputs and scratch, eager against graph replay with the engine's aliasing (inject gates written over the pending
write's); then the window at every T with each GEMV path against the numpy engine, eager against graph replay
(skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import (TYPE_IDS, TYPES, assert_close, assert_replay_equals_eager, hc_weights, poisoned,
                            raw_weight, to_dev)

from strata_cli.engine.reference import ReferenceEngine
from strata_cli.gpu.launch_util import WindowPath
from strata_cli.model import quants
from strata_cli.model.gguf_file import open_model
from strata_cli.ops import hyper

pytestmark = pytest.mark.gpu


def _inputs(rng, T, C, D, L, types, inject, pending):
    """types = (down, up, inject)."""
    R = rng.standard_normal((T, C, D)).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(C * D)).astype(np.float32)
    down = raw_weight(rng, (L, C * D), types[0], 0.2)
    up = raw_weight(rng, (C * D, L), types[1], 0.3)
    inj_w = raw_weight(rng, (C, C * D), types[2], 0.2) if inject else None
    pend = None
    if pending:
        pend = (rng.standard_normal((T, D)).astype(np.float32), (2.0 * rng.random((T, C))).astype(np.float32))
    return R, norm_w, down, up, inj_w, pend


def _check(T, C, D, L, types, inject, pending, pack, seed):
    from strata_cli.gpu import launch_hyper

    rng = np.random.default_rng(seed)
    R, norm_w, down, up, inj_w, pend = _inputs(rng, T, C, D, L, types, inject, pending)
    eps = 1e-6
    want_R, want_mixed, want_inj = hyper.hc_write_read_raw(R, pend, norm_w, down, types[0], up, types[1], inj_w,
                                                           types[2], eps)
    w = hc_weights(norm_w, down, types[0], up, types[1], inj_w, types[2], pack=pack)
    R_dev = to_dev(R)
    n_dn = w.dn_raw.shape[0]
    scratch = launch_hyper.HcScratch(poisoned((T + 2, C * D)), poisoned((T + 2) * n_dn + 5))
    out_mixed = poisoned((T, D))
    out_inj = poisoned((T, C)) if inject else None
    mixed, got_inj = launch_hyper.hc_read(R_dev, w, eps,
                                          pending=None if pend is None else (to_dev(pend[0]), to_dev(pend[1])),
                                          out_mixed=out_mixed, out_inj=out_inj, scratch=scratch)
    assert mixed is out_mixed
    # the write is hc_write's arithmetic (product rounded, then added): exact
    assert_close("R after the write", want_R, R_dev, rtol=0, atol=0)
    assert_close("mixed", want_mixed, mixed)
    if inject:
        assert got_inj is out_inj
        assert_close("inj", want_inj, got_inj)
    else:
        assert got_inj is None


@pytest.mark.parametrize("ggml_type", TYPES, ids=TYPE_IDS)
# the released width (hc_write_norm: one pass of 5 elements a thread in registers, 5 x 512 = 2560 exactly) and
# wider than hc_write_norm's pass (a second pass, R re-read) and hc_up_mix's registers (L > 32 x 10: its tail loop);
# C = 5 past hc_up_mix's 4 streams in registers
@pytest.mark.parametrize("C,D,L", [(4, 40, 32), (3, 33, 64), (5, 96, 96), (4, 2560, 320), (2, 4133, 400)])
@pytest.mark.parametrize("T", (1, 3, 16))
@pytest.mark.parametrize("inject", (True, False), ids=("inject", "head"))
@pytest.mark.parametrize("pending", (True, False), ids=("write", "nowrite"))
def test_hc_read_matches_reference(ggml_type, C, D, L, T, inject, pending):
    if ggml_type == quants.Q8_0 and (C * D) % 32:
        pytest.skip("Q8_0 rows need whole 32-wide blocks (down and inject are C*D wide)")
    _check(T, C, D, L, (ggml_type,) * 3, inject, pending, False, T * 31 + C * 7 + ggml_type + 1000 * pending)


@pytest.mark.parametrize("T", (1, 2, 7, 16))
@pytest.mark.parametrize("types", [(quants.Q8_0, quants.Q8_0, quants.Q8_0), (quants.F16, quants.BF16, quants.Q8_0)],
                         ids=("q8_0-packed", "mixed-types"))
def test_hc_read_as_the_engine_loads_it(T, types):
    """Down and inject stacked and repacked to Q8_0_R32 (the engine's Q8_0 files), or of two types (stacked as F32),
    with the fixture's shape class: L not a multiple of 32 rows plus C inject rows, padded."""
    _check(T, 4, 128, 16 if types[1] != quants.Q8_0 else 32, types, True, True, True, T + 17)


@pytest.mark.parametrize("T,C,D,L", [(1, 4, 64, 32), (3, 4, 40, 64), (16, 5, 96, 32)])
def test_hc_read_replays_eager_with_the_engines_aliasing(T, C, D, L):
    """The engine passes one inj buffer as the pending write's gates and as the read's output: the norm kernel
    reads it before hc_up_mix writes it. Eager and every graph replay (outputs NaN-filled first) give the same
    bits, and those are the reference's."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv, launch_hyper

    rng = np.random.default_rng(T * 5 + C + D)
    R, norm_w, down, up, inj_w, pend = _inputs(rng, T, C, D, L, (quants.Q8_0,) * 3, True, True)
    want_R, want_mixed, want_inj = hyper.hc_write_read_raw(R, pend, norm_w, down, quants.Q8_0, up, quants.Q8_0,
                                                           inj_w, quants.Q8_0, 1e-6)
    w = hc_weights(norm_w, down, quants.Q8_0, up, quants.Q8_0, inj_w, quants.Q8_0, pack=True)
    R0, inj0, bo = to_dev(R), to_dev(pend[1]), to_dev(pend[0])
    R_new, inj, mixed = cp.empty_like(R0), cp.empty_like(inj0), poisoned((T, D))
    scratch = launch_hyper.HcScratch.empty(T, C, D, w.dn_raw.shape[0])
    split = launch_gemv.SplitK.empty()

    def record(stream):
        with stream:
            cp.copyto(R_new, R0)
            cp.copyto(inj, inj0)
        launch_hyper.hc_read(R_new, w, 1e-6, pending=(bo, inj), out_mixed=mixed, out_inj=inj, scratch=scratch,
                             split=split, stream=stream)

    got_R, got_mixed, got_inj = assert_replay_equals_eager(record, [R_new, mixed, inj])
    assert_close("R", want_R, got_R, rtol=0, atol=0)
    assert_close("mixed", want_mixed, got_mixed)
    assert_close("inj", want_inj, got_inj)


# every window size: hc_up_mix takes the rows in pairs (odd T: the last pair's second row is computed, not stored);
# the model's read (Q8_0 up weights, their scales shared by shuffle, L = 320 in registers), a row past the
# registers with a fifth stream (F16: the tail loop, both rows of a pair at once) and 3 streams in registers over
# an odd width (BF16 up, F32 down: D = 37, the last block's warps past D)
@pytest.mark.parametrize("T", range(1, 17))
@pytest.mark.parametrize("C,D,L,types", [(4, 2560, 320, (quants.Q8_0,) * 3),
                                         (5, 96, 352, (quants.Q8_0, quants.F16, quants.Q8_0)),
                                         (3, 37, 32, (quants.F32, quants.BF16, quants.F32))],
                         ids=("model-q8_0", "wide-f16", "c3-bf16"))
def test_hc_up_mix_every_t_matches_reference_and_replays(T, C, D, L, types):
    """hc_read at T = 1..16 against the reference, NaN-poisoned outputs and scratch, then captured in a graph that
    replays the eager bits."""
    from strata_cli.gpu import launch_gemv, launch_hyper

    _check(T, C, D, L, types, True, True, True, T * 13 + C + L)
    rng = np.random.default_rng(T + 100 * C)
    R, norm_w, down, up, inj_w, _ = _inputs(rng, T, C, D, L, types, True, False)
    w = hc_weights(norm_w, down, types[0], up, types[1], inj_w, types[2], pack=True)
    R_dev, mixed, inj = to_dev(R), poisoned((T, D)), poisoned((T, C))
    scratch = launch_hyper.HcScratch(poisoned((T, C * D)), poisoned(T * w.dn_raw.shape[0]))
    split = launch_gemv.SplitK.empty()
    _, want_mixed, want_inj = hyper.hc_write_read_raw(R, None, norm_w, down, types[0], up, types[1], inj_w,
                                                      types[2], 1e-6)

    def record(stream):
        launch_hyper.hc_read(R_dev, w, 1e-6, out_mixed=mixed, out_inj=inj, scratch=scratch, split=split,
                             stream=stream)

    got_mixed, got_inj = assert_replay_equals_eager(record, [mixed, inj])
    assert_close("mixed", want_mixed, got_mixed)
    assert_close("inj", want_inj, got_inj)


def every_t(gemv_tc: bool):
    """A GPUEngine window_paths taking one GEMV path at every T."""
    return lambda T: WindowPath(gemv_tc=gemv_tc)


def _rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("gemv_tc", [False, True], ids=("cuda-core", "tensor-core"))
@pytest.mark.parametrize("name", ["model-q8_0.gguf", "model-f32.gguf"])
def test_window_matches_numpy_and_replays_eager(fixture_dir, name, gemv_tc):
    """Windows of T = 8, 1, 3, 5, 7 (every block's write in the next read) against the numpy engine; the graphs
    replay the eager bits."""
    from strata_cli.engine.gpu import GPUEngine

    model = open_model(fixture_dir / name)
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    eng = GPUEngine(model, window_paths=every_t(gemv_tc))
    runs = {}
    try:
        for eager in (True, False):
            eng.reset()
            rows, ids = [], []
            for pos, T in ((0, 8), (8, 1), (9, 3), (12, 5), (17, 7)):
                out = eng.run(tokens[pos:pos + T], pos, eager=eager)
                rows.append(out.logits)
                ids.append(out.ids)
                eng.commit(T, eager=eager)
            runs[eager] = np.concatenate(rows), np.concatenate(ids)
    finally:
        eng.close()
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    ref = ReferenceEngine(model).run(tokens[:24], 0)
    assert _rel_err(runs[False][0], ref.logits) <= 1e-3
    np.testing.assert_array_equal(runs[False][1], ref.ids)


# K = 11: the window's 10 routed slots + the shared expert's (hc_write_norm: chunks of 6 slots, two); K = 20 past
# hc_write's chunk of 17
@pytest.mark.parametrize("T,C,D,K", [(1, 4, 64, 4), (3, 4, 40, 10), (16, 5, 96, 1), (1, 4, 2560, 11),
                                     (2, 4, 4136, 20)])
@pytest.mark.parametrize("shared", (True, False), ids=("shared", "noshared"))
def test_read_and_write_compute_the_experts_combine(T, C, D, K, shared):
    """A CombineWrite (the window after its routed experts): the block output is the experts' combine, computed in
    the read's first kernel and in hc_write, bit for bit launch_moe.combine's (moe_combine) then the plain write;
    against the numpy reference (ops/moe.combine, then hc_write_read_raw); NaN-poisoned outputs, graph replay."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv, launch_hyper, launch_moe
    from strata_cli.ops import moe

    rng = np.random.default_rng(T * 7 + C + D + K + shared)
    L = 32
    R, norm_w, down, up, inj_w, _ = _inputs(rng, T, C, D, L, (quants.Q8_0,) * 3, True, False)
    parts = rng.standard_normal((T * K + 3, D)).astype(np.float32)  # more rows than the window's entries
    weights = rng.random((T, K)).astype(np.float32)
    sh = rng.standard_normal((T, D)).astype(np.float32) if shared else None
    inj_prev = (2.0 * rng.random((T, C))).astype(np.float32)
    bo = moe.combine(parts, weights, sh)
    want_R, want_mixed, want_inj = hyper.hc_write_read_raw(R, (bo, inj_prev), norm_w, down, quants.Q8_0, up,
                                                           quants.Q8_0, inj_w, quants.Q8_0, 1e-6)
    w = hc_weights(norm_w, down, quants.Q8_0, up, quants.Q8_0, inj_w, quants.Q8_0, pack=True)
    dparts, dw, dsh, dinj0, R0 = (to_dev(a) for a in (parts, weights, sh if shared else np.zeros(1), inj_prev, R))
    pending = launch_hyper.CombineWrite(dparts, dw, dsh if shared else None, cp.empty_like(dinj0))
    R_read, R_write, mixed = cp.empty_like(R0), poisoned((T, C, D)), poisoned((T, D))
    scratch = launch_hyper.HcScratch.empty(T, C, D, w.dn_raw.shape[0])
    split = launch_gemv.SplitK.empty()

    def record(stream):
        with stream:
            cp.copyto(R_read, R0)
            cp.copyto(pending.inj, dinj0)
        launch_hyper.hc_write(R0, pending, out=R_write, stream=stream)
        launch_hyper.hc_read(R_read, w, 1e-6, pending=pending, out_mixed=mixed, out_inj=pending.inj,
                             scratch=scratch, split=split, stream=stream)

    got_write, got_R, got_mixed, got_inj = assert_replay_equals_eager(record, [R_write, R_read, mixed, pending.inj])
    plain = launch_hyper.hc_write(R0, (launch_moe.combine(dparts, dw, dsh if shared else None), dinj0)).get()
    np.testing.assert_array_equal(got_write, plain)
    np.testing.assert_array_equal(got_R, plain)
    assert_close("R", want_R, got_R, rtol=1e-6, atol=1e-6)  # the combine's products may be fused (FMA) on the GPU
    assert_close("mixed", want_mixed, got_mixed)
    assert_close("inj", want_inj, got_inj)
