"""bench/quant_gemv_bench.py's own device work on the real shapes (skipped without a GPU): its timing launches run in
memory that held garbage (reused pool blocks, as after an earlier type or path in the same process), for both
expert paths and a tune variant, without a fault, and its reference check passes for each.

Why: the bench made its routings on the legacy default stream and timed on a non-blocking stream, which does not
wait for the default stream: the eager warm-up read moe_group's outputs before they were written. Fresh device
memory is zero (empty groups: no fault), so the first path of a process ran; the second, in reused memory, read
garbage entry rows and died with cudaErrorIllegalAddress for every type.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def qbench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("quant_gemv_bench", None)
    import quant_gemv_bench

    return quant_gemv_bench


def _garbage(stream, nbytes):
    """Fill nbytes of the memory pool (the default stream's blocks and `stream`'s) with 0xFF and hand them back
    unfreed, so the next allocations reuse them as they are."""
    import cupy as cp

    for s in (cp.cuda.Stream.null, stream):
        with s:
            junk = cp.full(nbytes, 0xFF, cp.uint8)
        s.synchronize()
        del junk


@pytest.mark.parametrize("type_name", ["Q2_K", "Q8_0"])
def test_bench_times_real_shapes_in_reused_memory(qbench, type_name):
    import cupy as cp

    from strata_cli.gpu import launch_quant
    from strata_cli.gpu import launch_util as U
    from strata_cli.gpu.graphs import new_stream
    from strata_cli.model import quants as Q

    t = Q.TYPE_IDS[type_name]
    stream = new_stream()
    rng = np.random.default_rng(3)
    variant = launch_quant.QtcTune(warps=8, mt=2, target_warps=8192)
    assert variant in launch_quant.TUNE_GRID
    runs = [("tc", launch_quant.TUNE), ("cuda", launch_quant.TUNE), ("tc", variant)]
    if not qbench.uses_quant_kernels(t):
        runs = runs[:1]  # (Q8_0: gemv_q8r.cu, the same kernels on every path)
    check = qbench.make_check(t, (1, 8), rng, stream)
    for path, tune in runs:
        _garbage(stream, 3 * 10**9)
        experts = qbench.Experts(t, (1, 8), 2, stream, rng)
        default, launch_quant.TUNE = launch_quant.TUNE, tune
        try:
            with U.recording_path(qbench.PATHS[path]):
                err = qbench.check_rel_err(check, stream)
                assert err < 2e-3, f"{type_name} {path} {tune.label()}: rel_err {err:.1e}"
                for T in (1, 8):
                    r = experts.times(T, stream)
                    assert all(ms > 0 for ms in r["ms"].values()) and r["bytes"]["moe"] > 0
        finally:
            launch_quant.TUNE = default
        cp.cuda.Device().synchronize()  # a fault of the timed launches is raised here at the latest
        experts.free()
