"""Choosing and attaching the expert tiers of a GPU engine: residency before any upload, buffers before the arena
is allocated, the host server after.

--expert-cache auto keeps what fits: device memory free before loading, less the dense weights, the arena
(KV cache, window buffers, staging slots) and a margin, filled with the ranked (layer, expert) pairs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...gpu.runtime import cupy
from ...model.names import PLE_TABLE
from ...tiers.share import AUTO, parse_pcie_frac, probe_pool_gbs, resolve_pcie_frac
from .buffers import ALIGN, plan_buffers
from ...tiers.doorbell import stall_window
from .tiers import ExpertTiers, TierConfig, choose_residency, is_expert_tensor


def _dense_bytes(model) -> int:
    names = list(model.specs) + ([PLE_TABLE] if model.geometry.ple is not None else [])
    return sum(model.info(n).n_bytes for n in names if not is_expert_tensor(n))


def _arena_bytes(arena) -> int:
    return sum(-(-max(int(np.prod(shape)) * dtype.itemsize, 1) // ALIGN) * ALIGN for _, shape, dtype in arena.specs)


def _staging_bytes(model, cfg: TierConfig, max_t: int) -> int:
    if cfg.pcie_frac <= 0:
        return 0
    g = model.geometry
    q = min(g.n_expert, max_t * g.n_expert_used)
    per = [max(model.info(f"blk.{layer}.ffn_{p}_exps.weight").n_bytes // g.n_expert for layer in range(g.n_layers))
           for p in ("gate", "up", "down")]
    return (2 if cfg.split else 1) * q * sum(per)


def residency_for(model, cfg: TierConfig | None, n_ctx: int, max_t: int):
    """(residency table [L, E] or None when every expert stays in VRAM on today's graph, the line(s) to print, the
    config with --pcie-frac auto resolved to a number)."""
    stall = stall_window()
    if cfg is None and not stall:
        return None, None, None
    cfg = cfg or TierConfig()
    pool_gbs = probe_pool_gbs(model) if parse_pcie_frac(cfg.pcie_frac) == AUTO else None
    frac, pcie_note = resolve_pcie_frac(cfg.pcie_frac, pool_gbs)
    cfg = dataclasses.replace(cfg, pcie_frac=frac)
    free = None
    fixed = _dense_bytes(model) + _arena_bytes(plan_buffers(model.geometry, n_ctx, max_t)) \
        + _staging_bytes(model, cfg, max_t)
    if str(cfg.cache).strip().lower() == "auto":
        free = int(cupy().cuda.runtime.memGetInfo()[0])
    table, note = choose_residency(model, cfg, free, fixed)
    if (table >= 0).all() and not stall:
        return None, note + " -> zero-doorbell graph", cfg
    if (table >= 0).all():
        note += f" -> doorbell graph ({'STRATA_TEST_VERIFY_STALL'}={stall})"
    return table, f"{note}; {pcie_note}", cfg


def attach_tiers(engine, table: np.ndarray, cfg: TierConfig, pack_q8: bool) -> None:
    """Upload the resident experts, add the tier buffers to the engine's arena (before it is allocated) and make
    the host server; engine.tiers.bind(buf) follows the allocation."""
    from ...tiers.prefault import prefault_experts
    from .tier_host import TierHost

    engine.tiers = ExpertTiers(engine, table, cfg, pack_q8)
    prefault_experts(model=engine.model, table=table)  # the CPU / PCIe shares read these pages: no window faults them
    engine.tiers.add_buffers(engine.arena)
    engine.tier_host = TierHost(engine.tiers, engine, stall_window())
