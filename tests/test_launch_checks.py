"""CPU side of the GPU launchers: argument checks, raw-weight geometry, grid math, kernel-name and constant sync,
and the raw-weight numpy references. Needs no GPU: numpy arrays pass the same checks as CuPy arrays."""

from __future__ import annotations

import re

import numpy as np
import pytest

from strata_cli import settings
from strata_cli.errors import InputError

from strata_cli.gpu import launch_util as U
from strata_cli.gpu.compile import kernels_dir
from strata_cli.model import quants
from strata_cli.ops import basic
from strata_cli.ops import gemv as ref

F32, F16, BF16, Q8_0 = quants.F32, quants.F16, quants.BF16, quants.Q8_0
TYPES = (F32, F16, BF16, Q8_0)


def _raw(shape, t, seed=0):
    return quants.quantize(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), t)


@pytest.mark.parametrize("t", TYPES)
def test_weight_rows_infers_output_rows(t):
    w = _raw((5, 64), t)
    assert U.weight_rows("w", w, t, 64) == 5
    assert U.weight_rows("w", w, t, 64, n_out=5) == 5
    with pytest.raises(ValueError, match=r"^w: 5 rows of width 64, expected 4"):
        U.weight_rows("w", w, t, 64, n_out=4)
    with pytest.raises(ValueError, match=r"^w: .* not a whole number"):
        U.weight_rows("w", w, t, 96)


def test_weight_rows_rejects_bad_raw_arrays():
    q = _raw((4, 64), Q8_0)
    with pytest.raises(ValueError, match=r"^down_raw: input width 48 is not a positive multiple"):
        U.weight_rows("down_raw", q, Q8_0, 48)
    with pytest.raises(ValueError, match=r"^w_raw: dtype float32 cannot hold Q8_0"):
        U.weight_rows("w_raw", q.astype(np.float32), Q8_0, 64)
    with pytest.raises(ValueError, match=r"^w_raw: not C-contiguous"):
        U.weight_rows("w_raw", _raw((64, 4), F32).T, F32, 64)
    with pytest.raises(ValueError, match=r"^w_raw: data not 2-byte aligned"):
        U.weight_rows("w_raw", np.zeros(2 * 64 + 1, np.uint8)[1:], BF16, 64)
    with pytest.raises(ValueError, match=r"^w_raw type: GGML type 9 has no GPU kernel"):
        U.weight_rows("w_raw", q, 9, 64)  # Q8_1: ggml's activation type, never a weight
    with pytest.raises(ValueError, match=r"^w_raw: input width 64 is not a positive multiple of the Q4_K block"):
        U.weight_rows("w_raw", q, 12, 64)
    assert U.weight_rows("w_raw", _raw((3, 8), F16).view(np.uint8), F16, 8) == 3  # F16 as byte rows


@pytest.mark.parametrize("t", TYPES)
def test_expert_geometry(t):
    w = _raw((7, 5, 64), t)
    E, rows, stride = U.expert_geometry("gate_raw", w, t, 64)
    assert (E, rows) == (7, 5) and stride * E == w.nbytes and stride == 5 * quants.row_bytes(t, 64)
    with pytest.raises(ValueError, match=r"^gate_raw: 7 experts, expected 8"):
        U.expert_geometry("gate_raw", w, t, 64, n_expert=8)
    with pytest.raises(ValueError, match=r"^gate_raw: shape .* expected \[E, rows, row\]"):
        U.expert_geometry("gate_raw", w.reshape(35, -1), t, 64)


def test_check_array_names_the_argument():
    x = np.zeros((3, 4), np.float32)
    assert U.check_array("x", x, np.float32, (None, 4)) is x
    with pytest.raises(ValueError, match=r"^x: dtype float64, expected float32"):
        U.check_array("x", x.astype(np.float64), np.float32, (None, 4))
    with pytest.raises(ValueError, match=r"^x: shape \(3, 4\), expected \(\*, 5\)"):
        U.check_array("x", x, np.float32, (None, 5))
    with pytest.raises(ValueError, match=r"^x: not C-contiguous"):
        U.check_array("x", np.zeros((4, 3), np.float32).T, np.float32, (None, 4))
    with pytest.raises(ValueError, match=r"^x: empty shape"):
        U.check_array("x", np.zeros((0, 4), np.float32), np.float32, (None, 4))
    with pytest.raises(ValueError, match=r"^ids: expected an array"):
        U.check_array("ids", [1, 2], np.int32, (None,))


def test_out_and_scratch_buffers():
    out = np.zeros((2, 3), np.float32)
    assert U.out_array("out", out, (2, 3), np.float32, np.empty) is out
    assert U.out_array("out", None, (2, 3), np.float32, np.empty).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^out: shape"):
        U.out_array("out", out, (3, 3), np.float32, np.empty)
    big = np.zeros((16, 5), np.float32)
    view = U.scratch_rows("scratch.low", big, 7, (5,), np.empty)
    assert view.shape == (7, 5) and view.flags.c_contiguous and np.shares_memory(view, big)
    with pytest.raises(ValueError, match=r"^scratch.low: 16 rows, the window needs 17"):
        U.scratch_rows("scratch.low", big, 17, (5,), np.empty)


def test_grid_math():
    # 8 warps x 4 rows per block without split-K; 4 rows per block with 8-way split-K; z slices on grid z
    assert U.gemv_grid(257, 16) == ((9, 1, 1), (256, 1, 1))
    assert U.gemv_grid(257, 16, ksplit=8, zsplit=4) == ((65, 1, 4), (256, 1, 1))
    assert U.gemv_grid(1, 17) == ((1, 2, 1), (256, 1, 1))
    assert U.expert_grid(64, 40) == ((2, 40, 1), (256, 1, 1))
    # a tall head is not split; a short matrix with a long input axis is split across warps and blocks
    assert U.gemv_split(248320, 2560) == (1, 1)
    assert U.gemv_split(320, 10240, max_z=8) == (8, 8)
    assert U.gemv_split(4, 64, max_z=8) == (1, 1)
    assert [U.nt_bucket(t) for t in (1, 2, 3, 5, 8, 9, 16, 40)] == [1, 2, 4, 8, 8, 16, 16, 16]
    with pytest.raises(ValueError, match=r"^ids:"):
        U.expert_grid(64, 70000)
    assert U.elementwise_grid(1) == ((1, 1, 1), (256, 1, 1))
    assert U.elementwise_grid(257) == ((2, 1, 1), (256, 1, 1))
    assert U.elementwise_grid(10**9)[0][0] == U.ELEMWISE_MAX_BLOCKS


def test_window_paths_are_chosen_by_window_size():
    """launch_util.WINDOW_PATHS: tensor-core Q8_0_R32 GEMVs from T = 4 (they lose at T <= 2 on the full-size
    file), no environment switch. The split sees the tensor-core warp's 64 rows."""
    paths = [U.window_path(t) for t in (1, 2, 3, 4, 8, 16, 40)]
    assert [p.gemv_tc for p in paths] == [False, False, False, True, True, True, True]
    assert [U.q8r_tensor_cores(t) for t in (1, 2, 4, 16)] == [False, False, True, True]
    assert [first for first, _ in U.WINDOW_PATHS] == sorted({first for first, _ in U.WINDOW_PATHS})
    assert U.WINDOW_PATHS[0][0] == 1
    with U.recording_path(U.window_path(8)):  # a window's token group of 2 rows keeps the window's choice
        assert U.q8r_tensor_cores(2) and not U.q8r_tensor_cores(1)
    assert not U.q8r_tensor_cores(2)
    assert U.q8r_split(248320, 2560, 8, rpw=64) == (2, 1)  # the head: 3880 warps of 64 rows, 40 blocks each
    assert U.q8r_split(320, 10240, 8, max_z=8, rpw=64) == (8, 8)


def test_tensor_core_expert_launch_geometry():
    """launch_quant's mirrors of kernels/gemv_quant.cu's QTC_* geometry (qtc_mt, qtc_nstage, qtc_smem_bytes by window
    bucket): the shared memory of a block (4 warps x 2-4 stages of 16 qtc_mt staged row units, and at T <= 2 each
    warp's x split of a step) stays within an H200 SM's 227 KB and fits 3+ blocks; 2 m tiles a warp at T <= 2, 4 from T = 4 for the <= 3.5-bit types; ksplit fills
    ~2048 warps on Flash-Next's expert shapes without leaving a warp without a step."""
    from strata_cli.gpu import launch_quant as L

    for t in L.TYPES:
        for T in (1, 2, 4, 8, 16):
            stage = 16 * 16 * L.qtc_mt(t, T) * ((U.row_stride(t, 256) + 30) // 16)
            ring = L.qtc_smem_bytes(t, T) - L.QTC_WARPS * L.qtc_xsplit_bytes(T)
            assert ring % stage == 0 and 2 <= ring // (L.QTC_WARPS * stage) <= 4
            assert 3 * L.qtc_smem_bytes(t, T) <= 227 * 1024
            assert (16 * L.qtc_mt(t, T) * ((U.row_stride(t, 256) + 30) // 16)) % 32 == 0  # NCH chunks every lane
    assert [L.qtc_mt(t, 8) for t in (quants.Q2_K, quants.IQ2_XS, quants.Q4_0, quants.Q6_K)] == [4, 4, 2, 2]
    assert [L.qtc_mt(quants.Q2_K, T) for T in (1, 2, 3, 4, 16)] == [2, 2, 4, 4, 4]
    assert L.qtc_smem_bytes(quants.Q2_K, 8) == 4 * 2 * 64 * 7 * 16  # 84-byte steps: 7 chunks, 64 rows, 2 stages
    xs1 = 4 * (1088 + 32)  # T = 1: each warp's x split of a step, one column
    assert [L.qtc_xsplit_bytes(T) for T in (1, 2, 3, 8, 16)] == [1088 + 32, 2 * 1088 + 32, 0, 0, 0]
    assert L.qtc_smem_bytes(quants.Q2_K, 1) == 4 * 3 * 32 * 7 * 16 + xs1  # 32 rows: 3 stages of 3.5 KB in 12 KB
    assert L.qtc_smem_bytes(quants.Q4_0, 1) == 4 * 2 * 32 * 10 * 16 + xs1  # 144-byte steps: 10 chunks, 32 rows
    assert L.qtc_split(40 * 10, 2560) == 4  # T = 1 gate/up Q2_K: 10 experts x 40 sets of 16 rows each, 10 steps
    assert L.qtc_split(80 * 10, 640) == 2  # T = 1 down Q4_0: 80 sets of 32 rows, 2.5 steps
    assert L.qtc_split(20 * 80, 2560) == 2  # T = 8 gate/up: 80 groups (1600 sets)
    assert L.qtc_split(80 * 80, 640) == 1  # T = 8 down
    assert L.qtc_split(1, 256) == 1
    assert L.qtc_grid(quants.Q2_K, True, 640, 10, 2560, 1) == ((40, 10, 1), 4, 4 * 3 * 32 * 7 * 16 + xs1)
    assert L.qtc_grid(quants.Q2_K, True, 640, 80, 2560, 8) == ((10, 80, 1), 2, 4 * 2 * 64 * 7 * 16)
    assert L.qtc_defines == () and L.PROBE_DEFINES == ("QTC_PROBE=1",)


def test_launchers_reject_bad_arguments_before_touching_the_device():
    from strata_cli.gpu import launch_gemv, launch_hyper, launch_moe, launch_sampling

    x = np.zeros((3, 64), np.float32)
    with pytest.raises(ValueError, match=r"^x: shape"):
        launch_gemv.gemv(_raw((4, 96), Q8_0), Q8_0, 96, x)
    with pytest.raises(ValueError, match=r"^k: 9 outside 1..8"):
        launch_moe.router_topk(np.zeros((2, 8), np.float32), 9)
    groups = (np.zeros(8, np.int32), np.zeros(8, np.int32), np.zeros((8, U.GEMV_MAXT), np.int32))
    done = np.zeros(1, np.uint32)
    with pytest.raises(ValueError, match=r"^router_raw: 2000 experts of type F32"):
        launch_moe.router_gemv_topk(x, np.zeros((2000, 64), np.float32), F32, 2, groups, done)
    with pytest.raises(ValueError, match=r"^router_raw: 8 experts of type BF16"):
        launch_moe.router_gemv_topk(x, _raw((8, 64), BF16), BF16, 2, groups, done)
    with pytest.raises(ValueError, match=r"^k: 9 outside 1..8"):
        launch_moe.router_gemv_topk(x, np.zeros((8, 64), np.float32), F32, 9, groups, done)
    with pytest.raises(ValueError, match=r"^scratch.g_expert: 8 rows, the window needs 9"):
        launch_moe.router_gemv_topk(x, np.zeros((8, 64), np.float32), F32, 3, groups, done)
    with pytest.raises(ValueError, match=r"^x: 17 rows exceed"):
        launch_moe.router_gemv_topk(np.zeros((17, 64), np.float32), np.zeros((8, 64), np.float32), F32, 2, groups,
                                    done)
    with pytest.raises(ValueError, match=r"^shared_id: given without scalar_gate"):
        launch_moe.router_gemv_topk(x, np.zeros((8, 64), np.float32), F32, 2, groups, done, shared_id=8)
    assert launch_moe.router_fuses(F32, 1024) and not launch_moe.router_fuses(F32, 1025)
    assert [launch_moe.router_fused_smem(T) for T in (1, 3, 8, 16)] == [4096, 3 * 4096, 8 * 4096, 8 * 4096]
    assert launch_moe.router_fused_smem(1) >= 4 * (256 + U.BLOCK)  # the grouping's J <= 256 ids and leader flags
    assert not launch_moe.router_fuses(Q8_0, 16)
    with pytest.raises(ValueError, match=r"^ggml_types: 2 types, expected 3"):
        launch_moe.routed_experts(x, None, None, None, None, None, (F32, F32))
    def hc(dn_rows=32, L=32, n_inj=0, up_type=BF16):
        return launch_hyper.HcWeights(np.ones(64, np.float32), _raw((dn_rows, 64), BF16), BF16, L, n_inj,
                                      _raw((64, L), up_type), up_type)

    R = np.zeros((1, 2, 32), np.float32)
    with pytest.raises(ValueError, match=r"^out_inj: given, but the read has no inject rows"):
        launch_hyper.hc_read(R, hc(), 1e-6, out_inj=np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"^dn_raw: 32 rows, expected at least L \+ n_inj = 34"):
        launch_hyper.hc_read(R, hc(n_inj=2), 1e-6)
    with pytest.raises(ValueError, match=r"^n_inj: 3, expected 0"):
        launch_hyper.hc_read(R, hc(dn_rows=64, n_inj=3), 1e-6)
    with pytest.raises(ValueError, match=r"^up_raw: type Q4_0 is not one of"):
        launch_hyper.hc_read(R, launch_hyper.HcWeights(np.ones(64, np.float32), _raw((32, 64), BF16), BF16, 32, 0,
                                                       np.zeros((64, 18), np.uint8), quants.Q4_0), 1e-6)
    bad = launch_hyper.CombineWrite(np.zeros((3, 32), np.float32), np.zeros((1, 4), np.float32), None,
                                    np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"^pending.parts: 3 rows, the combine needs 1 x 4"):
        launch_hyper.hc_read(R, hc(), 1e-6, pending=bad)
    with pytest.raises(ValueError, match=r"^pending.parts: 3 rows"):
        launch_hyper.hc_write(R, bad, out=R)
    with pytest.raises(ValueError, match=r"^pending: None"):
        launch_hyper.hc_write(R, None)
    with pytest.raises(ValueError, match=r"^R: 17 rows exceed"):
        launch_hyper.hc_read(np.zeros((17, 2, 32), np.float32), hc(), 1e-6)
    with pytest.raises(ValueError, match=r"^up_raw: low rank 40 is not whole Q8_0 blocks"):
        launch_hyper.hc_read(R, launch_hyper.HcWeights(np.ones(64, np.float32), _raw((64, 64), BF16), BF16, 40, 0,
                                                       np.zeros((64, 34), np.uint8), Q8_0), 1e-6)
    # hc_up_mix's shared memory: low [T, L] and the block's xn columns [T, C, 8] (16 x (752 + 2 x 8) = 12288 fit)
    assert launch_hyper.up_mix_smem_floats(16, 2, 752) == launch_hyper.UP_SMEM_FLOATS
    with pytest.raises(ValueError, match=r"^up_raw: 16 rows x \(low rank 768 \+ 2 streams x 8 columns\) exceed"):
        launch_hyper.hc_read(np.zeros((16, 2, 32), np.float32), hc(dn_rows=768, L=768), 1e-6)
    with pytest.raises(ValueError, match=r"^scratch.dn: 16 values, the read needs 1 x 32"):
        launch_hyper.hc_read(R, hc(), 1e-6, scratch=launch_hyper.HcScratch(np.zeros((1, 64), np.float32),
                                                                         np.zeros(16, np.float32)))
    with pytest.raises(ValueError, match=r"^split.tile_done: dtype int32"):
        split = launch_gemv.SplitK(np.zeros(U.GEMV_PARTIAL_FLOATS, np.float32),
                                   np.zeros(launch_gemv.ZSPLIT_TILES, np.int32))
        launch_gemv.launch_gemv(_raw((3, 8192), F32), F32, 8192, np.zeros((1, 8192), np.float32),
                                np.zeros((1, 3), np.float32), split)
    with pytest.raises(ValueError, match=r"^scratch.values: shape"):
        launch_sampling.argmax_rows(np.zeros((2, 9), np.float32), out=np.zeros(2, np.int32),
                                    scratch=launch_sampling.ArgmaxScratch(np.zeros(3, np.float32), np.zeros(3, np.int32),
                                                                          np.zeros(3, np.int32), np.zeros(3, np.int32)))


def _source(name):
    return (kernels_dir() / name).read_text()


def test_kernel_names_and_constants_match_the_sources():
    names = {"gemv.cu": [f"gemv_{s}_t{nt}" for s in U.TYPE_SUFFIX.values() for nt in (1, 2, 4, 8, 16)]
             + [f"gemv_expert_{s}_t{nt}" for s in U.TYPE_SUFFIX.values() for nt in (1, 2, 4, 8, 16)],
             "hyper.cu": ["hc_write_norm", "hc_up_mix", "hc_write"], "moe.cu": ["router_topk", "router_gemv_topk", "moe_combine", "moe_group"],
             "sampling.cu": ["argmax_partial", "argmax_rows", "sample_rows"], "embed.cu": ["gather_rows"]}
    names["hyper.cu"].append("broadcast_streams")
    for file, kernels in names.items():
        text = _source(file)
        for k in kernels:
            family = re.sub(r"_t(\d+)$", "", k).replace("gemv_", "", 1)
            nt = re.search(r"_t(\d+)$", k)
            in_family = nt and re.search(rf"GEMV_(DENSE|GROUPED)_FAMILY\({family.replace('expert_', '')},", text)
            assert re.search(rf"\b{k}\s*\(|\({k},", text) or in_family, f"{file} defines no kernel {k}"
    q8r = _source("gemv_q8r.cu")
    assert re.search(r"\bq8r_pack\s*\(", q8r)
    for nt in (1, 2, 4, 8, 16):  # gemv_q8r_t<NT>, gemv_expert_q8r_t<NT>, gemv_q8r_gateup_t<NT>: one macro each
        assert f"Q8R_DENSE_KERNEL({nt})" in q8r and f"Q8R_GROUPED_KERNEL({nt})" in q8r
        assert f"Q8R_GATEUP_KERNEL({nt})" in q8r
    for nt in U.Q8R_DENSE_GATEUP_NT:  # gemv_q8r_gateup_dense_t<NT>, the shared expert's gate/up (CUDA cores only)
        assert f"Q8R_DENSE_GATEUP_KERNEL({nt})" in q8r
    assert re.findall(r"^Q8R_DENSE_GATEUP_KERNEL\((\d+)\)", q8r, re.M) == [str(nt) for nt in U.Q8R_DENSE_GATEUP_NT]
    # the launchers' row groups per warp are the kernels' (q8r_rows, and half of it for the gate/up kernel)
    rows = re.search(r"constexpr int q8r_rows\(int nt\) \{ return (.*?); \}", q8r).group(1)
    assert rows == "nt == 1 ? 1 : (nt == 2 || nt == 16) ? 2 : 4"
    assert U.Q8R_LANE_ROWS == {1: 1, 2: 2, 4: 4, 8: 4, 16: 2}
    assert "constexpr int q8r_gateup_rows(int nt) { return q8r_rows(nt) > 1 ? q8r_rows(nt) / 2 : 1; }" in q8r
    assert U.Q8R_GATEUP_ROWS == {1: 1, 2: 1, 4: 2, 8: 2, 16: 1}
    for nt in (2, 4, 8, 16):  # the tensor-core kernels gemv_q8r_tc_t<NT> (T >= 2 only)
        assert f"Q8T_DENSE_KERNEL({nt})" in q8r
    q8r_defines = dict(re.findall(r"#define (\w+) (\d+)", q8r))
    assert int(q8r_defines["Q8T_ROWS"]) == U.Q8T_LANE_ROWS
    assert "#define GEMV_WARPS" not in q8r and "#define GEMV_MAXT" not in q8r  # one definition, in common.cuh
    assert int(q8r_defines["Q8R_GROUP"]) == U.Q8R_GROUP
    defines = dict(re.findall(r"#define (\w+) (\d+)", _source("common.cuh") + _source("gemv.cu") + _source("moe.cu")))
    assert int(defines["GEMV_WARPS"]) == U.GEMV_WARPS and int(defines["GEMV_MAXT"]) == U.GEMV_MAXT
    assert int(defines["GEMV_RPW"]) == U.GEMV_RPW
    assert int(defines["ROUTER_MAXK"]) == U.ROUTER_MAXK
    # router_gemv_topk's geometry (launch_moe's grid and shared memory mirror it)
    from strata_cli.gpu import launch_moe

    moe = _source("moe.cu")
    assert "#define ROUTER_THREADS (GEMV_WARPS * WARP)" in moe and U.GEMV_WARPS * 32 == U.BLOCK
    assert "#define ROUTER_EPB (GEMV_WARPS / ROUTER_KS)" in moe
    assert U.GEMV_WARPS // int(defines["ROUTER_KS"]) == launch_moe.ROUTER_EPB
    assert int(defines["ROUTER_EJ"]) * 32 == launch_moe.ROUTER_FUSED_MAX_E
    assert [int(defines[k]) for k in ("ACT_NONE", "ACT_SILU", "ACT_SIGMOID", "ACT_2SIGMOID")] == [0, 1, 2, 3]
    assert {int(defines[f"GGML_{n}"]) for n in ("F32", "F16", "Q8_0", "BF16")} == set(TYPES)


def _gguf_dequantized(raw, t, n_in):
    """gguf-py's own dequantizer (not strata's): raw rows as bytes -> float32 [rows, n_in]."""
    import gguf

    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, quants.row_bytes(t, n_in))
    return gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(t)).reshape(-1, n_in)


@pytest.mark.parametrize("t", TYPES)
def test_gemv_reference_dequantizes_raw_rows(t):
    """The raw-weight reference against gguf-py's dequantization and a float64 product done here."""
    w = _raw((5, 64), t, seed=1)
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    want = (x.astype(np.float64) @ _gguf_dequantized(w, t, 64).astype(np.float64).T).astype(np.float32)
    np.testing.assert_allclose(ref.gemv(w, t, 64, x), want, rtol=1e-6, atol=1e-6)
    if w.dtype != np.uint8:
        np.testing.assert_array_equal(ref.gemv(w.view(np.uint8), t, 64, x), ref.gemv(w, t, 64, x))
