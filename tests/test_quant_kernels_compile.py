"""kernels/gemv_quant.cu compiles with NVRTC for sm_90 for every block type, on CPU; its generated tables are
gguf.quants' (skipped without cuda-bindings / NVRTC, like tests/test_kernels_compile.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq

from strata_cli.gpu import launch_quant as L
from strata_cli.gpu import quant_source as S
from strata_cli.gpu.compile import compile_check
from strata_cli.model import quant_tables
from strata_cli.model import quants as Q


@pytest.fixture(scope="module")
def nvrtc_available():
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    try:
        ret = nvrtc.nvrtcVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC library not found: {type(exc).__name__}: {exc}".splitlines()[0])
    if int(ret[0]) != 0:
        pytest.skip(f"NVRTC unusable: {ret[0]}")


# One variant per decoder family (~20 s each on CPU): every variant compiles every decoder but the grid and value-
# table ones its type lacks, so these four compile all decoders; tests/test_quant_decode_host.py runs them all, and
# bench/warm_kernels.py compiles all 22 variants on a device (all 22 were compile-checked here once, ~17 min).
FAMILIES = (Q.Q4_K, Q.IQ2_XS, Q.IQ3_S, Q.NVFP4)


@pytest.mark.parametrize("ggml_type", FAMILIES, ids=[S.variant(t) for t in FAMILIES])
def test_gemv_quant_compiles_for_sm90(nvrtc_available, ggml_type):
    compile_check(f"gemv_quant.{S.variant(ggml_type)}")


# The benchmark file's expert types (Q2_K gate/up, Q4_0 down), whose tensor-core kernels have their own decoders
# (quant_decode.cuh qtc_frag, qtc_min_frag, qtc_step_d), and Q2_K's decode-free probe (bench/quant_gemv_bench.py
# --probe: launch_quant.PROBE_DEFINES)
@pytest.mark.parametrize("ggml_type", (Q.Q2_K, Q.Q4_0), ids=[S.variant(t) for t in (Q.Q2_K, Q.Q4_0)])
def test_gemv_quant_expert_types_compile(nvrtc_available, ggml_type):
    compile_check(f"gemv_quant.{S.variant(ggml_type)}")


def test_gemv_quant_probe_compiles(nvrtc_available):
    compile_check("gemv_quant.q2_k", defines=L.PROBE_DEFINES)


def test_ksigns_formula_is_ggufs_table():
    """quant_decode.cuh computes ksigns[i] = i | parity(i) << 7 instead of carrying gguf's 128-byte table."""
    table = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8)
    formula = [i | ((bin(i).count("1") & 1) << 7) for i in range(128)]
    assert table.tolist() == formula


@pytest.mark.parametrize("ggml_type", S.GRID_TYPES, ids=[S.variant(t) for t in S.GRID_TYPES])
def test_emitted_grid_is_ggufs(ggml_type):
    head = S.prefix(S.variant(ggml_type))
    body = head[head.index("QGRID[") :]
    entries = [int(v.strip().rstrip("ul"), 16) for v in body[body.index("{") + 1 : body.index("}")].split(",")]
    grid = quant_tables.grid_values(ggml_type)
    assert len(entries) == grid.shape[0]
    width = grid.shape[1]
    unpacked = np.array([[(e >> (8 * k)) & 0xFF for k in range(width)] for e in entries])
    np.testing.assert_array_equal(unpacked.astype(np.uint8).view(np.int8) if ggml_type in (Q.IQ1_S, Q.IQ1_M)
                                  else unpacked, grid)
    assert f"#define QTYPE {ggml_type}\n" in head


def test_unknown_variant_is_one_clear_error():
    with pytest.raises(ValueError, match="no variant 'q8_0'"):
        S.prefix("q8_0")


def test_block_alignment_check():
    """The GEMVs decode blocks in place: a weight (or expert stride) off the block's natural alignment is one clear
    error, any block-aligned view runs."""
    from strata_cli.gpu import launch_quant as L

    buf = np.zeros(4096, np.uint8)
    base = -buf.ctypes.data % 16
    aligned, odd = buf[base:base + 2048], buf[base + 2:base + 2050]
    L.check_block_align("w", Q.Q4_K, aligned)
    L.check_block_align("w", Q.Q4_K, aligned, expert_stride=144 * 3)
    L.check_block_align("w", Q.Q3_K, odd)  # 110-byte blocks: 2-aligned
    with pytest.raises(ValueError, match="w: Q4_K weights must start 16-byte aligned"):
        L.check_block_align("w", Q.Q4_K, odd)
    with pytest.raises(ValueError, match="gate_raw: Q4_K weights must start 16-byte aligned"):
        L.check_block_align("gate_raw", Q.Q4_K, aligned, expert_stride=8)
    assert [L.block_align(t) for t in (Q.Q4_0, Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.MXFP4)] == [2, 4, 8, 16, 1]
