"""Every kernels/*.cu compiles with NVRTC for sm_90, on CPU (skipped when cuda-bindings or NVRTC is missing)."""

from __future__ import annotations

import pytest

from strata_cli.gpu import compile as C
from strata_cli.gpu.compile import compile_check

# gemv_quant.cu is compiled per block type (tests/test_quant_kernels_compile.py compiles every variant); gemv.cu per
# weight type, here
KERNELS = [name for name in C.module_names() if not name.startswith("gemv_quant.")]


def test_gemv_variants_are_the_launchers_types():
    from strata_cli.gpu.launch_util import TYPE_SUFFIX

    assert sorted(TYPE_SUFFIX.values()) == sorted(C.GEMV_VARIANTS)
    assert sorted(p.stem for p in C.kernels_dir().glob("*.cu")) == sorted({n.split(".")[0] for n in C.module_names()})


def test_gemv_without_a_type_is_one_clear_error():
    with pytest.raises(ValueError, match="compiled per type"):
        C.source("gemv")
    with pytest.raises(ValueError, match="compiled per type"):
        C.source("gemv.q4_k")


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
