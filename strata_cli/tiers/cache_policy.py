"""Cache policies of the VRAM expert cache: which (layer, expert) pairs the slots hold, window by window. One
implementation of each policy, shared by `strata cache-sim` (a replay of a routing trace) and the GPU engine's
`--expert-policy` (engine/gpu/residency_fill.py, which copies the admitted experts on a side stream).

The cache is per layer: layer l has as many slots as the static set gives it (the first N pairs of the fill order,
tiers/residency.fill_order: a profile's ranked order or, without one, the same share per layer), so N counts slots
over all layers, as --expert-cache N does. Every policy starts from that static set.

  static  the static set, never changed.
  lru     after each window, a layer keeps the experts picked most recently (by window); among equals the ones
          it holds stay, then lower expert ids win.
  lfu     after each window, a layer keeps the experts picked most often over every window served so far; among
          equals the ones it holds stay, then lower expert ids win.

A window is served by the slot table it started with; the table changes only between windows (boundary()):
 1. the admissions of the last boundary become resident (the engine: once their copies finished; if they did not,
    nothing changes this time, so at most one batch of copies is in flight),
 2. the policy compares what each layer holds with what it wants, and pairs its most wanted missing experts with
    its least wanted held ones: each evicted pair leaves the table at once, its slot receives the admitted
    expert's copy during the next window (the engine: gathered after that window's last step, copied by DMA while
    it ends and the one after starts: SlotFiller).
So an expert admitted after window w serves from window w + 2 on (the engine: when its copy kept up). At most
`max_copy_bytes` are admitted per boundary, taken in the order (rank within its layer, layer): every layer gets its
first choice before any its second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from .share import PCIE_GBS  # cudaMemcpyAsync host -> device from pinned memory, 51 GB/s

POLICIES = ("static", "lru", "lfu")
# The default --expert-max-copy (and cache-sim --max-copy): what the fill path moves in FILL_WINDOW_MS. A batch is
# gathered on the host after a window's last step, then copied by DMA (one after the other: the path's rate is
# 1 / (1/gather + 1/DMA)); a batch that takes at most the shortest window's time has landed by the end of the window
# after it, so it is never in flight at two boundaries and its gather costs the host at most ~9 ms (the GPU's tail
# hides part). At the H200's rates: 20 ms x 27.8 GB/s = 556 MB (lru at 12 GiB swapped 535 MB a window).
FILL_WINDOW_MS = 20.0  # the full-size model's all-resident T = 1 window (~21 ms): no tiered window is shorter
GATHER_GBS = 61.2      # strata_gather on the H200 host's 16 threads, 64 MB a call (kernels/expert_pool.c)


def fill_budget_bytes(gather_gbs: float = GATHER_GBS, dma_gbs: float = PCIE_GBS,
                      window_ms: float = FILL_WINDOW_MS) -> int:
    """The bytes the fill path (the gather, then the DMA) moves in window_ms, in whole MB (so that cache-sim's
    default, as text, is the same number); gather_gbs inf: no gather cost."""
    megabytes = window_ms / (1.0 / gather_gbs + 1.0 / dma_gbs)  # ms x GB/s = MB
    return int(megabytes + 1e-6) * 1_000_000  # (+1e-6: 239.99999... is 240)


def default_max_copy(cache_bytes: int, rates=None) -> int:
    """--expert-max-copy when not given: fill_budget_bytes at the gather's constant rate and the DMA rate
    --pcie-frac auto measured (rates: tiers/share.ShareRates; the DMA's only if measured, else the constant); never
    more than the cache's slots hold (cache_bytes: no batch can copy more; small models stage no more than that)."""
    dma = rates.dma_gbs if rates is not None and rates.dma_measured else PCIE_GBS
    return max(0, min(int(cache_bytes), fill_budget_bytes(GATHER_GBS, dma)))


DEFAULT_MAX_COPY_BYTES = fill_budget_bytes()
DEFAULT_MAX_COPY = f"{DEFAULT_MAX_COPY_BYTES / 1e6:.0f}MB"  # cache-sim's --max-copy default, as text
NEVER = -1  # last_use of a pair never picked


def check_policy(name: str, option: str = "--policy") -> str:
    if name not in POLICIES:
        raise OptionError(f"{option} {name!r}: expected one of {', '.join(POLICIES)}")
    return name


@dataclass(frozen=True)
class Copy:
    layer: int
    expert: int
    slot: int


class ResidencyPolicy:
    """The slot table [L, E] (expert -> slot, -1 = not resident; updated in place, so whoever plans from it sees the
    change) and one policy's state. observe() the picks of each served window, then boundary()."""

    def __init__(self, kind: str, table: np.ndarray, expert_bytes, max_copy_bytes: int | None = None):
        self.kind = check_policy(kind)
        self.table = table
        self.L, self.E = table.shape
        self.capacity = (table >= 0).sum(axis=1)
        self.expert_bytes = np.asarray(expert_bytes, dtype=np.int64)
        self.max_copy_bytes = max_copy_bytes
        self.pending: list[Copy] = []  # copies issued at the last boundary (their slots are out of the table)
        self.reset()

    def reset(self) -> None:
        """Forget every pick (the engine's warm-up windows are not the user's); the table and the copies in flight
        stay (dropping those would lose their slots: the next boundary activates them)."""
        self.seen = np.zeros((self.L, self.E), dtype=np.int64)  # picks of the window being served
        self.last_use = np.full((self.L, self.E), NEVER, dtype=np.int64)
        self.freq = np.zeros((self.L, self.E), dtype=np.int64)
        self.windows = 0

    # ---- picks
    def observe(self, layer: int, ids: np.ndarray) -> None:
        """ids: the experts routed for layer's rows of the window being served (any shape)."""
        self.seen[layer] += np.bincount(np.asarray(ids).reshape(-1), minlength=self.E)

    def observe_picks(self, layers: np.ndarray, experts: np.ndarray) -> None:
        np.add.at(self.seen, (layers, experts), 1)

    # ---- between windows
    def boundary(self, copies_done: bool = True) -> tuple[list[Copy], list[Copy]]:
        """After a served window: fold its picks in, then (if the last batch's copies are done) activate them and plan
        the next batch. Returns (activated, new copies to issue); evicted pairs are already out of the table."""
        picked = self.seen > 0
        self.last_use[picked] = self.windows
        self.freq += self.seen
        self.seen[:] = 0
        self.windows += 1
        if self.kind == "static" or not copies_done:
            return [], []
        activated = self.pending
        for c in activated:
            self.table[c.layer, c.expert] = c.slot
        self.pending = self._plan()  # nothing is being copied now: the table holds every held pair
        return activated, list(self.pending)

    def _score(self) -> np.ndarray:
        return self.last_use if self.kind == "lru" else self.freq

    def _plan(self) -> list[Copy]:
        held = self.table >= 0
        key = self._score() * 2 + held  # held pairs win ties
        experts = np.broadcast_to(np.arange(self.E), key.shape)
        order = np.lexsort((experts, -key), axis=1)  # per layer: descending key, then expert id
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(self.E)[None, :], axis=1)
        want = rank < self.capacity[:, None]
        parts = []  # per layer: (rank of the swap, layer, admitted, evicted), most wanted admission first
        for layer in range(self.L):
            by_rank = order[layer]
            admit = by_rank[want[layer, by_rank] & ~held[layer, by_rank]]
            worst = by_rank[::-1]
            evict = worst[held[layer, worst] & ~want[layer, worst]]
            n = min(len(admit), len(evict))
            if n:
                parts.append(np.stack([np.arange(n), np.full(n, layer), admit[:n], evict[:n]], axis=1))
        if not parts:
            return []
        swaps = np.concatenate(parts)
        swaps = swaps[np.lexsort((swaps[:, 1], swaps[:, 0]))]  # every layer's first choice, then the second, ...
        if self.max_copy_bytes is not None:
            spent = np.cumsum(self.expert_bytes[swaps[:, 1]])
            swaps = swaps[:int(np.searchsorted(spent > self.max_copy_bytes, True))]
        copies = []
        for _, layer, admit, evict in swaps.tolist():
            copies.append(Copy(layer, admit, int(self.table[layer, evict])))
            self.table[layer, evict] = -1
        return copies


@dataclass
class Replay:
    """What one policy at one cache size did over a trace: per layer picks, hits, admitted pairs and bytes."""
    policy: str
    slots: int
    windows: int
    picks: np.ndarray    # int64 [L]
    hits: np.ndarray     # int64 [L]
    copies: np.ndarray   # int64 [L]
    copied_bytes: np.ndarray  # int64 [L]

    def rows(self, per_layer: bool) -> list[dict]:
        def row(picks, hits, copies, nbytes, **extra):
            w = max(self.windows, 1)
            return {"policy": self.policy, "slots": self.slots, **extra,
                    "hit_rate": float(hits) / picks if picks else None,
                    "copied_bytes_per_window": float(nbytes) / w, "swaps_per_window": float(copies) / w}

        if not per_layer:
            return [row(self.picks.sum(), self.hits.sum(), self.copies.sum(), self.copied_bytes.sum())]
        return [row(self.picks[l], self.hits[l], self.copies[l], self.copied_bytes[l], layer=l)
                for l in range(len(self.picks))]


def replay(trace, kind: str, n_slots: int, profile=None, max_copy_bytes: int | None = None) -> Replay:
    """Serve the trace's windows in order from the slot table of the first n_slots pairs of the fill order (the
    profile's, or the default), the policy updating it between windows; every copy counted done by the next
    boundary (the engine's copies take a window)."""
    from .residency import fill_order, slot_table

    L, E = trace.n_layers, trace.n_expert
    table = slot_table(L, E, fill_order(L, E, profile), n_slots)
    policy = ResidencyPolicy(kind, table, trace.expert_bytes, max_copy_bytes)
    picks = np.zeros(L, np.int64)
    hits = np.zeros(L, np.int64)
    copies = np.zeros(L, np.int64)
    bounds = trace.window_bounds()
    for w in range(trace.n_windows):
        layer, expert = trace.layer[bounds[w]:bounds[w + 1]], trace.expert[bounds[w]:bounds[w + 1]]
        picks += np.bincount(layer, minlength=L)
        hits += np.bincount(layer[table[layer, expert] >= 0], minlength=L)
        policy.observe_picks(layer, expert)
        _, issued = policy.boundary()
        for c in issued:
            copies[c.layer] += 1
    return Replay(kind, n_slots, trace.n_windows, picks, hits, copies, copies * trace.expert_bytes)


class SlotFiller:
    """A policy run by an engine (the GPU engine's --expert-policy lru|lfu): boundary() before each window updates
    the slot table and plans a batch; copy(), once the window's last step was served (the host waits for the GPU's
    tail then: tiers/host.py TierHost.serve), has `device` copy the batch, so no copy sits before a window's launch.
    `device` (engine/gpu/residency_fill.py on the GPU, a simulation in the tests) provides:
      done() -> bool           the last batch of copies finished (True when none was issued)
      upload_table(table)      the engine's stream gets the table before the next window reads it
      copy_batch(copies)       the batch's bytes copied into their slots on a side stream (from the page-locked
                               store of a PCIe share, else gathered into page-locked staging first), not waited
                               for by any window; the next done() answers for it
    The copies of a batch land in slots no table entry names (their pairs were evicted at the boundary that planned
    it, before the window's table upload), and a pair enters the table only at a boundary where done() says its
    copy finished, so a window always reads whole experts. A batch planned but never copied (the window's launch
    failed: serve() and so copy() never ran) counts as not done: the next boundary changes nothing, the next copy()
    issues it."""

    def __init__(self, policy: ResidencyPolicy, device):
        self.policy, self.device = policy, device
        self.planned: list[Copy] = []  # the batch of the last boundary, not yet handed to the device

    def observe(self, layer: int, ids: np.ndarray) -> None:
        self.policy.observe(layer, ids)

    def reset(self) -> None:
        self.policy.reset()

    def boundary(self) -> dict:
        """Before a window (after the last one was served and committed): the stats of what changed. Nothing is
        copied here (before the window's launch): copy() does, after the window's last step."""
        done = not self.planned and self.device.done()
        activated, copies = self.policy.boundary(done)
        if activated or copies:
            self.device.upload_table(self.policy.table)
        if done:
            self.planned = copies
        nbytes = int(sum(int(self.policy.expert_bytes[c.layer]) for c in copies))
        return {"swaps": len(copies), "fill_bytes": nbytes, "fill_late": int(not done)}

    def copy(self) -> dict:
        """After the window's last step was served: the planned batch copied (on the calling thread, which runs the
        pool: the gather uses its team). The stats: the host's ms on it (the gather and the DMAs' issue)."""
        if not self.planned:
            return {"fill_gather_ms": 0.0}
        t0 = time.perf_counter()
        self.device.copy_batch(self.planned)
        self.planned = []
        return {"fill_gather_ms": (time.perf_counter() - t0) * 1e3}
