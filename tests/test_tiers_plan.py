"""Plan building against hand-computed cases and random plans."""

from __future__ import annotations

import numpy as np
import pytest

from strata_cli.tiers.plan import build_plan, n_pcie

IDS = np.array([[5, 2, 7], [2, 9, 5], [1, 7, 3]])
TABLE = np.full(12, -1, dtype=np.int32)
TABLE[2], TABLE[7] = 4, 0


def groups(entries):
    return [(int(e), entries.entries(i)[0].tolist(), entries.entries(i)[1].tolist())
            for i, e in enumerate(entries.experts)]


def test_hand_computed_plan():
    plan = build_plan(3, IDS, TABLE, pcie_frac=0.5)
    # distinct in routing order: 5 2 7 9 1 3; hits 2 (slot 4), 7 (slot 0); misses 5 9 1 3 -> the last 2 over PCIe
    assert groups(plan.vram) == [(2, [0, 1], [1, 3]), (7, [0, 2], [2, 7])]
    assert plan.vram_slots.tolist() == [4, 0]
    assert groups(plan.pcie) == [(1, [2], [6]), (3, [2], [8])]
    assert groups(plan.cpu) == [(5, [0, 1], [0, 5]), (9, [1], [4])]
    assert plan.n_gpu_entries == 6 and plan.n_misses == 4 and plan.layer == 3


def test_row0_offsets_tokens_and_parts_rows():
    plan = build_plan(0, IDS, TABLE, pcie_frac=0.0, row0=2)
    assert groups(plan.cpu) == [(5, [2, 3], [6, 11]), (9, [3], [10]), (1, [4], [12]), (3, [4], [14])]
    assert plan.pcie.n_groups == 0


@pytest.mark.parametrize("n_miss,frac,slots,want", [(4, 0.5, None, 2), (100, 0.29, None, 29), (7, 1.0, None, 7),
                                                    (7, 0.99, None, 6), (0, 0.5, None, 0), (40, 1.0, 16, 16),
                                                    (5, 0.0, None, 0)])
def test_pcie_share(n_miss, frac, slots, want):
    assert n_pcie(n_miss, frac, slots) == want


def test_all_resident_and_all_missed():
    plan = build_plan(0, IDS, np.arange(12, dtype=np.int32))
    assert plan.n_misses == 0 and plan.vram.n_entries == 9
    plan = build_plan(0, IDS, np.full(12, -1, np.int32), pcie_frac=1.0)
    assert plan.vram.n_groups == 0 and plan.cpu.n_groups == 0 and plan.pcie.n_entries == 9


def test_random_plans_cover_every_entry_once():
    rng = np.random.default_rng(7)
    for trial in range(50):
        n, k, E = rng.integers(1, 9), rng.integers(1, 6), 16
        ids = np.stack([rng.choice(E, k, replace=False) for _ in range(n)])
        table = np.where(rng.random(E) < 0.4, np.arange(E), -1).astype(np.int32)
        plan = build_plan(1, ids, table, pcie_frac=rng.random())
        dst = np.concatenate([plan.vram.dst, plan.pcie.dst, plan.cpu.dst])
        assert sorted(dst.tolist()) == list(range(n * k))
        for part in (plan.vram, plan.pcie, plan.cpu):
            for i, e in enumerate(part.experts):
                tok, d = part.entries(i)
                assert (ids[tok, d - tok * k] == e).all()
        assert (table[plan.vram.experts] >= 0).all() and (table[plan.cpu.experts] < 0).all()
        misses = [e for e in dict.fromkeys(ids.reshape(-1).tolist()) if table[e] < 0]
        assert plan.cpu.experts.tolist() + plan.pcie.experts.tolist() == misses
