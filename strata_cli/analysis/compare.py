"""Compare two logprob dumps of the same tokens: per-position deltas, top-1 agreement, top-k overlap, and the
llama-perplexity statistics (divergence.DivergenceStats) the dumps hold: PPL of each and their ratio, Δp and top-1
agreement from any dump, KLD where both dumps carry full distributions (`strata logprobs --format json --full-dist`).
A is the base."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, NonFiniteError
from .divergence import DivergenceStats, PositionArrays
from .dumps import LogprobRow, nonfinite_rows, read_dump


@dataclass(frozen=True)
class PositionDiff:
    pos: int
    target: int
    lp_a: float
    lp_b: float
    abs_delta: float  # |lp_a - lp_b| of the target; nan if either is nan
    top1_a: int
    top1_b: int
    top1_agree: bool
    topk_overlap: float | None  # |topk_A & topk_B| / min(kA, kB); None if either dump has no top-k here


@dataclass(frozen=True)
class Summary:
    rows: int
    max_abs_delta: float
    mean_abs_delta: float
    p99_abs_delta: float
    max_delta_pos: int
    top1_agreement: float
    mean_topk_overlap: float | None
    match_rate_a: float
    match_rate_b: float
    divergence: DivergenceStats

    def as_dict(self) -> dict:
        out = asdict(self)
        out["divergence"] = self.divergence.flat()
        return out


def _by_pos(rows: list[LogprobRow], label: str) -> dict[int, LogprobRow]:
    out: dict[int, LogprobRow] = {}
    for r in rows:
        if r.pos in out:
            raise InputError(f"{label}: position {r.pos} appears twice")
        out[r.pos] = r
    return out


def _topk_overlap(a: LogprobRow, b: LogprobRow) -> float | None:
    if not a.topk or not b.topk:
        return None
    ids_a = {tid for tid, _ in a.topk}
    ids_b = {tid for tid, _ in b.topk}
    return len(ids_a & ids_b) / min(len(ids_a), len(ids_b))


def compare_rows(a: list[LogprobRow], b: list[LogprobRow], *, label_a: str = "A",
                 label_b: str = "B") -> tuple[Summary, list[PositionDiff]]:
    """Align by position and compare. The dumps must cover the same positions with the same targets."""
    if not a or not b:
        raise InputError(f"{label_a if not a else label_b}: no rows to compare")
    by_a, by_b = _by_pos(a, label_a), _by_pos(b, label_b)
    only = sorted(set(by_a) ^ set(by_b))
    if only:
        p = only[0]
        has, lacks = (label_a, label_b) if p in by_a else (label_b, label_a)
        raise InputError(f"positions differ: {p} is in {has} but not in {lacks} "
                         f"({len(only)} position(s) in only one dump)")
    diffs = []
    for p in sorted(by_a):
        ra, rb = by_a[p], by_b[p]
        if ra.target != rb.target:
            raise InputError(f"target differs at position {p}: {ra.target} in {label_a}, {rb.target} in {label_b}")
        # equal infinities count as no difference rather than inf - inf = nan
        delta = 0.0 if ra.lp_target == rb.lp_target else abs(ra.lp_target - rb.lp_target)
        diffs.append(PositionDiff(p, ra.target, ra.lp_target, rb.lp_target, delta, ra.top_id, rb.top_id,
                                  ra.top_id == rb.top_id, _topk_overlap(ra, rb)))
    return summarize(diffs, a, b, divergence_arrays([by_a[p] for p in sorted(by_a)], [by_b[p] for p in sorted(by_b)],
                                                   label_a, label_b)), diffs


def divergence_arrays(a: list[LogprobRow], b: list[LogprobRow], label_a: str = "A",
                      label_b: str = "B") -> PositionArrays:
    """Per-position values for DivergenceStats from aligned rows; KLD only when every row of both has `dist`."""
    kld = None
    if all(r.dist is not None for r in a) and all(r.dist is not None for r in b):
        lp_a = np.array([r.dist for r in a], dtype=np.float64)
        lp_b = np.array([r.dist for r in b], dtype=np.float64)
        if lp_a.shape != lp_b.shape:
            raise InputError(f"full distributions differ in size: {lp_a.shape[1]} in {label_a}, "
                             f"{lp_b.shape[1]} in {label_b}")
        kld = np.maximum(np.sum(np.exp(lp_a) * (lp_a - lp_b), axis=-1), 0.0)
    return PositionArrays(np.array([r.pos for r in a]), np.array([r.target for r in a]),
                          np.array([r.lp_target for r in a], dtype=np.float64),
                          np.array([r.lp_target for r in b], dtype=np.float64),
                          np.array([r.top_id for r in a]), np.array([r.top_id for r in b]), kld)


def summarize(diffs: list[PositionDiff], a: list[LogprobRow], b: list[LogprobRow],
              divergence: PositionArrays) -> Summary:
    d = np.array([x.abs_delta for x in diffs], dtype=np.float64)
    worst = int(np.argmax(np.where(np.isnan(d), np.inf, d)))  # a nan delta is the worst position
    overlaps = [x.topk_overlap for x in diffs if x.topk_overlap is not None]
    return Summary(
        rows=len(diffs),
        max_abs_delta=float(d[worst]),
        mean_abs_delta=float(d.mean()),
        p99_abs_delta=float(np.percentile(d, 99)),
        max_delta_pos=diffs[worst].pos,
        top1_agreement=sum(x.top1_agree for x in diffs) / len(diffs),
        mean_topk_overlap=float(np.mean(overlaps)) if overlaps else None,
        match_rate_a=sum(r.match for r in a) / len(a),
        match_rate_b=sum(r.match for r in b) / len(b),
        divergence=DivergenceStats.of(divergence),
    )


def check_finite(rows: list[LogprobRow], label: str) -> None:
    """A dump with NaN/Inf logprobs compares as nothing: refuse it (exit 4) rather than report numbers."""
    bad = nonfinite_rows(rows)
    if bad:
        r = bad[0]
        more = f" and {len(bad) - 1} more row(s)" if len(bad) > 1 else ""
        raise NonFiniteError(f"{label}: non-finite logprobs at position {r.pos} (lp_target {r.lp_target}, lp_top "
                             f"{r.lp_top}){more}: the model or engine that wrote it went NaN/Inf")


def compare_files(path_a: str | Path, path_b: str | Path) -> tuple[Summary, list[PositionDiff]]:
    if str(path_a) == "-" and str(path_b) == "-":
        raise InputError("compare: only one of the two dumps can be read from stdin (-)")
    rows_a, rows_b = read_dump(path_a), read_dump(path_b)
    label_a, label_b = ("stdin" if str(p) == "-" else str(p) for p in (path_a, path_b))
    check_finite(rows_a, label_a)
    check_finite(rows_b, label_b)
    return compare_rows(rows_a, rows_b, label_a=label_a, label_b=label_b)


def threshold_failures(summary: Summary, *, max_delta: float | None = None,
                       min_top1: float | None = None) -> list[str]:
    """One message per threshold given and missed (a nan statistic misses every threshold)."""
    failures = []
    if max_delta is not None and not summary.max_abs_delta <= max_delta:
        failures.append(f"max |delta logprob(target)| {summary.max_abs_delta:.3g} at position "
                        f"{summary.max_delta_pos} > --max-delta {max_delta:g}")
    if min_top1 is not None and not summary.top1_agreement >= min_top1:
        failures.append(f"top-1 agreement {summary.top1_agreement:.4f} < --min-top1 {min_top1:g}")
    return failures
