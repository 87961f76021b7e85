"""`--pcie-frac auto|F`: the share of each step's distinct VRAM misses copied over PCIe, the CPU pool computing the rest.

auto balances the two streams: a miss share f over PCIe takes f·B/pcie_rate, the rest (1-f)·B/pool_rate; both end
together at f = pcie_rate / (pcie_rate + pool_rate). Both rates are measured on the model's own experts while the
engine is built: the pool's at setup (probe_pool_gbs: a few experts of layer 0, their pages brought in first, so it
times the pool and not page faults; its block types set it, 2.8 to 80 GB/s on the H200 host), the PCIe copy path's
once the staging buffers exist (engine/gpu/tiers.rebalance_share: up to one step's worth of experts gathered from
the mapping into the pinned staging buffers and copied to the device, the rate of the two in a row, as a step runs
them). Until the copy path is measured the share uses PCIE_GBS. Neither probe sees the two sharing the host's memory
bandwidth in a window: verify-bench's pool GB/s and copy GB/s columns show the rates under load.
    PCIE_GBS  51 GB/s  cudaMemcpyAsync host -> device from pinned memory (docs/gpu-toolchain-notes.md §7)
    POOL_GBS  77.7 GB/s  the CPU pool on Q8_0 experts, 16 cores (docs/BENCHMARKS.md): the rate without a probe
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import OptionError

PCIE_GBS = 51.0
POOL_GBS = 77.7
AUTO = "auto"
# --pcie-frac when not given: the CPU pool alone, until auto is measured to win on the full-size file
# (bench/tiers_device.sh: pcie_auto's ms_median below pcie_0's at every T); then AUTO here is the whole change
DEFAULT_PCIE_FRAC: float | str = 0.0
PROBE_EXPERTS = 32   # experts of layer 0 the pool probe computes (one row each), at most
PROBE_REPEATS = 3    # the best of these is the rate


def balanced_pcie_frac(pcie_gbs: float = PCIE_GBS, pool_gbs: float = POOL_GBS) -> float:
    """The share whose copies take as long as the pool's rest: pcie / (pcie + pool)."""
    if not (pcie_gbs >= 0 and pool_gbs >= 0) or pcie_gbs + pool_gbs <= 0:
        raise ValueError(f"rates must be >= 0 and not both 0 (PCIe {pcie_gbs}, pool {pool_gbs})")
    return pcie_gbs / (pcie_gbs + pool_gbs)


def parse_pcie_frac(text) -> float | str:
    """'auto' or a number in [0, 1] (the CLI's --pcie-frac and TierConfig.pcie_frac)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        if raw.lower() == AUTO:
            return AUTO
        try:
            value = float(raw)
        except ValueError:
            raise OptionError(f"--pcie-frac {raw!r}: expected auto or a share between 0 and 1") from None
    if not 0.0 <= value <= 1.0:
        raise OptionError(f"--pcie-frac {text!r}: expected auto or a share between 0 and 1")
    return value


def probe_pool_gbs(model, pool=None, repeats: int = PROBE_REPEATS) -> float:
    """The CPU pool's rate (GB/s of expert weights) on up to PROBE_EXPERTS experts of layer 0, one row each, the
    best of `repeats`; their pages are brought in first (tiers/prefault.py)."""
    from .plan import build_plan
    from .pool import ExpertPool
    from .prefault import expert_spans, page_pieces, prefault

    g = model.geometry
    E, K = g.n_expert, g.n_expert_used
    rows = max(1, min(PROBE_EXPERTS, E) // K)
    table = np.zeros((1, E), dtype=np.int32)
    table[0, :rows * K] = -1
    prefault(page_pieces(expert_spans(model, table)))
    pool = pool or ExpertPool(model)
    plan = build_plan(0, np.arange(rows * K, dtype=np.int64).reshape(rows, K), table[0], 0.0).cpu
    x = (np.random.default_rng(0).standard_normal((rows, g.n_embd)) * 0.1).astype(np.float32)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        pool.compute(0, x, plan)
        best = min(best, time.perf_counter() - t0)
    return plan.n_groups * pool.expert_bytes(0) / 1e9 / max(best, 1e-9)


def resolve_pcie_frac(parsed: float | str, pool_gbs: float | None = None, copy_gbs: float | None = None,
                      copy_detail: str = "") -> tuple[float, str]:
    """(the share to use, the line saying what was chosen) of a parsed --pcie-frac (TierConfig.pcie_frac). For auto:
    pool_gbs the pool's measured rate (None: the constant POOL_GBS), copy_gbs the PCIe copy path's (None: the
    constant PCIE_GBS; copy_detail says how it was measured)."""
    if parsed == AUTO:
        pool = POOL_GBS if pool_gbs is None else pool_gbs
        pcie = PCIE_GBS if copy_gbs is None else copy_gbs
        frac = balanced_pcie_frac(pcie, pool)
        source = "constant" if pool_gbs is None else "measured on this model's experts"
        copy = f"copy engine {PCIE_GBS:g} GB/s" if copy_gbs is None else \
            f"PCIe copy path {pcie:.1f} GB/s measured{f' ({copy_detail})' if copy_detail else ''}"
        return frac, (f"PCIe share: {frac:.2f} of each layer's distinct misses over PCIe, the rest on the CPU pool "
                      f"(--pcie-frac auto: {copy}, CPU pool {pool:.1f} GB/s {source}, both streams end together)")
    return parsed, f"PCIe share: {parsed:g} of each layer's distinct misses over PCIe (--pcie-frac {parsed:g})"


def path_gbs(nbytes: int, gather_s: float, dma_s: float) -> tuple[float, float, float]:
    """(the copy path's, the gather's, the DMA's GB/s) of nbytes gathered in gather_s then copied in dma_s: a step
    runs the two one after the other on the copy thread, so the path's time is their sum."""
    rate = lambda s: nbytes / 1e9 / s if s > 0 else float("inf")  # noqa: E731
    return rate(gather_s + dma_s), rate(gather_s), rate(dma_s)
