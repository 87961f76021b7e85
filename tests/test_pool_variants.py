"""The CPU pool's A/B builds (kernels/expert_pool.c: POOL_SCHED_KIND, POOL_CHUNK, PREFETCH_LINES, PREFETCH_AHEAD,
PREFETCH_HINT; bench/pool_bench.py --ab and device.sh pool-sweep run them) and its diagnostic entry point.

A variant only changes which thread computes which work item and what is prefetched, never the arithmetic of an
item: each must give the default build's output bit for bit (and so the numpy reference's) on odd shapes, partial
items, several rows per expert and any team size, so that the device's winner can become the default without
another check. strata_pool_diag: its profile is consistent and, without touch, its output is strata_pool_swiglu's.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from strata_cli.tiers import native
from strata_cli.tiers.plan import build_plan
from strata_cli.tiers.pool import ExpertPool
from test_tiers_pool import FakeModel, check_pool, needs_native, routed

# the define-only builds of device.sh pool-sweep's POOL_AB (its other two, STRATA_NO_PERM=1 and the AVX2 ISA, are
# test_tiers_pool.py's BUILDS), and a prefetch distance under one row (the item-end bound and the prologue)
VARIANTS = [("POOL_CHUNK=4",), ("POOL_CHUNK=0", "POOL_SCHED_KIND=static"), ("POOL_SCHED_KIND=guided",),
            ("PREFETCH_LINES=1",), ("PREFETCH_AHEAD=4096",), ("POOL_SCHED_KIND=guided", "PREFETCH_AHEAD=4096"),
            ("PREFETCH_HINT=2",), ("PREFETCH_LINES=1", "PREFETCH_AHEAD=64")]
# (gate, up, down), H, F: rows that are no multiple of a down item (544 = 8 x 64 + 32), gate/up items of 16 rows
# and a partial one (F = 40, float down rows), the K-quant min term with its group sums, a 17-byte block type
SHAPES = [(("Q4_0",) * 3, 544, 96), (("Q2_K", "Q2_K", "Q4_0"), 768, 96), (("Q8_0", "BF16", "F16"), 544, 40),
          (("MXFP4",) * 3, 544, 64)]
PROF_HEAD, PROF_PER = 4, 8
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def builds():
    """The default build and every variant, compiled in parallel (each its own .so in the cache)."""
    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(lambda d: native.build(defines=d), [()] + VARIANTS))
    return {d: native.load_variant(d) for d in [()] + VARIANTS}


def run(pool, layer, x, plan):
    out = np.full((x.shape[0] * pool.k, pool.n_embd), np.nan, dtype=np.float32)
    return pool.compute(layer, x, plan.cpu, out=out)


@needs_native
@pytest.mark.parametrize("defines", VARIANTS, ids=",".join)
def test_variant_equals_the_default_build_bit_for_bit(builds, defines):
    lib, base = builds[defines], builds[()]
    config = native.build_config(lib)
    for d in defines:  # the build is the variant it claims to be
        name, value = d.split("=")
        assert str(config[name]) == value
    rng = np.random.default_rng(11)
    for types, H, F in SHAPES:
        model = FakeModel(types, E=5, k=2, H=H, F=F)
        # 19 rows on expert 0 (more than one work item's pass), then a few rows spread over the experts
        for ids in (np.stack([[0, 1 + i % 4] for i in range(19)]), routed(5, 5, 2, rng)):
            x = rng.standard_normal((ids.shape[0], H)).astype(np.float32)
            plan = build_plan(1, ids, np.full(5, -1, np.int32))
            want = run(ExpertPool(model, n_threads=3, lib=base), 1, x, plan)
            for n_threads in (1, 3, 7):
                got = run(ExpertPool(model, n_threads=n_threads, lib=lib), 1, x, plan)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{'+'.join(types)} H={H} F={F} {n_threads} threads")
        check_pool(model, ExpertPool(model, n_threads=4, lib=lib), types, routed(6, 5, 2, rng))


def diag(lib, pool, layer, x, plan, touch):
    out = np.full((x.shape[0] * pool.k, pool.n_embd), np.nan, dtype=np.float32)
    prof = np.full(PROF_HEAD + PROF_PER * pool.n_threads, -1, np.int64)
    args, keep = pool.native_args(layer, x, plan.cpu, out)
    assert lib.strata_pool_diag(*args, touch, prof.ctypes.data) == 0
    del keep
    return out, prof


@needs_native
def test_diag_profile_and_touch(builds):
    lib = builds[()]
    types, H, F = ("Q4_0",) * 3, 544, 96
    model = FakeModel(types, E=5, k=2, H=H, F=F)
    rng = np.random.default_rng(12)
    ids = routed(4, 5, 2, rng)
    x = rng.standard_normal((4, H)).astype(np.float32)
    plan = build_plan(0, ids, np.full(5, -1, np.int32))
    pool = ExpertPool(model, n_threads=3, lib=lib)
    out, prof = diag(lib, pool, 0, x, plan, touch=0)
    np.testing.assert_array_equal(out.view(np.uint32), run(pool, 0, x, plan).view(np.uint32))
    assert prof[2] == 3 and prof[3] == 0 and prof[0] <= prof[1]
    th = prof[PROF_HEAD:].reshape(3, PROF_PER)
    # every thread: entered <= gate/up start <= its last gate/up item <= down start <= its last down item <= end
    assert (np.diff(th[:, :5], axis=1) >= 0).all() and (th[:, 0] >= prof[0]).all() and (th[:, 4] <= prof[1]).all()
    # the items: F / 16 gate/up and ceil(H / 64) down items per expert, each taken by exactly one thread
    assert th[:, 5].sum() == plan.cpu.n_groups * (F // 16) and th[:, 6].sum() == plan.cpu.n_groups * -(-H // 64)
    assert (th[:, 7] == 0).all()
    # touch: the same items read, not decoded; every routed row written (finite), the others left as they were
    touched, prof_t = diag(lib, pool, 0, x, plan, touch=1)
    rows = sorted({int(d) for i in range(plan.cpu.n_groups) for d in plan.cpu.entries(i)[1]})
    assert np.isfinite(touched[rows]).all()
    assert np.isnan(np.delete(touched, rows, axis=0)).all()
    assert prof_t[PROF_HEAD:].reshape(3, PROF_PER)[:, 5:7].sum(axis=0).tolist() == th[:, 5:7].sum(axis=0).tolist()


@needs_native
def test_diag_without_profile_and_bad_rows(builds):
    lib = builds[()]
    model = FakeModel(("Q8_0",) * 3, E=4, k=2, H=64, F=96)
    rng = np.random.default_rng(13)
    ids = routed(3, 4, 2, rng)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    plan = build_plan(0, ids, np.full(4, -1, np.int32))
    pool = ExpertPool(model, n_threads=2, lib=lib)
    out = np.zeros((6, 64), np.float32)
    args, keep = pool.native_args(0, x, plan.cpu, out)
    assert lib.strata_pool_diag(*args, 0, None) == 0
    np.testing.assert_array_equal(out, run(pool, 0, x, plan))
    bad = list(args)
    bad[1] = 63  # H: no whole Q8_0 blocks in a row
    assert lib.strata_pool_diag(*bad, 0, None) == -1
    bad = list(args)
    bad[0] = 0  # no threads
    assert lib.strata_pool_diag(*bad, 0, None) == -1
    del keep


def test_every_device_build_is_held_to_the_default():
    """device.sh's POOL_AB lists only builds that this file (or test_tiers_pool.py's BUILDS) tests."""
    text = (ROOT / "bench" / "device.sh").read_text()
    specs = [s.strip() for s in re.search(r'POOL_AB="([^"]*)"', text).group(1).split("--ab") if s.strip()]
    tested = {frozenset(v) for v in VARIANTS} | {frozenset({"STRATA_NO_PERM=1"}), frozenset({"avx2"})}
    assert specs and all(frozenset(spec.split(",")) in tested for spec in specs), specs
