"""verify-bench columns of the expert tiers: per window size, the mean over the timed windows of the routed
entries' VRAM / PCIe / CPU shares (the VRAM share is the cache's hit rate), the GPU's time in the flagB and flag
waits (spin waits), the host's time waiting for rings and in the CPU pool, and an adaptive --expert-policy's swaps
and MB copied into VRAM per window."""

from __future__ import annotations

import numpy as np

TIER_COLUMNS = [("vram_pairs", "VRAM pairs", ".1%"), ("vram_share", "VRAM", ".1%"), ("pcie_share", "PCIe", ".1%"),
                ("cpu_share", "CPU", ".1%"), ("wait_b_ms", "wait B ms", ".3f"), ("wait_flag_ms", "wait flag ms", ".3f"),
                ("host_ring_ms", "host ring ms", ".3f"), ("pool_ms", "pool ms", ".3f"),
                ("pool_gb_s", "pool GB/s", ".1f"), ("swaps", "swaps", ".1f"), ("fill_mb", "fill MB", ".1f")]


def add_tier_stats(records, engine, n_windows: int) -> None:
    """records: BenchRecord per window size; their `tiers` dict gets the means of the last n_windows windows."""
    t, history = engine.tiers, engine.tier_host.history
    vram_pairs = float((t.table_host >= 0).mean())
    for rec in records:
        rows = [h for h in history if h["T"] == rec.window][-n_windows:]
        if not rows:
            continue

        def mean(key):  # a static cache's windows have no swaps
            return float(np.mean([h.get(key, 0) for h in rows]))

        pool_ms = mean("pool_ms")
        rec.tiers = dict(expert_cache=t.cfg.cache.text, pcie_frac=t.cfg.pcie_frac, split=t.cfg.split,
                         tier_wait=t.cfg.wait, vram_pairs=vram_pairs, vram_share=mean("vram_share"),
                         pcie_share=mean("pcie_share"), cpu_share=mean("cpu_share"), wait_b_ms=mean("wait_b_ms"),
                         wait_flag_ms=mean("wait_flag_ms"), host_ring_ms=mean("host_wait_ms"), pool_ms=pool_ms,
                         pool_gb_s=mean("cpu_bytes") / 1e9 / (pool_ms / 1e3) if pool_ms > 0 else 0.0,
                         pcie_mb=mean("pcie_bytes") / 1e6, cpu_mb=mean("cpu_bytes") / 1e6,
                         expert_policy=t.cfg.policy, swaps=mean("swaps"), fill_mb=mean("fill_bytes") / 1e6,
                         fill_late=mean("fill_late"))
