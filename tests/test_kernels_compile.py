"""Every kernels/*.cu compiles with NVRTC for sm_90, on CPU (skipped when cuda-bindings or NVRTC is missing)."""

from __future__ import annotations

import pytest

from strata_cli.gpu.compile import compile_check, kernels_dir

# gemv_quant.cu is compiled per block type (tests/test_quant_kernels_compile.py compiles every variant)
KERNELS = sorted(p.stem for p in kernels_dir().glob("*.cu") if p.stem != "gemv_quant")


@pytest.fixture(scope="module")
def nvrtc_available():
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    try:
        ret = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load libnvrtc lazily: a missing library raises here
        pytest.skip(f"NVRTC library not found: {type(exc).__name__}: {exc}".splitlines()[0])
    if int(ret[0]) != 0:
        pytest.skip(f"NVRTC unusable: {ret[0]}")


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_for_sm90(nvrtc_available, name):
    compile_check(name)
