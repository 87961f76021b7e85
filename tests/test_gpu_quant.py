"""kernels/gemv_quant.cu (launch_quant, reached through launch_gemv, launch_moe and launch_embed) against the numpy
references over gguf.quants' dequantization, for every block type on odd shapes, T = 1..16, dense and expert-strided;
graph replay equal to eager; and the tiny-c fixture's llama-quantize files on the GPU engine against the numpy
engine (skipped without a GPU, the fixture tests also without the fixture).

Weights are valid random blocks with realistic scales (synth/blocks.py); every output is NaN-poisoned first.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import assert_close, assert_replay_equals_eager, poisoned, to_dev

from strata_cli.gpu import launch_util as U
from strata_cli.gpu.quant_source import TYPES
from strata_cli.model import quants as Q
from strata_cli.ops import gemv as ref
from strata_cli.ops import moe
from strata_cli.synth.blocks import random_tensor

pytestmark = pytest.mark.gpu

IDS = [Q.TYPE_NAMES[t] for t in TYPES]
def _widths(ggml_type):
    """Odd input widths: one block, a step and a half, several steps (QK 32, 64 or 256)."""
    qk = Q.BLOCK[ggml_type][0]
    return sorted({qk, 3 * qk, 640 if 640 % qk == 0 else 5 * qk, 1280 if qk < 256 else 2304})


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("n_out", (1, 5, 67))
def test_gemv_every_type_matches_reference(ggml_type, n_out):
    from strata_cli.gpu import launch_gemv

    rng = np.random.default_rng(100 * ggml_type + n_out)
    for n_in in _widths(ggml_type):
        w = random_tensor(rng, ggml_type, (n_out, n_in), 0.05)
        w_dev = to_dev(w)
        for T in range(1, 17):
            x = rng.standard_normal((T, n_in)).astype(np.float32)
            got = launch_gemv.gemv(w_dev, ggml_type, n_in, to_dev(x), out=poisoned((T, n_out)))
            assert_close(f"gemv {Q.TYPE_NAMES[ggml_type]} n_in={n_in} T={T}", ref.gemv(w, ggml_type, n_in, x), got,
                         floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_gemv_epilogue_and_zsplit(ggml_type):
    """A 3-row matrix with a long input axis splits over grid z; silu(W.x / 2) * mul runs in the epilogue."""
    from strata_cli.gpu import launch_gemv
    from strata_cli.gpu import launch_util as U
    from strata_cli.gpu.launch_quant import quant_split

    rng = np.random.default_rng(ggml_type)
    n_out, n_in, T = 3, 10240, 5
    assert quant_split(n_out, n_in, T, max_z=U.GEMV_MAX_ZSPLIT)[1] > 1
    w = random_tensor(rng, ggml_type, (n_out, n_in), 0.02)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    mul = rng.standard_normal((T, n_out)).astype(np.float32)
    y = poisoned((T, n_out))
    launch_gemv.launch_gemv(to_dev(w), ggml_type, n_in, to_dev(x), y, None, act=U.ACT_SILU, div=2.0,
                            mul=to_dev(mul), mul_strides=(n_out, 1))
    z = ref.gemv(w, ggml_type, n_in, x) / 2.0
    assert_close(f"zsplit {Q.TYPE_NAMES[ggml_type]}", z / (1.0 + np.exp(-z)) * mul, y, floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("K", (1, 4))
def test_routed_experts_every_type(ggml_type, K):
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(10 * ggml_type + K)
    E, F, D = 7, 512, 256  # F and D hold whole blocks of every type; experts sit expert_stride bytes apart
    types = (ggml_type,) * 3
    gate = random_tensor(rng, ggml_type, (E, F, D), 0.06)
    up = random_tensor(rng, ggml_type, (E, F, D), 0.06)
    down = random_tensor(rng, ggml_type, (E, D, F), 0.04)
    dev = [to_dev(a) for a in (gate, up, down)]
    for T in (1, 2, 3, 5, 8, 11, 16):
        x = rng.standard_normal((T, D)).astype(np.float32)
        ids, w = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)
        want = moe.routed_experts_raw(x, ids, w, gate, up, down, types)
        got = launch_moe.routed_experts(to_dev(x), to_dev(ids), to_dev(w), *dev, types, out=poisoned((T, D)))
        assert_close(f"routed_experts {Q.TYPE_NAMES[ggml_type]} T={T} K={K}", want, got, floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_gateup_one_launch_odd_rows_and_bad_id(ggml_type):
    """launch_gateup_quant alone: silu(gate . x) * (up . x) per entry on an odd expert width (rows past the last
    warp's), odd windows and groups of 1 .. 16 entries; an expert id out of range writes NaN to its entry only."""
    import cupy as cp

    from strata_cli.gpu import launch_moe, launch_quant
    from strata_cli.gpu import launch_util as U

    rng = np.random.default_rng(13 * ggml_type)
    E, F, K = 6, 37, 3
    D = 3 * Q.BLOCK[ggml_type][0] if Q.BLOCK[ggml_type][0] < 256 else 512
    gate = random_tensor(rng, ggml_type, (E, F, D), 0.05)
    up = random_tensor(rng, ggml_type, (E, F, D), 0.05)
    gd, ud = to_dev(gate), to_dev(up)
    stride = gate.nbytes // E
    for T in (1, 2, 3, 5, 8, 11, 16):
        x = rng.standard_normal((T, D)).astype(np.float32)
        ids = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)[0]
        if T == 5:
            ids[2, 1] = E  # out of range: entry 2*K + 1 is NaN, the rest as the reference
        J = T * K
        groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
        launch_moe.group_entries(to_dev(ids), J, groups)
        h = poisoned((J, F))
        launch_quant.launch_gateup_quant(gd, ud, ggml_type, stride, E, groups, J, T, to_dev(x), K, D, h)
        got = h.get()
        rows = np.repeat(np.arange(T), K)
        e = ids.reshape(-1)
        ok = e < E
        g = np.stack([ref.gemv(gate[i], ggml_type, D, x[t:t + 1])[0] for t, i in zip(rows[ok], e[ok])])
        u = np.stack([ref.gemv(up[i], ggml_type, D, x[t:t + 1])[0] for t, i in zip(rows[ok], e[ok])])
        assert np.isnan(got[~ok]).all()
        assert_close(f"gateup {Q.TYPE_NAMES[ggml_type]} T={T}", g / (1.0 + np.exp(-g)) * u, got[ok], floor=0.05)


def test_routed_experts_gate_up_of_two_types_run_apart():
    """Gate and up of different block types take two launches (the fused one needs one type); same result."""
    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(21)
    E, F, D, T, K = 5, 256, 512, 6, 2
    types = (Q.Q4_K, Q.Q6_K, Q.Q4_0)
    gate, up = (random_tensor(rng, t, (E, F, D), 0.05) for t in types[:2])
    down = random_tensor(rng, types[2], (E, D, F), 0.05)
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids, w = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)
    got = launch_moe.routed_experts(to_dev(x), to_dev(ids), to_dev(w), to_dev(gate), to_dev(up), to_dev(down), types,
                                    out=poisoned((T, D)))
    assert_close("routed_experts Q4_K/Q6_K/Q4_0", moe.routed_experts_raw(x, ids, w, gate, up, down, types), got,
                 floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_gemv_long_rows_and_row_views(ggml_type, monkeypatch):
    """Split-K off (every warp streams whole rows: it runs several stages, the next one in flight, and a partial
    last one) on weights that start inside a larger matrix (a row view: the base is only block-aligned, so the
    staged ranges start at every offset mod 16); 1 .. 16-row windows over a long odd input axis."""
    from strata_cli.gpu import launch_gemv, launch_quant

    monkeypatch.setattr(launch_quant, "QUANT_TARGET_WARPS", 1)
    assert launch_quant.quant_split(37, 4864) == (1, 1)
    rng = np.random.default_rng(7 * ggml_type + 1)
    qk = Q.BLOCK[ggml_type][0]
    n_out, n_in = 37, 19 * 256 + (qk if qk < 256 else 0)
    w = random_tensor(rng, ggml_type, (n_out + 3, n_in), 0.03)
    w_all = to_dev(w)
    for first in (0, 1, 3):
        w_dev = w_all[first:first + n_out]
        for T in (1, 2, 7, 16):
            x = rng.standard_normal((T, n_in)).astype(np.float32)
            got = launch_gemv.gemv(w_dev, ggml_type, n_in, to_dev(x), out=poisoned((T, n_out)))
            assert_close(f"long rows {Q.TYPE_NAMES[ggml_type]} first={first} T={T}",
                         ref.gemv(w[first:first + n_out], ggml_type, n_in, x), got, floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_routed_experts_long_rows(ggml_type, monkeypatch):
    """Grouped expert GEMVs with split-K off over a long input axis (19 steps of 256 per warp for gate / up: the
    tensor-core kernels' stage ring wraps several times)."""
    from strata_cli.gpu import launch_moe, launch_quant

    monkeypatch.setattr(launch_quant, "QUANT_TARGET_WARPS", 1)
    monkeypatch.setattr(launch_quant, "QTC_TARGET_WARPS", 1)
    assert launch_quant.qtc_split(1, 19 * 256) == 1
    rng = np.random.default_rng(11 * ggml_type + 3)
    E, F, D, K = 5, 256, 19 * 256, 2
    types = (ggml_type,) * 3
    gate = random_tensor(rng, ggml_type, (E, F, D), 0.02)
    up = random_tensor(rng, ggml_type, (E, F, D), 0.02)
    down = random_tensor(rng, ggml_type, (E, D, F), 0.05)
    dev = [to_dev(a) for a in (gate, up, down)]
    for T in (1, 3, 8, 16):
        x = rng.standard_normal((T, D)).astype(np.float32)
        ids, w = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)
        want = moe.routed_experts_raw(x, ids, w, gate, up, down, types)
        got = launch_moe.routed_experts(to_dev(x), to_dev(ids), to_dev(w), *dev, types, out=poisoned((T, D)))
        assert_close(f"routed_experts long rows {Q.TYPE_NAMES[ggml_type]} T={T}", want, got, floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_tensor_core_experts_odd_shapes(ggml_type):
    """The qtc_* kernels alone against numpy: an odd expert width (37 rows: a warp's last m tile part empty), an input
    axis of whole and partial 256-element steps split over 1-4 warps, windows of 1 .. 16 entries per group (16: two
    MMA column tiles), x rows with |x| >= 2^15 (the span split from x 2^-16), an epilogue with silu and mul, and
    an out-of-range expert id (NaN in its entry's rows only); every output NaN-poisoned first."""
    import cupy as cp

    from strata_cli.gpu import launch_moe, launch_quant

    rng = np.random.default_rng(31 * ggml_type + 5)
    qk = Q.BLOCK[ggml_type][0]
    E, F, K = 5, 37, 2
    for D in sorted({640 if qk < 256 else 1280, 3 * qk}):
        gate = random_tensor(rng, ggml_type, (E, F, D), 0.05)
        up = random_tensor(rng, ggml_type, (E, F, D), 0.05)
        gd, ud = to_dev(gate), to_dev(up)
        stride = gate.nbytes // E
        for T in (1, 2, 5, 8, 9, 16):
            x = rng.standard_normal((T, D)).astype(np.float32)
            x[T // 2] *= 1e5  # |x| >= 2^15 in some spans
            ids = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)[0]
            if T > 8:
                ids[:, 0] = 0  # one group of more than 8 entries: the second MMA column tile
            ids[-1, 0] = -1  # out of range: entry (T - 1) * K is NaN
            J = T * K
            groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
            launch_moe.group_entries(to_dev(ids), J, groups)
            rows, e = np.repeat(np.arange(T), K), ids.reshape(-1)
            ok = (e >= 0) & (e < E)
            g = np.zeros((J, F), np.float32)
            u = np.zeros((J, F), np.float32)
            g[ok] = np.stack([ref.gemv(gate[i], ggml_type, D, x[t:t + 1])[0] for t, i in zip(rows[ok], e[ok])])
            u[ok] = np.stack([ref.gemv(up[i], ggml_type, D, x[t:t + 1])[0] for t, i in zip(rows[ok], e[ok])])
            mul = rng.standard_normal((J, F)).astype(np.float32)
            h = poisoned((J, F))
            launch_quant.launch_gateup_quant(gd, ud, ggml_type, stride, E, groups, J, T, to_dev(x), K, D, h)
            y = poisoned((J, F))
            launch_quant.launch_expert_gemv_quant(gd, ggml_type, stride, E, groups, J, T, to_dev(x), K, D, y,
                                                  act=U.ACT_SILU, mul=to_dev(mul), mul_strides=(F, 1))
            name = f"{Q.TYPE_NAMES[ggml_type]} D={D} T={T}"
            with np.errstate(over="ignore"):
                silu = g / (1.0 + np.exp(-g))
            for what, got, want in (("gateup", h, silu * u), ("expert silu*mul", y, silu * mul)):
                got = got.get()
                assert np.isnan(got[~ok]).all(), f"{what} {name}: a bad id's entry is not NaN"
                for big in (True, False):  # the scaled row apart: its size would hide the others' errors
                    sel = ok & ((rows == T // 2) == big)
                    if sel.any():
                        assert_close(f"{what} {name} big={big}", want[sel], got[sel], floor=0.05)


# (gate, up, down) of the benchmark file's experts (Q2_K gate/up, Q4_0 down) and of a Q4_0 one
REAL_TYPES = {"q2_k-q4_0": (Q.Q2_K, Q.Q2_K, Q.Q4_0), "q4_0": (Q.Q4_0,) * 3}


@pytest.mark.parametrize("types", list(REAL_TYPES.values()), ids=list(REAL_TYPES))
def test_routed_experts_real_shapes(types):
    """Flash-Next's expert shapes as bench/quant_gemv_bench.py times them (E = 512 experts of gate / up [640 x 2560]
    and down [2560 x 640], top-10, T = 1, 2, 8: J = 80 entries, groups of up to 8, the down launch over J rows of h):
    12 experts spread over 0 .. 511 hold valid random blocks, the rest random bytes that are never read; against
    numpy on those 12. NaN-poisoned output."""
    import cupy as cp

    from strata_cli.gpu import launch_moe

    rng = np.random.default_rng(sum(types))
    E, F, D, K = 512, 640, 2560, 10
    used = np.array([0, 1, 77, 128, 255, 256, 300, 383, 400, 509, 510, 511])
    host = [random_tensor(rng, t, shape, 0.05) for t, shape in zip(types, ((len(used), F, D), (len(used), F, D),
                                                                            (len(used), D, F)))]
    dev = []
    for h in host:
        d = cp.random.randint(0, 256, size=(E, *h.shape[1:]), dtype=cp.uint8)
        d[cp.asarray(used)] = cp.asarray(h)
        dev.append(d)
    for T in (1, 2, 8):
        x = rng.standard_normal((T, D)).astype(np.float32)
        local = np.stack([rng.choice(len(used), K, replace=False) for _ in range(T)]).astype(np.int32)
        w = rng.random((T, K)).astype(np.float32)
        w /= w.sum(1, keepdims=True)
        want = moe.routed_experts_raw(x, local, w, *host, types)
        got = launch_moe.routed_experts(to_dev(x), to_dev(used[local].astype(np.int32)), to_dev(w), *dev, types,
                                        out=poisoned((T, D)))
        assert_close(f"routed_experts real shapes {[Q.TYPE_NAMES[t] for t in types]} T={T}", want, got, floor=0.05)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_gather_rows_bit_exact(ggml_type):
    from strata_cli.gpu import launch_embed

    rng = np.random.default_rng(ggml_type)
    row_len = 2 * Q.BLOCK[ggml_type][0] + (Q.BLOCK[ggml_type][0] if Q.BLOCK[ggml_type][0] < 256 else 0)
    table = random_tensor(rng, ggml_type, (50, row_len), 1.0)
    rows = rng.integers(0, 50, (7, 3)).astype(np.int64)
    want = Q.dequantize(table[rows.reshape(-1)], ggml_type).reshape(7, -1)
    got = launch_embed.gather_rows(to_dev(rows), to_dev(table), ggml_type, row_len, out=poisoned((7, 3 * row_len)))
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.parametrize("ggml_type", (Q.Q4_K, Q.IQ2_XS, Q.Q5_0, Q.IQ1_M, Q.NVFP4), ids=lambda t: Q.TYPE_NAMES[t])
def test_graph_replay_is_bit_identical_to_eager(ggml_type):
    """A z-split dense GEMV and the grouped expert GEMVs captured in one graph replay to the eager bits."""
    import cupy as cp

    from strata_cli.gpu import launch_gemv, launch_moe

    rng = np.random.default_rng(9 + ggml_type)
    T, K, E, F, D = 5, 3, 6, 512, 10240
    w_dense = to_dev(random_tensor(rng, ggml_type, (32, D), 0.02))
    experts = [to_dev(random_tensor(rng, ggml_type, s, 0.03)) for s in ((E, F, D), (E, F, D), (E, D, F))]
    x = to_dev(rng.standard_normal((T, D)).astype(np.float32))
    ids, w = (to_dev(a) for a in moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K))
    y, out = cp.empty((T, 32), cp.float32), cp.empty((T, D), cp.float32)
    scratch = launch_moe.MoeScratch.empty(T * K, F, D)
    split = launch_gemv.SplitK.empty()
    types = (ggml_type,) * 3

    def record(stream):
        launch_gemv.gemv(w_dense, ggml_type, D, x, out=y, split=split, stream=stream)
        launch_moe.routed_experts(x, ids, w, *experts, types, out=out, scratch=scratch, stream=stream)

    assert_replay_equals_eager(record, (y, out))


@pytest.mark.parametrize("kind", ["q4_k_m", "q3_k_m", "iq3_s", "iq2_xs"])
def test_fixture_quantized_files_gpu_vs_numpy(fixture_c_dir, kind):
    """llama-quantize's files: the GPU engine (graphs, random windows, partial commits) against the numpy engine."""
    from spec_windows import speculative_run

    from strata_cli.engine.gpu import GPUEngine
    from strata_cli.engine.reference import ReferenceEngine
    from strata_cli.model.gguf_file import open_model
    from strata_cli.ops.basic import log_softmax64

    model = open_model(fixture_c_dir / f"model-{kind}.gguf")
    tokens = np.load(fixture_c_dir / "reference.npz")["tokens"]
    want = ReferenceEngine(model).run(tokens, 0)
    got, got_ids = speculative_run(GPUEngine(model), tokens, np.random.default_rng(5), 16)
    rows = np.arange(len(tokens) - 1)
    delta = np.abs(log_softmax64(got)[rows, tokens[1:]] - log_softmax64(want.logits)[rows, tokens[1:]])
    assert delta.max() <= 2e-3, f"{kind}: max |dlogprob(target)| {delta.max():.2e} at {delta.argmax()}"
    rel = float(np.abs(got - want.logits).max() / np.abs(want.logits).max())
    assert rel <= 2e-3, f"{kind}: max relative logit error {rel:.2e}"
    np.testing.assert_array_equal(got_ids, want.ids)
