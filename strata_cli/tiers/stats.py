"""verify-bench columns of the expert tiers, of one engine or of each stage of the layer split (its own tiers):
per window size, the mean over the timed windows of the routed entries' VRAM / PCIe / CPU shares (the VRAM share
is the cache's hit rate), the --pcie-frac the windows used (their mean: auto moves it between windows), the MB a
window's PCIe share copies and its CPU share reads, where the window's time goes,
the tier floor, and an adaptive --expert-policy's swaps and MB copied into VRAM per window, the windows whose last
batch was still copying at their boundary (fill_late: nothing changed then), and the host's ms on the fills (fill
gather ms: the gather on the pool's team after the window's last step, and the DMAs' issue).

Where the time goes: the GPU's time in the flagB and flag waits (spin waits), the GPU computing (the window less
those waits), the host waiting for rings, planning each step (plan ms: the routed ids to the plan and its words,
flagA), issuing the PCIe share's DMAs from the page-locked store (copy issue ms: the driver calls, on the pool's
thread 0 in the native loop, the hand-off to the copy thread in the Python steps) and in the CPU pool (pool ms: the
call with its Python; pool C ms: the kernel's own wall time, pool wake ms: of it, until the OpenMP team's last
thread started), and the PCIe share's DMAs (copy GB/s: its bytes over the DMA time between the copy events; host
GB/s: both shares' bytes over the longer of pool ms and copy ms, what the pool and the DMAs read from host memory
together: on the H200 host at 2e31918 97-104 GB/s at 0 and 12 GiB from T = 2 on, against 93-114 for a plain
16-thread read, so a balanced window is bound by the host's memory, not by either path). The tier floor: the
all-resident window's floor (every byte it reads at the device copy rate, verify-bench's floor ms) plus the host
shares' time as tiers/share.py predicts it (the pool's share beside the DMAs' share) at the rates measured while the
engine was built with --pcie-frac auto, else at the pool's and the copy engine's constants (a lower bound)."""

from __future__ import annotations

import heapq
from collections import deque
from operator import itemgetter

import numpy as np

from .share import POOL_GBS, ShareRates, shares_ms

TIER_COLUMNS = [("vram_pairs", "VRAM pairs", ".1%"), ("vram_share", "VRAM", ".1%"), ("pcie_share", "PCIe", ".1%"),
                ("cpu_share", "CPU", ".1%"), ("pcie_frac", "pcie-frac", ".2f"), ("pcie_mb", "PCIe MB", ".2f"),
                ("cpu_mb", "CPU MB", ".2f"),
                ("gpu_ms", "GPU ms", ".3f"), ("wait_b_ms", "wait B ms", ".3f"),
                ("wait_flag_ms", "wait flag ms", ".3f"), ("host_ring_ms", "host ring ms", ".3f"),
                ("plan_ms", "plan ms", ".3f"), ("pool_ms", "pool ms", ".3f"), ("pool_kernel_ms", "pool C ms", ".3f"),
                ("pool_wake_ms", "pool wake ms", ".3f"), ("pool_gb_s", "pool GB/s", ".1f"),
                ("issue_ms", "copy issue ms", ".3f"),
                ("copy_ms", "copy ms", ".3f"), ("copy_gb_s", "copy GB/s", ".1f"), ("host_gb_s", "host GB/s", ".1f"),
                ("tier_floor_ms", "tier floor ms", ".3f"), ("swaps", "swaps", ".1f"), ("fill_mb", "fill MB", ".1f"),
                ("fill_late", "fill late", ".2f"), ("fill_gather_ms", "fill gather ms", ".3f")]


HISTORY_PER_T = 4096  # windows of one size T a tier host keeps (~1 KB each)


class WindowHistory:
    """The window_stats() of the windows a tier host served, in the order served: the last HISTORY_PER_T of each
    window size T, so a long-running engine's host memory stays flat (bench/soak.py: a list of every window grew
    ~1 KB a window) while verify-bench's means (the last -r windows of one T) see every timed window up to
    HISTORY_PER_T of them. A sequence: len, iteration, [i], truthiness, clear."""

    def __init__(self, per_t: int = HISTORY_PER_T):
        self.per_t = per_t
        self._by_t: dict[int, deque] = {}
        self._served = 0

    def append(self, row: dict) -> None:
        self._by_t.setdefault(row["T"], deque(maxlen=self.per_t)).append((self._served, row))
        self._served += 1

    def clear(self) -> None:
        self._by_t.clear()

    def __iter__(self):
        return (row for _, row in heapq.merge(*self._by_t.values(), key=itemgetter(0)))

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._by_t.values())

    def __getitem__(self, i):
        if i == -1 and self._by_t:
            return max((kept[-1] for kept in self._by_t.values() if kept), key=itemgetter(0))[1]
        return list(self)[i]


def _rate(nbytes: float, ms: float) -> float:
    return nbytes / 1e9 / (ms / 1e3) if ms > 0 else 0.0


def tier_floor_ms(all_resident_ms: float | None, cpu_bytes: float, pcie_bytes: float,
                  rates: ShareRates | None = None) -> float | None:
    """The all-resident window's floor plus the host shares' predicted time (tiers/share.shares_ms: the pool and the
    DMAs side by side) at the rates measured for --pcie-frac auto; without them POOL_GBS and PCIE_GBS (a lower
    bound)."""
    if all_resident_ms is None:
        return None
    return all_resident_ms + shares_ms(cpu_bytes, pcie_bytes, rates or ShareRates(POOL_GBS))[2]


def tier_means(tiers, host, T: int, n_windows: int, ms_mean: float, floor_ms: float | None) -> dict | None:
    """The columns of one engine's tiers, or of one stage's of the layer split (its own layers' pairs, steps and
    waits): the means over the last n_windows windows of T rows that `host` served. ms_mean: the mean time of
    those windows (the stage's part of them), floor_ms: their all-resident floor (None: not known). None when no
    window of T rows was served. The host keeps the last HISTORY_PER_T windows of each T (WindowHistory)."""
    rows = [h for h in host.history if h["T"] == T][-n_windows:]
    if not rows:
        return None

    def mean(key):  # a static cache's windows have no swaps
        return float(np.mean([h.get(key, 0.0) for h in rows]))

    t = tiers
    pool_ms, copy_ms = mean("pool_ms"), mean("copy_ms")
    cpu_bytes, pcie_bytes = mean("cpu_bytes"), mean("pcie_bytes")
    waits = mean("wait_b_ms") + mean("wait_flag_ms")
    # the share the windows used: --pcie-frac auto moves it between windows (tiers/share.ShareTuner)
    frac = float(np.mean([h["pcie_frac"] for h in rows])) if all("pcie_frac" in h for h in rows) else t.cfg.pcie_frac
    return dict(expert_cache=t.cfg.cache.text, pcie_frac=frac, tier_wait=t.cfg.wait,
                vram_pairs=float((t.stage_table() >= 0).mean()), vram_share=mean("vram_share"),
                pcie_share=mean("pcie_share"), cpu_share=mean("cpu_share"), gpu_ms=max(ms_mean - waits, 0.0),
                wait_b_ms=mean("wait_b_ms"), wait_flag_ms=mean("wait_flag_ms"), host_ring_ms=mean("host_wait_ms"),
                plan_ms=mean("plan_ms"), pool_ms=pool_ms, pool_kernel_ms=mean("pool_kernel_ms"),
                pool_wake_ms=mean("pool_wake_ms"), pool_gb_s=_rate(cpu_bytes, pool_ms), issue_ms=mean("issue_ms"),
                copy_ms=copy_ms, copy_gb_s=_rate(pcie_bytes, copy_ms),
                host_gb_s=_rate(cpu_bytes + pcie_bytes, max(pool_ms, copy_ms)), pcie_mb=pcie_bytes / 1e6,
                cpu_mb=cpu_bytes / 1e6,
                tier_floor_ms=tier_floor_ms(floor_ms, cpu_bytes, pcie_bytes, t.cfg.rates), expert_policy=t.cfg.policy,
                swaps=mean("swaps"), fill_mb=mean("fill_bytes") / 1e6, fill_late=mean("fill_late"),
                fill_gather_ms=mean("fill_gather_ms"))


def add_tier_stats(records, engine, n_windows: int) -> None:
    """records: BenchRecord per window size; their `tiers` dict gets the means of the last n_windows windows."""
    for rec in records:
        stats = tier_means(engine.tiers, engine.tier_host, rec.window, n_windows, rec.ms_mean, rec.floor_ms)
        if stats is not None:
            rec.tiers = stats


def add_stage_tier_stats(records, stages, n_windows: int) -> None:
    """The layer split: each tiered stage's columns (tier_means over its own tier host) as the `tiers` dict of that
    stage's row of each record (rec.stages, filled first with the stage's ms_mean and read_bytes: its floor)."""
    for rec in records:
        for row, stage in zip(rec.stages, stages):
            if stage.tiers is None:  # its experts all fit: no tiers, no columns
                continue
            floor = row["read_bytes"] / rec.copy_bytes_per_s * 1e3 if rec.copy_bytes_per_s else None
            stats = tier_means(stage.tiers, stage.tier_host, rec.window, n_windows, row["ms_mean"], floor)
            if stats is not None:
                row["tiers"] = stats
