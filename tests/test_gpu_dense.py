"""kernels/gemv.cu, hyper.cu and sampling.cu (launch_gemv, launch_hyper, launch_sampling) against their numpy
references, on odd shapes (skipped without a GPU).

Every output is NaN-poisoned before the launch, so an element the kernel forgets to write fails the test.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import TYPE_IDS, TYPES, assert_close, hc_weights, poisoned, raw_weight, to_dev

from strata_cli.model import quants
from strata_cli.ops import gemv as ref
from strata_cli.ops import hyper, sampling

pytestmark = pytest.mark.gpu

WINDOWS = (1, 3, 7, 16, 19)  # 19 spans two 16-row chunks of the dense GEMV


def _n_in_for(ggml_type):
    return (96, 160) if ggml_type == quants.Q8_0 else (45, 96, 160)


@pytest.mark.parametrize("ggml_type", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("n_out", (1, 3, 257))
@pytest.mark.parametrize("T", WINDOWS)
def test_gemv_matches_reference(ggml_type, n_out, T):
    from strata_cli.gpu import launch_gemv

    rng = np.random.default_rng(1000 * ggml_type + 10 * n_out + T)
    for n_in in _n_in_for(ggml_type):
        w = raw_weight(rng, (n_out, n_in), ggml_type)
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        out = poisoned((T, n_out))
        got = launch_gemv.gemv(to_dev(w), ggml_type, n_in, to_dev(x), out=out)
        assert got is out
        # inputs are O(1), so outputs are ~sqrt(n_in)/2: floor the scale at 1 for the n_out = T = 1 cases
        assert_close(f"gemv {quants.TYPE_NAMES[ggml_type]} n_in={n_in}", ref.gemv(w, ggml_type, n_in, x), got,
                     floor=1.0)


def test_gemv_allocates_output_without_out_and_takes_f16_bytes():
    from strata_cli.gpu import launch_gemv

    rng = np.random.default_rng(7)
    w = raw_weight(rng, (33, 64), quants.F16)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    got = launch_gemv.gemv(to_dev(w.view(np.uint8)), quants.F16, 64, to_dev(x))
    assert_close("gemv f16 bytes", ref.gemv(w, quants.F16, 64, x), got)


def _hc_inputs(rng, T, C, D, L, ggml_type, inject):
    R = rng.standard_normal((T, C, D)).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(C * D)).astype(np.float32)
    down = raw_weight(rng, (L, C * D), ggml_type, 0.2)
    up = raw_weight(rng, (C * D, L), ggml_type, 0.3)
    inj = raw_weight(rng, (C, C * D), ggml_type, 0.2) if inject else None
    return R, norm_w, down, up, inj


@pytest.mark.parametrize("ggml_type", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("C,D,L", [(4, 40, 32), (3, 32, 64)])
@pytest.mark.parametrize("T", (1, 3, 7, 16))
@pytest.mark.parametrize("inject", (True, False), ids=("inject", "head"))
def test_hc_read_matches_reference(ggml_type, C, D, L, T, inject):
    from strata_cli.gpu import launch_hyper

    rng = np.random.default_rng(T * 31 + C * 7 + ggml_type)
    R, norm_w, down, up, inj = _hc_inputs(rng, T, C, D, L, ggml_type, inject)
    eps = 1e-6
    want_mixed, want_inj = hyper.hc_read_raw(R, norm_w, down, ggml_type, up, ggml_type, inj, ggml_type, eps)
    out_mixed = poisoned((T, D))
    out_inj = poisoned((T, C)) if inject else None
    w = hc_weights(norm_w, down, ggml_type, up, ggml_type, inj, ggml_type)
    mixed, got_inj = launch_hyper.hc_read(to_dev(R), w, eps, out_mixed=out_mixed, out_inj=out_inj)
    assert_close("hc_read mixed", want_mixed, mixed)
    if inject:
        assert_close("hc_read inj", want_inj, got_inj)
    else:
        assert got_inj is None


def test_hc_read_uses_oversized_scratch():
    from strata_cli.gpu import launch_hyper

    rng = np.random.default_rng(5)
    T, C, D, L = 3, 4, 40, 32
    R, norm_w, down, up, inj = _hc_inputs(rng, T, C, D, L, quants.BF16, True)
    scratch = launch_hyper.HcScratch.empty(16, C, D, 2 * (L + C))
    w = hc_weights(norm_w, down, quants.BF16, up, quants.BF16, inj, quants.BF16)
    mixed, got_inj = launch_hyper.hc_read(to_dev(R), w, 1e-6, scratch=scratch)
    want_mixed, want_inj = hyper.hc_read_raw(R, norm_w, down, quants.BF16, up, quants.BF16, inj, quants.BF16, 1e-6)
    assert_close("mixed", want_mixed, mixed)
    assert_close("inj", want_inj, got_inj)


@pytest.mark.parametrize("T,C,D", [(1, 4, 40), (7, 3, 33), (16, 4, 257)])
def test_hc_write_matches_reference_and_runs_in_place(T, C, D):
    from strata_cli.gpu import launch_hyper

    rng = np.random.default_rng(T + C + D)
    R = rng.standard_normal((T, C, D)).astype(np.float32)
    bo = rng.standard_normal((T, D)).astype(np.float32)
    inj = (2.0 * rng.random((T, C))).astype(np.float32)
    want = hyper.hc_write(R, bo, inj)
    got = launch_hyper.hc_write(to_dev(R), (to_dev(bo), to_dev(inj)), out=poisoned((T, C, D)))
    assert_close("hc_write", want, got, rtol=0, atol=0)
    R_dev = to_dev(R)
    launch_hyper.hc_write(R_dev, (to_dev(bo), to_dev(inj)), out=R_dev)
    assert_close("hc_write in place", want, R_dev, rtol=0, atol=0)


@pytest.mark.parametrize("T,V", [(T, V) for T in (1, 3, 7, 16) for V in (1, 257, 5000, 300001)]
                         + [(2, 4096 * 1024 + 77)])  # past 1024 chunks: chunks wider than a thread's 16 registers
def test_argmax_rows_matches_reference_with_ties(T, V):
    from strata_cli.gpu import launch_sampling

    rng = np.random.default_rng(T * V)
    logits = rng.standard_normal((T, V)).astype(np.float32)
    if V > 1:  # a tie on the maximum in every row: the lower id must win
        top = logits.argmax(axis=1)
        dup = (top * 7 + 3) % V
        logits[np.arange(T), dup] = logits[np.arange(T), top]
    out = poisoned((T,), np.int32)
    launch_sampling.argmax_rows(to_dev(logits), out=out)
    np.testing.assert_array_equal(out.get(), sampling.argmax_rows(logits))


def test_hc_read_and_gemv_capture_into_a_graph_without_allocating():
    """With every output and scratch preallocated, the launches capture in thread-local mode and replay right."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv, launch_hyper, launch_sampling
    from strata_cli.gpu.graphs import CapturedGraph, new_stream

    rng = np.random.default_rng(11)
    T, C, D, L, V = 7, 4, 40, 32, 300
    R, norm_w, down, up, inj = _hc_inputs(rng, T, C, D, L, quants.Q8_0, True)
    head = raw_weight(rng, (V, D), quants.BF16)
    dev = [to_dev(a) for a in (R, norm_w, down, up, inj, head)]
    w = hc_weights(norm_w, down, quants.Q8_0, up, quants.Q8_0, inj, quants.Q8_0)
    mixed, inj_out, logits = cp.empty((T, D), cp.float32), cp.empty((T, C), cp.float32), cp.empty((T, V), cp.float32)
    ids = cp.empty((T,), cp.int32)
    scratch = launch_hyper.HcScratch.empty(T, C, D, 64)
    split, argmax = launch_gemv.SplitK.empty(), launch_sampling.ArgmaxScratch.empty()  # no allocation under capture

    def record(stream):
        launch_hyper.hc_read(dev[0], w, 1e-6, out_mixed=mixed, out_inj=inj_out, scratch=scratch, split=split,
                             stream=stream)
        launch_gemv.gemv(dev[5], quants.BF16, D, mixed, out=logits, split=split, stream=stream)
        launch_sampling.argmax_rows(logits, out=ids, scratch=argmax, stream=stream)

    stream = new_stream()  # non-blocking: wait for the uploads made on the default stream
    cp.cuda.Device().synchronize()
    record(stream)  # eager warm-up compiles and loads the modules before capture
    stream.synchronize()
    graph = CapturedGraph(record, stream)
    for buf in (mixed, inj_out, logits):
        buf.fill(np.nan)
    cp.cuda.Device().synchronize()
    graph.launch()
    stream.synchronize()
    want_mixed, want_inj = hyper.hc_read_raw(R, norm_w, down, quants.Q8_0, up, quants.Q8_0, inj, quants.Q8_0, 1e-6)
    assert_close("graph mixed", want_mixed, mixed)
    assert_close("graph inj", want_inj, inj_out)
    assert_close("graph logits", ref.gemv(head, quants.BF16, D, mixed.get()), logits)
    np.testing.assert_array_equal(ids.get(), sampling.argmax_rows(logits.get()))
    graph.destroy()


@pytest.mark.parametrize("ggml_type", TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("n_out,T", [(3, 1), (33, 5), (320, 16)])
def test_zsplit_gemv_finishes_in_the_launch_again_and_again(ggml_type, n_out, T):
    """Split-K across blocks: the last block of each tile adds the slices and resets its counter, so back-to-back
    launches (with an epilogue that reads y) all come out right."""
    from strata_cli.gpu import launch_gemv
    from strata_cli.gpu import launch_util as U

    n_in = 8192
    assert U.gemv_split(n_out, n_in, max_z=U.GEMV_MAX_ZSPLIT)[1] > 1  # the path under test
    rng = np.random.default_rng(n_out + T + ggml_type)
    w = raw_weight(rng, (n_out, n_in), ggml_type, 0.05)
    w_dev = to_dev(w)
    split = launch_gemv.SplitK.empty()  # one workspace for every launch: the counters must come back to zero
    for i in range(3):
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        mul = rng.standard_normal((T, n_out)).astype(np.float32)
        y = to_dev(mul)  # mul aliases y, as the shared expert's silu(gate) * up does
        launch_gemv.launch_gemv(w_dev, ggml_type, n_in, to_dev(x), y, split, act=U.ACT_SILU, mul=y,
                                mul_strides=(n_out, 1))
        want = ref.gemv(w, ggml_type, n_in, x)
        want = want / (1.0 + np.exp(-want)) * mul
        assert_close(f"z-split launch {i}", want.astype(np.float32), y, floor=1.0)
