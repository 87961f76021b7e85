"""Choosing the residency of a GPU engine's expert tiers before any upload: --expert-cache, --pcie-frac auto
resolved (the pool timed here; a share of 0 makes no page-locked store at all), and whether the engine needs the
doorbell graph at all (engine/gpu/tiers.py attaches the tiers after).

--expert-cache auto keeps what fits: device memory free before loading, less the dense weights, the arena
(KV cache, window buffers, staging slots) and a margin, filled with the ranked (layer, expert) pairs.
"""

from __future__ import annotations

import dataclasses

from ..gpu.runtime import cupy
from ..model.names import PLE_TABLE
from .config import TierConfig
from .residency import choose_residency, is_expert_tensor
from .share import AUTO, ShareRates, auto_window_bytes, probe_pool_gbs, resolve_pcie_frac


def _dense_bytes(model, layers: tuple[int, int]) -> int:
    """The dense weights of layers [lo, hi) and every tensor outside the blocks (an upper bound for a stage, which
    holds the embedding / head / PLE table only where it starts / ends / holds the PLE layer)."""
    lo, hi = layers
    names = list(model.specs) + ([PLE_TABLE] if model.geometry.ple is not None else [])
    return sum(model.info(n).n_bytes for n in names if not is_expert_tensor(n)
               and (not n.startswith("blk.") or lo <= int(n.split(".")[1]) < hi))


def _staging_bytes(model, cfg: TierConfig, max_t: int, layers: tuple[int, int]) -> int:
    if cfg.pcie_frac <= 0:
        return 0
    g = model.geometry
    q = min(g.n_expert, max_t * g.n_expert_used)
    per = [max(model.info(f"blk.{layer}.ffn_{p}_exps.weight").n_bytes // g.n_expert for layer in range(*layers))
           for p in ("gate", "up", "down")]
    return q * sum(per)


def resolved_config(cfg: TierConfig, frac: float, auto: bool, rates) -> TierConfig:
    """cfg with --pcie-frac resolved to frac; auto's rates and share_auto kept only for a share > 0."""
    keep = auto and frac > 0
    return dataclasses.replace(cfg, pcie_frac=frac, share_auto=keep, rates=rates if keep else None)


def residency_for(model, cfg: TierConfig | None, arena_bytes: int, max_t: int,
                  layers: tuple[int, int] | None = None):
    """(residency table [L, E] or None when every expert of the engine's layers stays in VRAM on today's graph, the
    line(s) to print, the config with --pcie-frac auto resolved to a number). arena_bytes: the engine's window
    buffers and KV cache. layers [lo, hi): a stage of the layer split (its own budget over its own layers,
    choose_residency); None: every layer."""
    if cfg is None:
        return None, None, None
    stall = cfg.stall_window
    span = (0, model.geometry.n_layers) if layers is None else (int(layers[0]), int(layers[1]))
    auto = cfg.pcie_frac == AUTO
    # auto: the pool timed on the model's experts (no host gather: the PCIe experts are DMA'd from their page-locked
    # store, engine/gpu/expert_store.py; the DMA is measured once the store exists, rebalance_share)
    rates = ShareRates(probe_pool_gbs(model)) if auto else None
    frac, pcie_note = resolve_pcie_frac(cfg.pcie_frac, rates, auto_window_bytes(model, span) if auto else None)
    # a share of 0 from auto is the config --pcie-frac 0 makes: nothing of the probes rides on (no rebalance, no
    # floor from the probe's rates), so the engine built from it is the one --pcie-frac 0 builds
    cfg = resolved_config(cfg, frac, auto, rates)
    free = None
    fixed = _dense_bytes(model, span) + arena_bytes + _staging_bytes(model, cfg, max_t, span)
    if cfg.cache.kind == "auto":
        free = int(cupy().cuda.runtime.memGetInfo()[0])
    table, note = choose_residency(model, cfg, free, fixed, layers)
    held = table[span[0]:span[1]] >= 0
    if cfg.profile is None and cfg.loaded_profile is None and cfg.policy == "static" and not cfg.counting \
            and held.any() and not held.all():
        # a partial static cache without a profile is a fixed set chosen by nothing the text does: say so
        from ..report.present import warn

        warn(f"--expert-cache {cfg.cache.text} without --expert-profile: the VRAM cache holds each layer's lowest "
             "expert ids, not the experts a text routes to; make a profile of text like yours (strata make-profile "
             "MODEL --text-file F -o P) and pass --expert-profile P, or let the cache follow the text "
             "(--expert-policy lru)")
    if cfg.policy != "static" and cfg.max_copy is None:  # the fill path's default, at auto's rates where measured
        from .cache_policy import default_max_copy
        from .residency import expert_bytes

        rows = table[span[0]:span[1]]
        cache_bytes = int(((rows >= 0).sum(axis=1) * expert_bytes(model)[span[0]:span[1]]).sum())
        cfg = dataclasses.replace(cfg, max_copy=default_max_copy(cache_bytes, rates))
    if held.all() and not stall:
        return None, note + " -> zero-doorbell graph", cfg
    if held.all():
        note += f" -> doorbell graph (stall window {stall})"
    return table, f"{note}; {pcie_note}", cfg
