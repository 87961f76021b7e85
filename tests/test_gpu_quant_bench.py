"""bench/quant_gemv_bench.py's own device work on the real shapes (skipped without a GPU): its timing launches run in
memory that held garbage (reused pool blocks, as after an earlier type or variant in the same process), for the
default kernels and each type's A/B variant, without a fault, and its reference check passes for each (but the
probe's, wrong by design); its dense Q8_0 rows' checks pass.

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

    from strata_cli.gpu.graphs import new_stream
    from strata_cli.model import quants as Q

    t = Q.TYPE_IDS[type_name]
    stream = new_stream()
    rng = np.random.default_rng(3)
    # the default kernels and, for a block type, the decode-free probe (whose sums are wrong by design); Q8_0 (as
    # Q8_0_R32) has the default kernels only
    variants = [qbench.DEFAULT, qbench.Variant("probe", qtc=("QTC_PROBE=1",))]
    variants = [v for v in variants if v.applies(t)]
    assert len(variants) == (2 if type_name == "Q2_K" else 1)
    check = qbench.make_check(t, (1, 8), rng, stream)
    for v in variants:
        _garbage(stream, 3 * 10**9)
        experts = qbench.Experts(t, (1, 8), 2, stream, rng)
        with qbench.variant_kernels(v):
            err = qbench.check_rel_err(check, stream)
            if v.label != "probe":
                assert err < 2e-3, f"{type_name} {v.label}: rel_err {err:.1e}"
            for T in (1, 8):
                r = experts.times(T, stream)
                assert all(ms > 0 for ms in r["ms"].values()) and r["bytes"]["moe"] > 0
        cp.cuda.Device().synchronize()  # a fault of the timed launches is raised here at the latest
        experts.free()


def test_bench_dense_q8_0_rows_check_the_real_shapes(qbench, monkeypatch):
    """The dense Q8_0 rows: each shape's check against numpy passes (both window paths: T = 1 CUDA cores, T = 4
    tensor cores), the shared expert's gate/up pair's too (one launch at T = 1, two at T = 4), and its timing runs;
    the head left out (675 MB) to keep the test short."""
    from strata_cli.gpu.graphs import new_stream

    monkeypatch.setattr(qbench, "DENSE_SHAPES", {k: v for k, v in qbench.DENSE_SHAPES.items() if k != "head"})
    rows = qbench.dense_rows((1, 4), 2, new_stream(), np.random.default_rng(5), 4000.0)
    assert len(rows) == 2 * len(qbench.DENSE_SHAPES) + 2  # + the shared expert's gate/up pair at each T
    assert [r["path"] for r in rows[:2]] == ["q8r", "q8r_tc"]
    assert [(r["matrix"], r["path"]) for r in rows[-2:]] == [("shexp_gateup", "q8r_gu"), ("shexp_gateup", "q8r_tc")]
    for r in rows:
        assert r["rel_err"] < 2e-3 and r["gbs"] > 0, r
