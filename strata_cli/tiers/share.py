"""`--pcie-frac auto|F`: the share of each step's distinct VRAM misses copied over PCIe, the CPU pool computing the rest.

What a share f costs (B bytes of distinct misses in a window; one model, window_ms): the PCIe experts are DMA'd by the
copy engine straight from their page-locked store (engine/gpu/expert_store.py) while the CPU pool computes the rest
on the host's cores (all but one, which issues the copies: tiers/host.ExpertSource.leave_core). So
    host  = (1-f)·B / pool
    pcie  = f·B / dma
    tier  = max(host, pcie)
auto picks the f of [0, 1] (steps of 0.01) with the least predicted tier time, and 0 unless that beats f = 0 by
AUTO_MIN_GAIN: where host and pcie meet, dma / (dma + pool). The earlier PCIe path (each step's PCIe experts gathered
from the mapping into pinned staging on the pool's team, then DMA'd: host = (1-f)·B/pool + f·B/gather) lost to the
pool alone at every share: gather 17.9-61 GB/s against the pool's 52 on the H200 host (#17).
The rates are measured on the model's own experts while the engine is built: the pool's at setup (probe_pool_gbs:
experts of layer 0, their pages brought in first, on the pool's team), the DMA's from the store once it exists
(engine/gpu/tiers.rebalance_share). Until the DMA is measured it is PCIE_GBS. What the model leaves out: the DMA's
reads of host memory beside the pool, the copy thread's hand-offs and the flagB waits (the margin AUTO_MIN_GAIN stands
for them); verify-bench's pool GB/s and copy GB/s show the rates under load.
auto keeps balancing once windows run (ShareTuner): the rates a window's pool and DMAs reach differ from the load's
probes (the full-size file at 3b06801, T = 8: the pool 45.6-61.5 GB/s in the windows against 63-64 probed, the DMA
39-41 against 45; one load's pool probe read 3.5 GB/s and sent 0.93 of the misses over PCIe), so after each window
the share of that window size moves to where the window's own rates balance the two (docs/BENCHMARKS.md,
2026-12-03: the pool 62.5 ms against the copies' 54.2 at 12 GiB, 64.8 against 77.9 at cache 0).
    PCIE_GBS  51 GB/s  cudaMemcpyAsync host -> device from pinned memory (docs/gpu-toolchain-notes.md §7)
    POOL_GBS  77.7 GB/s  the CPU pool on Q8_0 experts, 16 cores (docs/BENCHMARKS.md): the tier floor's rate without a probe
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError

PCIE_GBS = 51.0
POOL_GBS = 77.7
AUTO = "auto"
# --pcie-frac when not given: auto, measured against the CPU pool alone on the full-size file (bench/tiers_device.sh
# at e891ad7 on the H200 host, cache 0: T = 1 19.2 against 25.9 ms, T = 8 87.6 against 140.6; docs/BENCHMARKS.md)
DEFAULT_PCIE_FRAC: float | str = AUTO
# a share > 0 only where it is predicted >= 10 % faster than 0: what the model leaves out cost more than that before
# (the H200 host at 0.25 / 0.5, T = 1: 82.7 / 133 ms measured against 60 / 79 this model gives its rates)
AUTO_MIN_GAIN = 0.10
AUTO_STEP = 0.01      # the shares auto compares: 0, 0.01, ..., 1
PROBE_EXPERTS = 32    # experts of layer 0 the pool probe computes (one row each), at most
PROBE_REPEATS = 3     # the best of these is the rate
REPORT_FRACS = (0.25, 0.5, 1.0)  # the shares whose predicted times the auto line also prints (tiers_device.sh runs them)
TUNE_ALPHA = 0.5      # ShareTuner: the newest window's weight in the running rates (one odd window moves them half)
TUNE_MIN = AUTO_STEP  # ShareTuner keeps a share > 0: the engine was built with its PCIe path (flagB waits, staging)


@dataclass(frozen=True)
class ShareRates:
    """GB/s of expert bytes: the CPU pool, the DMA host -> device from the page-locked store; dma_measured False:
    PCIE_GBS stands in."""
    pool_gbs: float
    dma_gbs: float = PCIE_GBS
    dma_measured: bool = False

    def __post_init__(self):
        for name in ("pool_gbs", "dma_gbs"):
            value = getattr(self, name)
            if not value > 0:  # also NaN
                raise ValueError(f"{name} must be > 0 (got {value})")


def shares_ms(cpu_bytes: float, pcie_bytes: float, rates: ShareRates) -> tuple[float, float, float]:
    """(host ms, PCIe path ms, predicted tier ms) of cpu_bytes on the pool and pcie_bytes over PCIe (the module
    docstring's model: the two side by side)."""
    host = cpu_bytes / (rates.pool_gbs * 1e6)
    pcie = pcie_bytes / (rates.dma_gbs * 1e6)
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


def auto_window_bytes(model, layers: tuple[int, int]) -> int:
    """The distinct misses of a T = 1 window with every routed expert missed (cache 0): K experts of every layer of
    [lo, hi) (the window the auto line's predicted times are for)."""
    from .residency import expert_bytes

    return int(model.geometry.n_expert_used * expert_bytes(model)[layers[0]:layers[1]].sum())


def _fmt(f: float) -> str:
    return f"{f:g}"


def auto_note(frac: float, rates: ShareRates, window_bytes: int | None) -> str:
    """The auto line's parenthesis: the rates, and the predicted times at 0, the chosen share and REPORT_FRACS."""
    dma = f"DMA {rates.dma_gbs:.1f} GB/s {'measured' if rates.dma_measured else '(constant, not measured)'}"
    text = f"--pcie-frac auto: CPU pool {rates.pool_gbs:.1f} GB/s; {dma} from the page-locked store, beside the pool"
    if window_bytes:
        at = lambda f: window_ms(f, window_bytes, rates)[2]  # noqa: E731
        chosen = " (chosen)" if frac == 0.0 else f", {at(frac):.1f} at the chosen {_fmt(frac)}"
        others = ", ".join(f"{at(f):.1f} at {_fmt(f)}" for f in REPORT_FRACS)
        text += (f"; predicted tier ms of a T = 1 window missing every routed expert ({window_bytes / 1e9:.2f} GB): "
                 f"{at(0.0):.1f} at 0{chosen}; {others}")
    if frac == 0.0:
        text += f"; no share is predicted {AUTO_MIN_GAIN:.0%} faster than 0"
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


class ShareTuner:
    """--pcie-frac auto between windows (the engine's tier host calls frac(T) before a window of T rows and
    observe(T, stats) after it): per window size T a share of each step's distinct misses and running rates of the
    pool and the DMAs (GB/s of expert bytes), seeded from the build's share and rates (a T not seen yet: the nearest
    T seen). observe() folds the window's own rates (its pool bytes over its pool ms, its PCIe bytes over its DMA ms)
    into the running ones (TUNE_ALPHA) and moves the share by the gap between the byte share where those rates
    balance the two, dma / (pool + dma), and the byte share the window had: the share counts experts and the floor of
    a step's count falls short of it, which the byte share's feedback takes up. Kept in [TUNE_MIN, 1]. A window
    without misses changes nothing; one without pool (or DMA) time keeps that rate."""

    def __init__(self, frac: float, rates: ShareRates, alpha: float = TUNE_ALPHA):
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"ShareTuner needs a share in (0, 1] (got {frac})")
        self.alpha = alpha
        self.seed_rates = rates  # the build's (TierHost makes a new tuner when the engine's rates are replaced)
        self.start = (float(frac), float(rates.pool_gbs), float(rates.dma_gbs))
        self._by_t: dict[int, list[float]] = {}  # T -> [share, pool GB/s, DMA GB/s]

    def _state(self, T: int) -> list[float]:
        state = self._by_t.get(T)
        if state is None:
            seen = sorted(self._by_t, key=lambda t: (abs(np.log(t / T)), t))
            state = self._by_t[T] = list(self._by_t[seen[0]] if seen else self.start)
        return state

    def frac(self, T: int) -> float:
        """The share the next window of T rows uses."""
        return self._state(T)[0]

    def rates(self, T: int) -> tuple[float, float]:
        """(pool GB/s, DMA GB/s) as the windows of T rows measured them so far."""
        _, pool, dma = self._state(T)
        return pool, dma

    def observe(self, T: int, stats: dict) -> None:
        """A window of T rows served: stats holds its cpu_bytes, pcie_bytes, pool_ms and copy_ms (TierHost.stats)."""
        state = self._state(T)
        cpu, pcie = float(stats["cpu_bytes"]), float(stats["pcie_bytes"])
        if cpu + pcie <= 0:
            return
        a = self.alpha
        pool_ms, copy_ms = float(stats["pool_ms"]), float(stats["copy_ms"])
        if cpu > 0 and pool_ms > 0:
            state[1] = (1 - a) * state[1] + a * cpu / 1e6 / pool_ms
        if pcie > 0 and copy_ms > 0:
            state[2] = (1 - a) * state[2] + a * pcie / 1e6 / copy_ms
        target = state[2] / (state[1] + state[2])
        state[0] = float(min(1.0, max(TUNE_MIN, state[0] + target - pcie / (cpu + pcie))))
