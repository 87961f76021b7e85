"""verify-bench columns of the expert tiers: per window size, the mean over the timed windows of the routed
entries' VRAM / PCIe / CPU shares (the VRAM share is the cache's hit rate), where the window's time goes, the tier
floor, and an adaptive --expert-policy's swaps and MB copied into VRAM per window.

Where the time goes: the GPU's time in the flagB and flag waits (spin waits), the GPU computing (the window less
those waits), the host waiting for rings and in the CPU pool, and the PCIe share's host gather and DMAs (copy GB/s:
its bytes over the DMA time between the copy events). The tier floor: the all-resident window's floor (every byte it
reads at the device copy rate, verify-bench's floor ms) plus the longer of the two host shares, which overlap: the
CPU-share bytes at the pool's measured rate and the PCIe bytes at the copy engine's (tiers/share.py's rates)."""

from __future__ import annotations

import numpy as np

from .share import PCIE_GBS, POOL_GBS

TIER_COLUMNS = [("vram_pairs", "VRAM pairs", ".1%"), ("vram_share", "VRAM", ".1%"), ("pcie_share", "PCIe", ".1%"),
                ("cpu_share", "CPU", ".1%"), ("gpu_ms", "GPU ms", ".3f"), ("wait_b_ms", "wait B ms", ".3f"),
                ("wait_flag_ms", "wait flag ms", ".3f"), ("host_ring_ms", "host ring ms", ".3f"),
                ("pool_ms", "pool ms", ".3f"), ("pool_gb_s", "pool GB/s", ".1f"), ("gather_ms", "gather ms", ".3f"),
                ("copy_ms", "copy ms", ".3f"), ("copy_gb_s", "copy GB/s", ".1f"),
                ("tier_floor_ms", "tier floor ms", ".3f"), ("swaps", "swaps", ".1f"), ("fill_mb", "fill MB", ".1f")]


def _rate(nbytes: float, ms: float) -> float:
    return nbytes / 1e9 / (ms / 1e3) if ms > 0 else 0.0


def tier_floor_ms(all_resident_ms: float | None, cpu_bytes: float, pcie_bytes: float,
                  pool_gbs: float = POOL_GBS, pcie_gbs: float = PCIE_GBS) -> float | None:
    """The all-resident window's floor plus the longer of the overlapping CPU and PCIe shares at their rates."""
    if all_resident_ms is None:
        return None
    return all_resident_ms + max(cpu_bytes / (pool_gbs * 1e6), pcie_bytes / (pcie_gbs * 1e6))


def add_tier_stats(records, engine, n_windows: int) -> None:
    """records: BenchRecord per window size; their `tiers` dict gets the means of the last n_windows windows."""
    t, history = engine.tiers, engine.tier_host.history
    vram_pairs = float((t.table_host >= 0).mean())
    for rec in records:
        rows = [h for h in history if h["T"] == rec.window][-n_windows:]
        if not rows:
            continue

        def mean(key):  # a static cache's windows have no swaps
            return float(np.mean([h.get(key, 0.0) for h in rows]))

        pool_ms, copy_ms = mean("pool_ms"), mean("copy_ms")
        cpu_bytes, pcie_bytes = mean("cpu_bytes"), mean("pcie_bytes")
        waits = mean("wait_b_ms") + mean("wait_flag_ms")
        rec.tiers = dict(expert_cache=t.cfg.cache.text, pcie_frac=t.cfg.pcie_frac, split=t.cfg.split,
                         tier_wait=t.cfg.wait, vram_pairs=vram_pairs, vram_share=mean("vram_share"),
                         pcie_share=mean("pcie_share"), cpu_share=mean("cpu_share"),
                         gpu_ms=max(rec.ms_mean - waits, 0.0), wait_b_ms=mean("wait_b_ms"),
                         wait_flag_ms=mean("wait_flag_ms"), host_ring_ms=mean("host_wait_ms"), pool_ms=pool_ms,
                         pool_gb_s=_rate(cpu_bytes, pool_ms), gather_ms=mean("gather_ms"), copy_ms=copy_ms,
                         copy_gb_s=_rate(pcie_bytes, copy_ms), pcie_mb=pcie_bytes / 1e6, cpu_mb=cpu_bytes / 1e6,
                         tier_floor_ms=tier_floor_ms(rec.floor_ms, cpu_bytes, pcie_bytes),
                         expert_policy=t.cfg.policy, swaps=mean("swaps"), fill_mb=mean("fill_bytes") / 1e6,
                         fill_late=mean("fill_late"))
