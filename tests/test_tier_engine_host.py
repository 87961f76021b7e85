"""Host side of the GPU engine's expert tiers, without a GPU: the step plan and its mapped words, cache specs,
the residency table and the default ranking."""

from __future__ import annotations

import numpy as np
from strata_cli.engine.gpu.tier_host import SRC_CPU, SRC_PCIE, SRC_VRAM, plan_step, write_plan
from strata_cli.engine.gpu.tiers import TierConfig, choose_residency, ranked_pairs, residency_table
from strata_cli.gpu.launch_util import GEMV_MAXT


def test_plan_step_splits_misses_in_routing_order():
    resident = np.array([0, -1, 1, -1, -1, -1, 2, -1], dtype=np.int32)
    ids = np.array([1, 0, 3, 5, 3, 7, 1, 4], dtype=np.int32)  # rows of K=2: (1,0) (3,5) (3,7) (1,4)
    for frac, want_pcie in [(0.0, []), (0.5, [7, 4]), (1.0, [1, 3, 5, 7, 4])]:
        plan = plan_step(ids, resident, frac)
        assert plan.pcie == want_pcie
        assert plan.cpu == [e for e in (1, 3, 5, 7, 4) if e not in want_pcie]  # distinct misses, first-seen order
        want = np.array([SRC_VRAM if resident[e] >= 0 else SRC_PCIE if e in want_pcie else SRC_CPU for e in ids])
        np.testing.assert_array_equal(plan.src, want)
        np.testing.assert_array_equal(plan.entries[1], [0, 6])
        np.testing.assert_array_equal(plan.entries[3], [2, 4])


def test_plan_step_floor_of_the_pcie_share():
    resident = np.full(10, -1, dtype=np.int32)
    plan = plan_step(np.arange(7, dtype=np.int32), resident, 0.3)  # floor(7 * 0.3) = 2: the last two
    assert plan.pcie == [5, 6] and plan.cpu == [0, 1, 2, 3, 4]


def test_write_plan_words():
    JM, j0 = 12, 4
    slot = np.full(JM * (3 + GEMV_MAXT), -7, dtype=np.int32)
    resident = np.array([-1, 0, -1, -1], dtype=np.int32)
    ids = np.array([0, 2, 1, 3, 2, 0], dtype=np.int32)  # global entries 4..9
    plan = plan_step(ids, resident, 1.0)
    write_plan(slot, plan, j0, JM)
    np.testing.assert_array_equal(slot[j0:j0 + 6], [SRC_PCIE, SRC_PCIE, SRC_VRAM, SRC_PCIE, SRC_PCIE, SRC_PCIE])
    assert (slot[:j0] == -7).all() and (slot[j0 + 6:JM] == -7).all()  # other groups' entries untouched
    g_expert, g_count = slot[JM:2 * JM], slot[2 * JM:3 * JM]
    g_entries = slot[3 * JM:].reshape(JM, GEMV_MAXT)
    assert plan.pcie == [0, 2, 3]
    np.testing.assert_array_equal(g_expert[:3], [0, 1, 2])  # staging slot = position in the PCIe list
    np.testing.assert_array_equal(g_count[:6], [2, 2, 1, 0, 0, 0])
    np.testing.assert_array_equal(g_entries[0, :2], [4, 9])
    np.testing.assert_array_equal(g_entries[1, :2], [5, 8])
    np.testing.assert_array_equal(g_entries[2, :1], [7])


class _Info:
    def __init__(self, n_bytes):
        self.n_bytes = n_bytes


class _Geometry:
    n_layers, n_expert = 3, 4


class _Model:
    geometry = _Geometry()

    def info(self, name):
        return _Info(4 * 100)  # 100 bytes per expert and projection


def test_ranking_residency_and_sizes():
    model = _Model()
    ranked = ranked_pairs(model, None)
    assert ranked.shape == (12, 2)
    np.testing.assert_array_equal(ranked[:4], [[0, 0], [1, 0], [2, 0], [0, 1]])  # layers share the cache evenly
    table = residency_table(model, ranked, 5)
    np.testing.assert_array_equal(table, [[0, 1, -1, -1], [0, 1, -1, -1], [0, -1, -1, -1]])
    for cache, n in [("0", 0), ("5", 5), ("all", 12), ("1500B", 5), ("100000", 12)]:  # 300 bytes per pair
        table, note = choose_residency(model, TierConfig(cache=cache), None, 0)
        assert int((table >= 0).sum()) == n, cache
        assert f"{n} of 12" in note
    table, _ = choose_residency(model, TierConfig(cache="auto"), (1 << 30) + 2000, 500)
    assert int((table >= 0).sum()) == 5  # (2000 - 500) // 300
