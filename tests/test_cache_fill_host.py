"""The adaptive expert cache's slot-table updates (tiers/cache_policy.SlotFiller) against a simulated GPU side: a
window only ever reads slots that hold the expert the table names, copies land only in slots no table entry names,
late copies delay the next batch, the boundary before a window copies nothing (the batch is copied after the
window's last step was served), a batch enters the table only once its copy finished, and the engine's host serves
each window from the table it started with. Then the batch's host side (tiers/fill_batch.py): the staging bytes are
the file's rows, one DMA run per stretch of consecutive slots."""

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

    def copy_batch(self, copies):
        assert not self.in_flight, "a batch copied while the last one's copies still read the staging"
        for c in copies:
            assert not (self.device_table[c.layer] == c.slot).any(), "a copy into a slot the table still names"
            self.in_flight.append((c.layer, c.expert, c.slot))
        self.copies += len(copies)
        self.wait = self.finish_after()
        self.on_copy()

    def on_copy(self):
        """The moment a batch is copied (the engine host test records what has been served by then)."""

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
        before = gpu.copies
        stats = filler.boundary()
        assert gpu.copies == before, "the boundary before the window's launch copied"
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
        planned = list(filler.planned)
        filler.copy()  # after the window's last step
        assert gpu.copies == before + len(planned) and not filler.planned
        assert all(table[c.layer, c.expert] < 0 for c in planned)  # in the table only at a boundary after done()
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

    from strata_cli.tiers.doorbell import FLAG

    model, tiers, host, gpu, x, ids = _sim(monkeypatch, fixture_dir, "40")
    sim = SimSlots(tiers.table_host)
    copied_at = []  # per batch copied: (the flag the host had raised by then, serving?)
    sim.on_copy = lambda: copied_at.append((int(tiers.words.host[FLAG]), host.active))
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
        copies = sim.copies
        host.begin(T)  # the boundary: last window's admissions in, this window's batch planned, nothing copied
        assert sim.copies == copies
        start = tiers.table_host.copy()
        sim.check_window()
        planned = len(tiers.fill.planned)
        changed += int((start != before).any())
        gpu.start()
        host.serve(T)
        assert gpu.done.wait(5) and not gpu.timed_out
        # the batch was copied inside serve(), once every step's flag was raised (the last ring: L steps)
        assert sim.copies == copies + planned and not tiers.fill.planned
        if planned:
            assert copied_at[-1] == (tiers.steps.count(1), True)
        assert host.history[-1]["fill_gather_ms"] >= 0.0
        for layer, r0, n, src, _ in gpu.seen:
            want = start[layer, ids[layer, r0:r0 + n].reshape(-1)] >= 0
            np.testing.assert_array_equal(src == SRC_VRAM, want)
            np.add.at(seen[layer], ids[layer].reshape(-1), 1)
        assert host.history[-1]["vram"] == int(sum(want.sum() for want in [start[l, ids[l].reshape(-1)] >= 0
                                                                          for l in range(tiers.L)]))
    assert changed >= 2 and sum(h["swaps"] for h in host.history) > 0
    np.testing.assert_array_equal(tiers.fill.policy.freq, seen - np.stack(
        [np.bincount(ids[l].reshape(-1), minlength=tiers.E) for l in range(tiers.L)]))  # the last window not folded yet
    assert copied_at  # some window copied a batch


def test_a_batch_enters_the_table_only_after_its_copy_finished():
    """A batch planned at a boundary and never copied (the window's launch failed: serve() never ran) is not
    activated by the next boundary; once copied and done it is, and a batch still copying delays activation."""
    L, E = 2, 6
    table = slot_table(L, E, fill_order(L, E), 4)  # experts 0, 1 of each layer held
    gpu = SimSlots(table, lambda: 1)  # every batch still copying at the first boundary after it
    filler = SlotFiller(ResidencyPolicy("lru", table, [10, 10], None), gpu)
    assert filler.boundary() == {"swaps": 0, "fill_bytes": 0, "fill_late": 0}
    for layer in range(L):
        filler.observe(layer, np.array([4, 5]))  # both held experts' slots wanted for 4, 5
    stats = filler.boundary()
    planned = list(filler.planned)
    assert stats["swaps"] == len(planned) == 4 and gpu.copies == 0
    assert all(table[c.layer, c.expert] < 0 for c in planned)
    for _ in range(2):  # no copy() in between: nothing changes, the batch stays planned
        assert filler.boundary() == {"swaps": 0, "fill_bytes": 0, "fill_late": 1}
        assert filler.planned == planned and all(table[c.layer, c.expert] < 0 for c in planned)
        gpu.check_window()
    filler.copy()
    assert gpu.copies == 4 and not filler.planned
    assert filler.boundary()["fill_late"] == 1  # still copying: not in the table yet
    assert all(table[c.layer, c.expert] < 0 for c in planned)
    gpu.check_window()
    filler.copy()  # nothing planned: nothing copied
    assert gpu.copies == 4
    stats = filler.boundary()
    assert stats["fill_late"] == 0 and all(table[c.layer, c.expert] == c.slot for c in planned)
    np.testing.assert_array_equal(gpu.device_table, table)
    gpu.check_window()


def _file_rows(model, layer):
    from strata_cli.tiers.gather import expert_bytes_view
    from strata_cli.tiers.residency import expert_names

    return [expert_bytes_view(model.info(n).raw, model.geometry.n_expert) for n in expert_names(layer)]


@pytest.mark.parametrize("kind,threads", [("numpy", 1), ("native", 1), ("native", 3)])
def test_the_staged_batch_is_the_files_rows_one_run_per_stretch_of_slots(fixture_dir, kind, threads):
    """tiers/fill_batch.stage_batch over the fixture's memory-mapped file: every run's staging bytes equal the file's
    rows of its experts (numpy reference), in slot order, runs cover consecutive slots only, nothing past the batch
    is written, and a batch past the staging buffer is refused in one line."""
    from test_gather import _lib

    from strata_cli.errors import StrataError
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.cache_policy import Copy
    from strata_cli.tiers.fill_batch import stage_batch

    model = open_model(fixture_dir / "model-q8_0.gguf")
    srcs = {layer: _file_rows(model, layer) for layer in (1, 3)}
    # layer 3: slots 5, 6, 7 (one run, given out of order), 2 (a run of one); layer 1: slots 0, 4
    copies = [Copy(3, 9, 6), Copy(3, 1, 2), Copy(3, 0, 5), Copy(1, 7, 4), Copy(3, 4, 7), Copy(1, 2, 0)]
    total = sum(int(src.shape[1]) for c in copies for src in srcs[c.layer])
    staging = np.full(total + 100, 0xEE, dtype=np.uint8)
    runs = stage_batch(copies, srcs, staging, _lib(kind), threads)
    slot_expert = {(c.layer, c.slot): c.expert for c in copies}
    assert [(r.layer, r.p, r.slot, r.count) for r in runs] == (
        [(1, p, s, 1) for p in range(3) for s in (0, 4)]
        + [(3, p, s, k) for p in range(3) for s, k in ((2, 1), (5, 3))])
    covered = 0
    for r in runs:
        assert r.row_bytes == srcs[r.layer][r.p].shape[1] and r.offset == covered
        got = staging[r.offset:r.offset + r.nbytes].reshape(r.count, r.row_bytes)
        want = srcs[r.layer][r.p][[slot_expert[r.layer, r.slot + i] for i in range(r.count)]]
        np.testing.assert_array_equal(got, want)
        covered += r.nbytes
    assert covered == total and (staging[total:] == 0xEE).all()
    with pytest.raises(StrataError, match="past the .*staging buffer"):
        stage_batch(copies, srcs, staging[:total - 1], _lib(kind), threads)
    with pytest.raises(StrataError, match="two experts into one slot"):
        stage_batch([Copy(1, 2, 0), Copy(1, 3, 0)], srcs, staging, _lib(kind), threads)


def test_the_default_max_copy_is_the_fill_paths_bytes_in_the_shortest_window():
    """--expert-max-copy not given: FILL_WINDOW_MS of the gather then the DMA, at auto's rates where measured (the
    DMA's only once measured), else the constants (cache-sim's default too); capped at what the slots hold."""

    from strata_cli.tiers.cache_policy import DEFAULT_MAX_COPY, DEFAULT_MAX_COPY_BYTES, default_max_copy
    from strata_cli.tiers.residency import parse_size
    from strata_cli.tiers.share import ShareRates

    assert DEFAULT_MAX_COPY_BYTES == parse_size(DEFAULT_MAX_COPY, "x") == 556_000_000  # 20 ms x 27.8 GB/s
    assert default_max_copy(10**12) == DEFAULT_MAX_COPY_BYTES
    assert default_max_copy(1234) == 1234
    assert default_max_copy(10**12, ShareRates(50.0, 30.0)) == DEFAULT_MAX_COPY_BYTES  # a DMA not measured: 51
    # the gather's constant 61.2 GB/s, then the measured DMA: 20 ms / (1 / 61.2 + 1 / 30) = 402 MB
    assert default_max_copy(10**12, ShareRates(50.0, 30.0, dma_measured=True)) == 402_000_000
    assert default_max_copy(10**12, ShareRates(50.0, 1000.0, dma_measured=True)) == 1_153_000_000
