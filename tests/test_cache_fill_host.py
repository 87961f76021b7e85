"""The adaptive expert cache's slot-table updates (tiers/cache_policy.SlotFiller) against a simulated GPU side: a
window only ever reads slots that hold the expert the table names, copies land only in slots no table entry names,
late copies delay the next batch, and the engine's host serves each window from the table it started with."""

from __future__ import annotations

import numpy as np
import pytest

from strata_cli.tiers.cache_policy import ResidencyPolicy, SlotFiller, replay
from strata_cli.tiers.residency import fill_order, slot_table


class SimSlots:
    """The GPU side: VRAM slots holding expert ids, the device's copy of the table, copies in flight that finish
    when the test says (finish_after: boundaries until a batch is done)."""

    def __init__(self, table, finish_after=lambda: 0):
        L, E = table.shape
        self.vram = np.full((L, E), -1, dtype=np.int64)
        for layer, e in zip(*np.nonzero(table >= 0)):
            self.vram[layer, table[layer, e]] = e
        self.device_table = table.copy()
        self.in_flight: list[tuple[int, int, int]] = []
        self.finish_after = finish_after
        self.wait = 0
        self.uploads = self.copies = 0

    def done(self) -> bool:
        if self.in_flight and self.wait > 0:
            self.wait -= 1
            return False
        for layer, e, slot in self.in_flight:  # the copy engine wrote them meanwhile
            self.vram[layer, slot] = e
        self.in_flight = []
        return True

    def upload_table(self, table):
        self.device_table = table.copy()
        self.uploads += 1

    def copy_expert(self, layer, expert, slot):
        assert not (self.device_table[layer] == slot).any(), "a copy into a slot the table still names"
        self.in_flight.append((layer, expert, slot))
        self.copies += 1

    def issued(self):
        self.wait = self.finish_after()

    def check_window(self):
        """What a window reads: every slot the device table names holds that expert, and no copy is writing it."""
        for layer, e in zip(*np.nonzero(self.device_table >= 0)):
            slot = self.device_table[layer, e]
            assert self.vram[layer, slot] == e
            assert (layer, slot) not in {(l, s) for l, _, s in self.in_flight}


def _trace(seed, L=4, E=12, n_windows=30, k=3):
    from test_cache_sim import _random_trace

    return _random_trace(np.random.default_rng(seed), L, E, n_windows, k)[0]


@pytest.mark.parametrize("kind", ["lru", "lfu"])
@pytest.mark.parametrize("late", [False, True])
def test_slot_table_updates_against_a_simulated_gpu(kind, late):
    trace = _trace(3)
    L, E = trace.n_layers, trace.n_expert
    rng = np.random.default_rng(9)
    table = slot_table(L, E, fill_order(L, E), 20)
    gpu = SimSlots(table, (lambda: int(rng.integers(0, 3))) if late else (lambda: 0))
    filler = SlotFiller(ResidencyPolicy(kind, table, trace.expert_bytes, 2000), gpu)
    bounds = trace.window_bounds()
    hits = late_windows = 0
    for w in range(trace.n_windows):
        stats = filler.boundary()
        late_windows += stats["fill_late"]
        np.testing.assert_array_equal(gpu.device_table, table)  # the window reads the table the host plans from
        gpu.check_window()
        copying = np.bincount([c.layer for c in filler.policy.pending], minlength=L)
        assert ((table >= 0).sum(axis=1) + copying).tolist() == filler.policy.capacity.tolist()  # no slot moves
        layer, expert = trace.layer[bounds[w]:bounds[w + 1]], trace.expert[bounds[w]:bounds[w + 1]]
        hits += int((table[layer, expert] >= 0).sum())
        for l in range(L):
            filler.observe(l, expert[layer == l])
        assert stats["fill_bytes"] <= 2000
    assert gpu.copies > 0 and gpu.uploads > 0
    if late:
        assert late_windows > 0
    else:  # copies that always keep up: the engine hits exactly what cache-sim replays (one boundary earlier)
        assert hits == replay(trace, kind, 20, max_copy_bytes=2000).hits.sum()


def test_the_engine_host_serves_each_window_from_its_starting_table(monkeypatch, fixture_dir):
    """TierHost with an lru filler over the simulated window of test_tier_engine_host: each window's VRAM entries are
    exactly the pairs of the table at its start, the filler sees every routed id, and the table changes between
    windows."""
    from test_tier_engine_host import _sim, _SimGPU

    from strata_cli.tiers.step_plan import SRC_VRAM

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "40")
    sim = SimSlots(tiers.table_host)
    per_pair = [int(sum(b)) for b in tiers.expert_bytes]
    tiers.fill = SlotFiller(ResidencyPolicy("lru", tiers.table_host, per_pair, None), sim)
    rng = np.random.default_rng(4)
    T, K = 3, tiers.K
    changed = 0
    seen = np.zeros((tiers.L, tiers.E), np.int64)
    for w in range(5):
        before = tiers.table_host.copy()
        ids = np.stack([[rng.permutation(tiers.E)[:K] for _ in range(T)] for _ in range(tiers.L)]).astype(np.int32)
        gpu = _SimGPU(tiers, x, ids, T)
        monkeypatch.setattr(type(host), "_idle", staticmethod(lambda stream, strict=False, g=gpu: g.done.is_set()))
        host.begin(T)  # the boundary: last window's admissions in, this window's copies issued
        start = tiers.table_host.copy()
        sim.check_window()
        changed += int((start != before).any())
        gpu.start()
        host.serve(T)
        assert gpu.done.wait(5) and not gpu.timed_out
        for layer, r0, n, src, _ in gpu.seen:
            want = start[layer, ids[layer, r0:r0 + n].reshape(-1)] >= 0
            np.testing.assert_array_equal(src == SRC_VRAM, want)
            np.add.at(seen[layer], ids[layer].reshape(-1), 1)
        assert host.history[-1]["vram"] == int(sum(want.sum() for want in [start[l, ids[l].reshape(-1)] >= 0
                                                                          for l in range(tiers.L)]))
    assert changed >= 2 and sum(h["swaps"] for h in host.history) > 0
    np.testing.assert_array_equal(tiers.fill.policy.freq, seen - np.stack(
        [np.bincount(ids[l].reshape(-1), minlength=tiers.E) for l in range(tiers.L)]))  # the last window not folded yet
