"""kernels/expert_pool_plan.h (strata_plan_step, through tiers/step_plan.StepPlanner) against its numpy reference
(step_plan.plan_step + write_plan): the same slot words, the same CPU and PCIe groups, on random steps of odd sizes,
every share, repeated experts, residency rows of every density, and steps one after the other on one planner."""

import numpy as np
import pytest

from strata_cli.gpu.launch_util import GEMV_MAXT
from strata_cli.tiers import native
from strata_cli.tiers.step_plan import SRC_CPU, SRC_PCIE, SRC_VRAM, StepPlanner, plan_step, write_plan


def _lib():
    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler: the native planner is not built")
    return lib


def _same_entries(got, want, what):
    for name in ("experts", "start", "tok", "dst"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=f"{what} {name}")


@pytest.mark.parametrize("seed", range(6))
def test_native_plan_equals_the_reference(seed):
    lib = _lib()
    rng = np.random.default_rng(seed)
    E, K = int(rng.integers(5, 80)), int(rng.integers(1, 11))
    M = int(rng.integers(1, 17))
    JM = M * K + int(rng.integers(0, 5))
    planner, ref_planner = StepPlanner(lib, E, JM), StepPlanner(None, E, JM)
    for step in range(25):
        n = int(rng.integers(1, M + 1))
        k = min(K, E)
        if rng.random() < 0.5:
            ids = np.stack([rng.permutation(E)[:k] for _ in range(n)]).astype(np.int32)
        else:  # experts repeated within a row (the plan must group them all the same)
            ids = rng.integers(0, min(E, 6), (n, k)).astype(np.int32)
        resident = np.full(E, -1, np.int32)
        hot = rng.permutation(E)[:int(rng.integers(0, E + 1))]
        resident[hot] = rng.permutation(len(hot))
        frac = float(rng.choice([0.0, 0.25, 0.3, 0.5, 1.0, rng.random()]))
        j0 = int(rng.integers(0, JM - n * k + 1))
        slot = np.full(JM * (3 + GEMV_MAXT), 7, np.int32)
        want_slot = slot.copy()
        want = plan_step(ids, resident, frac)
        if any(want.pcie.start[q + 1] - want.pcie.start[q] > GEMV_MAXT for q in range(want.pcie.n_groups)):
            continue  # write_plan refuses it too
        write_plan(want_slot, want, j0, JM)
        got = planner.plan(ids, resident, frac, slot, j0)
        np.testing.assert_array_equal(slot, want_slot, err_msg=f"step {step}: the slot words")
        np.testing.assert_array_equal(got.src, want.src)
        _same_entries(got.cpu, want.cpu, f"step {step} cpu")
        _same_entries(got.pcie, want.pcie, f"step {step} pcie")
        assert planner.counts == tuple(int((want.src == s).sum()) for s in (SRC_VRAM, SRC_PCIE, SRC_CPU))
        ref = ref_planner.plan(ids, resident, frac, want_slot.copy(), j0)
        assert ref_planner.counts == planner.counts
        _same_entries(ref.cpu, want.cpu, "reference planner")


def test_native_plan_refuses_bad_ids_and_sizes_and_stays_usable():
    lib = _lib()
    E, JM = 8, 6
    planner = StepPlanner(lib, E, JM)
    slot = np.zeros(JM * (3 + GEMV_MAXT), np.int32)
    resident = np.full(E, -1, np.int32)
    with pytest.raises(ValueError, match="outside 0..7"):
        planner.plan(np.array([[1, 8]], np.int32), resident, 0.0, slot, 0)
    with pytest.raises(ValueError, match="outside 0..7"):
        planner.plan(np.array([[3, -1]], np.int32), resident, 0.0, slot, 0)
    with pytest.raises(ValueError, match="does not fit"):
        planner.plan(np.array([[1, 2], [3, 4]], np.int32), resident, 0.0, slot, 4)
    with pytest.raises(ValueError, match="residency row"):
        planner.plan(np.array([[1, 2]], np.int32), resident[:5], 0.0, slot, 0)
    # the map is back to unseen after a refusal: the next plan sees every expert fresh
    got = planner.plan(np.array([[1, 3], [3, 1]], np.int32), resident, 0.5, slot, 0)
    np.testing.assert_array_equal(got.cpu.experts, [1])
    np.testing.assert_array_equal(got.pcie.experts, [3])
    np.testing.assert_array_equal(got.cpu.dst, [0, 3])
    np.testing.assert_array_equal(got.cpu.tok, [0, 1])
    np.testing.assert_array_equal(got.pcie.dst, [1, 2])
    assert planner.counts == (0, 2, 2)
