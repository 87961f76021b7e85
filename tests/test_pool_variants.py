"""The CPU pool's diagnostic entry point (strata_pool_diag: bench/pool_bench.py's profile and touch mode), the
build's reported tuning, and the A/B builds.

strata_pool_diag: its profile is consistent and, without touch, its output is strata_pool_swiglu's bit for bit. The
tuning macros of the 2026-12-02 device sweep (POOL_SCHED_KIND, PREFETCH_LINES / AHEAD / HINT, STRATA_NO_PERM) are
settled in kernels/expert_pool.c (dynamic; prefetch by lines for Q4_0 only). Left as A/B switches for
bench/pool_bench.py --ab: the item loops' chunk (POOL_CHUNK on large calls, smaller on small calls so that every
thread gets POOL_MIN_TAKES takes; POOL_MIN_TAKES=0 is the schedule before small calls had their own). Every such
build writes the default's bits (the schedule only decides which thread computes an item, never how).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from strata_cli.tiers import native
from strata_cli.tiers.plan import build_plan
from strata_cli.tiers.pool import ExpertPool
from test_tiers_pool import FakeModel, check_pool, needs_native, routed

PROF_HEAD, PROF_PER = 4, 8
ROOT = Path(__file__).resolve().parent.parent


# the A/B builds of the item schedule (bench/pool_bench.py --ab): today's (every call at POOL_CHUNK), more takes
# (chunk 1 on the engine's 4-expert calls), one item per take
SCHEDULE_AB = (("POOL_MIN_TAKES=0",), ("POOL_MIN_TAKES=8",), ("POOL_CHUNK=1",))


@pytest.fixture(scope="module")
def builds():
    libs = {(): native.load_variant(())}
    if libs[()] is not None:
        libs.update({ab: native.load_variant(ab) for ab in SCHEDULE_AB})
    return libs


def expected_chunk(items: int, team: int, config: dict) -> int:
    """kernels/expert_pool.c pool_chunk: the largest c <= POOL_CHUNK giving every thread POOL_MIN_TAKES takes."""
    chunk, takes = config["POOL_CHUNK"], config["POOL_MIN_TAKES"]
    return chunk if takes < 1 else max(1, min(chunk, items // (team * takes)))


def run(pool, layer, x, plan):
    out = np.full((x.shape[0] * pool.k, pool.n_embd), np.nan, dtype=np.float32)
    return pool.compute(layer, x, plan.cpu, out=out)


@needs_native
def test_build_config_names_the_settled_tuning(builds):
    config = native.build_config(builds[()])
    assert config["POOL_CHUNK"] == 4 and config["schedule"] == "dynamic" and config["PREFETCH_AHEAD"] == 2048
    assert config["ROWS_GATE_UP"] == 16 and config["ROWS_DOWN"] == 64
    assert config["perm"] == (1 if native.host_isas()[0].startswith("avx512") else 0)
    assert config["POOL_MIN_TAKES"] == 4
    # the A/B builds: only their define differs
    for ab in SCHEDULE_AB:
        name, value = ab[0].split("=")
        assert native.build_config(builds[ab]) == dict(config, **{name: int(value)})


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
    config = native.build_config(lib)
    assert prof[2] == 3 and prof[3] == expected_chunk(plan.cpu.n_groups * (F // 16), 3, config)
    assert prof[0] <= prof[1]
    th = prof[PROF_HEAD:].reshape(3, PROF_PER)
    # every thread: entered <= gate/up start <= its last gate/up item <= down start <= its last down item <= end
    assert (np.diff(th[:, :5], axis=1) >= 0).all() and (th[:, 0] >= prof[0]).all() and (th[:, 4] <= prof[1]).all()
    # the items: F / 16 gate/up and ceil(H / 64) down items per expert, each taken by exactly one thread
    assert th[:, 5].sum() == plan.cpu.n_groups * (F // 16) and th[:, 6].sum() == plan.cpu.n_groups * -(-H // 64)
    assert (th[:, 7] == expected_chunk(plan.cpu.n_groups * -(-H // 64), 3, config)).all()
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


@needs_native
@pytest.mark.parametrize("k,n_tokens", [(1, 1), (3, 1), (3, 8), (8, 1)])
def test_small_calls_take_smaller_chunks_and_the_same_bits(builds, k, n_tokens):
    """The engine's small calls (fewer items than threads x POOL_CHUNK x POOL_MIN_TAKES: 1 and 3 experts at 16 gate/up
    and 8 down items each on 4 threads) take a smaller chunk, the large ones (8 experts' gate/up items) keep
    POOL_CHUNK; the numpy reference holds, and every A/B schedule build writes the default's bits."""
    types, H, F, E, n_threads = ("Q2_K", "Q2_K", "Q4_0"), 512, 256, 10, 4
    model = FakeModel(types, E=E, k=k, H=H, F=F)
    rng = np.random.default_rng(20 + k)
    ids = np.tile(rng.choice(E, k, replace=False), (n_tokens, 1))  # every token on the same k experts (pool_bench)
    pool = ExpertPool(model, n_threads=n_threads, lib=builds[()])
    plan = check_pool(model, pool, types, ids, layer=0)
    assert plan.cpu.n_groups == k
    x = np.random.default_rng(1).standard_normal((n_tokens, H)).astype(np.float32)
    want = run(pool, 0, x, plan)
    chunks = {}
    for ab, lib in builds.items():
        ab_pool = ExpertPool(model, n_threads=n_threads, lib=lib)
        out, prof = diag(lib, ab_pool, 0, x, plan, touch=0)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32), err_msg=f"build {ab}")
        config = native.build_config(lib)
        chunks[ab] = (int(prof[3]), int(prof[PROF_HEAD + 7]))
        assert chunks[ab] == (expected_chunk(k * (F // 16), n_threads, config),
                              expected_chunk(k * (H // 64), n_threads, config)), ab
    assert chunks[("POOL_MIN_TAKES=0",)] == (4, 4)  # today's schedule, whatever the call's size
    # the default: gate/up 16 items -> 1, 48 -> 3, 128 -> 4; down 8 -> 1, 24 -> 1, 64 -> 4
    assert chunks[()] == {1: (1, 1), 3: (3, 1), 8: (4, 4)}[k]


def test_every_device_build_is_tested():
    """device.sh's POOL_AB lists only builds that test_tiers_pool.py's BUILDS hold to numpy (the ISA builds)."""
    text = (ROOT / "bench" / "device.sh").read_text()
    specs = [s.strip() for s in re.search(r'POOL_AB="([^"]*)"', text).group(1).split("--ab") if s.strip()]
    assert specs and all(spec in ("avx512", "avx2") for spec in specs), specs


@needs_native
@pytest.mark.skipif(not native.host_isas()[0].startswith("avx512"), reason="the lane-order Q2_K kernels are AVX-512's")
@pytest.mark.parametrize("n", [256, 768, 2560])
def test_q2k_one_row_kernel_matches_numpy(n):
    """strata_rows_dots at 1 token row (rows1_q2_kx: 2 weight rows a pass, then 1; d / dmin converted a block ahead)
    on 1, 2, 3 and 5 rows of 1, 3 and 10 blocks (the last block's d / dmin converted twice, not read past the row),
    random x, and x with NaN in the last block: NaN in every row's dot"""
    from test_tiers_pool import dequant_ref, random_raw, rows_dots
    lib = native.load_variant(())
    assert lib is not None
    rng = np.random.default_rng(n)
    raw = np.ascontiguousarray(random_raw("Q2_K", 5, n, rng))
    x = rng.standard_normal((1, n)).astype(np.float32)
    ref = dequant_ref(raw, "Q2_K").astype(np.float64) @ x[0].astype(np.float64)
    for rows in (1, 2, 3, 5):
        got = rows_dots(lib, "Q2_K", raw[:rows], x, 1)
        np.testing.assert_allclose(got[:, 0], ref[:rows], rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    poisoned = x.copy()
    poisoned[0, n - 7] = np.nan
    assert np.isnan(rows_dots(lib, "Q2_K", raw, poisoned, 1)).all()
