"""`--pcie-frac auto|F`: the share of each step's distinct VRAM misses copied over PCIe, the CPU pool computing the rest.

What a share f costs (B bytes of distinct misses in a window; one model, window_ms): the PCIe experts are gathered
from the mapping into pinned staging on the host's cores (engine/gpu/pcie_stage.py: on the pool's own OpenMP team,
before the step's pool call), and only then copied by the copy engine (DMA), which runs beside the pool. So
    host  = (1-f)·B / pool + f·B / gather     the host's cores and memory bandwidth do both, one after the other
    pcie  = f·B / gather + f·B / dma          a step's DMA starts once its gather is done
    tier  = max(host, pcie)
auto picks the f of [0, 1] (steps of 0.01) with the least predicted tier time, and 0 unless that beats f = 0 by
AUTO_MIN_GAIN. With gather <= pool no f > 0 can win (the host pays f·B/gather for f·B/pool saved); with gather > pool
the best f is where host and pcie meet, dma / (dma + pool) (with no gather at all, a mapping registered in place,
that is the old balance rule). The older rule, f = pcie / (pcie + pool) on the gather-then-DMA path's rate,
took the two streams as independent and chose 0.21 on the H200 host (gather 17.9, DMA 54.7, pool 52.0 GB/s), which
ran at 84.8 / 449 ms at T = 1 / 8 against 42.4 / 170 at 0 (#17).
The rates are measured on the model's own experts while the engine is built: the pool's and the gather's at setup
(probe_pool_gbs, probe_gather_gbs: the same experts of layer 0, their pages brought in first, on the pool's team), the
DMA's (and the gather again, into the real pinned buffers) once the staging buffers exist
(engine/gpu/tiers.rebalance_share). Until the DMA is measured it is PCIE_GBS; when auto chooses 0 at setup no
staging is made and the DMA is never measured (no DMA rate makes a share win while gather <= pool). What the model
leaves out: the DMA's reads of host memory beside the pool, the copy thread's hand-offs and the flagB waits (the
margin AUTO_MIN_GAIN stands for them); verify-bench's pool GB/s, gather ms and copy GB/s show the rates under load.
    PCIE_GBS  51 GB/s  cudaMemcpyAsync host -> device from pinned memory (docs/gpu-toolchain-notes.md §7)
    POOL_GBS  77.7 GB/s  the CPU pool on Q8_0 experts, 16 cores (docs/BENCHMARKS.md): the tier floor's rate without a probe
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError

PCIE_GBS = 51.0
POOL_GBS = 77.7
AUTO = "auto"
# --pcie-frac when not given: the CPU pool alone, until auto is measured not to lose to it on the full-size file
# (bench/tiers_device.sh: pcie_auto's ms_median at or below pcie_0's at every T); then AUTO here is the whole change
DEFAULT_PCIE_FRAC: float | str = 0.0
# a share > 0 only where it is predicted >= 10 % faster than 0: what the model leaves out cost more than that before
# (the H200 host at 0.25 / 0.5, T = 1: 82.7 / 133 ms measured against 60 / 79 this model gives its rates)
AUTO_MIN_GAIN = 0.10
AUTO_STEP = 0.01      # the shares auto compares: 0, 0.01, ..., 1
PROBE_EXPERTS = 32    # experts of layer 0 the probes compute / gather (one row each), at most
PROBE_REPEATS = 3     # the best of these is the rate
REPORT_FRACS = (0.25, 0.5, 1.0)  # the shares whose predicted times the auto line also prints (tiers_device.sh runs them)


@dataclass(frozen=True)
class ShareRates:
    """GB/s of expert bytes: the CPU pool, the host gather into pinned staging (inf: none, the mapping registered
    in place), the DMA host -> device; dma_measured False: PCIE_GBS stands in."""
    pool_gbs: float
    gather_gbs: float
    dma_gbs: float = PCIE_GBS
    dma_measured: bool = False

    def __post_init__(self):
        for name in ("pool_gbs", "gather_gbs", "dma_gbs"):
            value = getattr(self, name)
            if not value > 0:  # also NaN
                raise ValueError(f"{name} must be > 0 (got {value})")


def shares_ms(cpu_bytes: float, pcie_bytes: float, rates: ShareRates) -> tuple[float, float, float]:
    """(host ms, PCIe path ms, predicted tier ms) of cpu_bytes on the pool and pcie_bytes over PCIe (the module
    docstring's model)."""
    ms = lambda nbytes, gbs: nbytes / (gbs * 1e6) if math.isfinite(gbs) else 0.0  # noqa: E731
    gather = ms(pcie_bytes, rates.gather_gbs)
    host = ms(cpu_bytes, rates.pool_gbs) + gather
    pcie = gather + ms(pcie_bytes, rates.dma_gbs)
    return host, pcie, max(host, pcie)


def window_ms(frac: float, nbytes: float, rates: ShareRates) -> tuple[float, float, float]:
    """shares_ms of nbytes of distinct misses at share frac."""
    return shares_ms((1.0 - frac) * nbytes, frac * nbytes, rates)


def best_pcie_frac(rates: ShareRates, min_gain: float = AUTO_MIN_GAIN, step: float = AUTO_STEP) -> float:
    """The share with the least predicted tier time (window_ms), 0 unless it beats 0 by min_gain."""
    fracs = np.round(np.arange(0.0, 1.0 + step / 2, step), 6)
    times = [window_ms(float(f), 1e9, rates)[2] for f in fracs]
    i = int(np.argmin(times))  # the first minimum: the smallest share of equal time
    return float(fracs[i]) if times[i] < (1.0 - min_gain) * times[0] else 0.0


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


def _probe_experts(model):
    """(rows, expert ids, the one-layer residency row) of the probes: up to PROBE_EXPERTS experts of layer 0, K a row,
    their pages brought in (tiers/prefault.py)."""
    from .prefault import expert_spans, page_pieces, prefault

    g = model.geometry
    E, K = g.n_expert, g.n_expert_used
    rows = max(1, min(PROBE_EXPERTS, E) // K)
    table = np.zeros((1, E), dtype=np.int32)
    table[0, :rows * K] = -1
    prefault(page_pieces(expert_spans(model, table)))
    return rows, np.arange(rows * K, dtype=np.int64), table[0]


def probe_pool_gbs(model, pool=None, repeats: int = PROBE_REPEATS) -> float:
    """The CPU pool's rate (GB/s of expert weights) on up to PROBE_EXPERTS experts of layer 0, one row each, the
    best of `repeats`; their pages are brought in first (tiers/prefault.py)."""
    from .plan import build_plan
    from .pool import ExpertPool

    rows, experts, row = _probe_experts(model)
    pool = pool or ExpertPool(model)
    plan = build_plan(0, experts.reshape(rows, -1), row, 0.0).cpu
    x = (np.random.default_rng(0).standard_normal((rows, model.geometry.n_embd)) * 0.1).astype(np.float32)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        pool.compute(0, x, plan)
        best = min(best, time.perf_counter() - t0)
    return plan.n_groups * pool.expert_bytes(0) / 1e9 / max(best, 1e-9)


def probe_gather_gbs(model, team=None, repeats: int = PROBE_REPEATS) -> float:
    """The PCIe share's host gather's rate (GB/s) on the pool probe's experts (all three projections, into a plain
    buffer: pinned memory is written at the same rate), as a step runs it: tiers/gather.gather_rows on
    the pool's team (team: (native library, threads), default tiers/pool.gather_team()), the best of `repeats`."""
    from .gather import expert_bytes_view, gather_rows
    from .pool import gather_team
    from .residency import expert_names

    _, experts, _ = _probe_experts(model)
    lib, threads = team or gather_team()
    E = model.geometry.n_expert
    srcs = [expert_bytes_view(model.info(name).raw, E) for name in expert_names(0)]
    outs = [np.full((len(experts), src.shape[1]), 1, np.uint8) for src in srcs]  # written now: no faults timed
    nbytes = sum(out.nbytes for out in outs)
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        gather_rows(lib, threads, outs, srcs, experts.astype(np.intp))
        best = min(best, time.perf_counter() - t0)
    return nbytes / 1e9 / max(best, 1e-9)


def auto_window_bytes(model, layers: tuple[int, int]) -> int:
    """The distinct misses of a T = 1 window with every routed expert missed (cache 0): K experts of every layer of
    [lo, hi) (the window the auto line's predicted times are for)."""
    from .residency import expert_bytes

    return int(model.geometry.n_expert_used * expert_bytes(model)[layers[0]:layers[1]].sum())


def _fmt(f: float) -> str:
    return f"{f:g}"


def auto_note(frac: float, rates: ShareRates, window_bytes: int | None) -> str:
    """The auto line's parenthesis: the rates, and the predicted times at 0, the chosen share and REPORT_FRACS."""
    gather = ("with no host gather" if not math.isfinite(rates.gather_gbs) else
              f"and gather {rates.gather_gbs:.1f} GB/s, one after the other on the host's cores")
    dma = f"DMA {rates.dma_gbs:.1f} GB/s {'measured' if rates.dma_measured else '(constant, not measured)'}"
    text = f"--pcie-frac auto: CPU pool {rates.pool_gbs:.1f} GB/s {gather}; {dma}, beside the pool"
    if window_bytes:
        at = lambda f: window_ms(f, window_bytes, rates)[2]  # noqa: E731
        chosen = " (chosen)" if frac == 0.0 else f", {at(frac):.1f} at the chosen {_fmt(frac)}"
        others = ", ".join(f"{at(f):.1f} at {_fmt(f)}" for f in REPORT_FRACS)
        text += (f"; predicted tier ms of a T = 1 window missing every routed expert ({window_bytes / 1e9:.2f} GB): "
                 f"{at(0.0):.1f} at 0{chosen}; {others}")
    if frac == 0.0:
        text += ("; PCIe loses here (the gather costs the host more than the pool it saves)" if
                 rates.gather_gbs <= rates.pool_gbs else
                 f"; no share is predicted {AUTO_MIN_GAIN:.0%} faster than 0")
    return text


def resolve_pcie_frac(parsed: float | str, rates: ShareRates | None = None,
                      window_bytes: int | None = None) -> tuple[float, str]:
    """(the share to use, the line saying what was chosen) of a parsed --pcie-frac (TierConfig.pcie_frac). For auto:
    rates the measured ones (required), window_bytes the T = 1 all-miss window the line predicts times for."""
    if parsed == AUTO:
        if rates is None:
            raise ValueError("--pcie-frac auto needs the measured rates")
        frac = best_pcie_frac(rates)
        where = "over PCIe, the rest on the CPU pool" if frac > 0 else "over PCIe: the CPU pool computes them all"
        return frac, f"PCIe share: {_fmt(frac)} of each layer's distinct misses {where} ({auto_note(frac, rates, window_bytes)})"
    return parsed, f"PCIe share: {parsed:g} of each layer's distinct misses over PCIe (--pcie-frac {parsed:g})"


def path_gbs(nbytes: int, gather_s: float, dma_s: float) -> tuple[float, float, float]:
    """(the copy path's, the gather's, the DMA's GB/s) of nbytes gathered in gather_s then copied in dma_s: a step
    runs the two one after the other, so the path's time is their sum."""
    rate = lambda s: nbytes / 1e9 / s if s > 0 else float("inf")  # noqa: E731
    return rate(gather_s + dma_s), rate(gather_s), rate(dma_s)
