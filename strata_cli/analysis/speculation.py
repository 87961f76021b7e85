"""Acceptance of drafted tokens: what a speculative loop measured, and the model verify-bench prices windows with.

A verify window of T tokens holds the last accepted token and T-1 drafts; drafts are accepted left to right until
the first rejection, so a window yields 1 + (accepted drafts) tokens. With a per-position conditional acceptance
a_j (the chance draft j is accepted given drafts 1..j-1 were) the expected tokens of a window are

    E(T) = 1 + sum_{j=1}^{T-1} prod_{i=1}^{j} a_i

which for a constant a is (1 - a^T) / (1 - a) (Leviathan et al. 2023).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError

DUMP_TAG = "speculation"  # the key of the JSON dump's meta and the `# speculation ` comment line of a TSV dump


@dataclass
class LoopStats:
    """What the speculative loop did: windows run, rows fed and kept, and per window the drafts it accepted."""

    window: int  # the largest window size T of the loop
    windows: int = 0
    rows_fed: int = 0
    rows_kept: int = 0
    offered: list[int] = field(default_factory=list)  # per draft position j = 1..T-1: windows that reached j
    accepted: list[int] = field(default_factory=list)  # ... and accepted draft j
    histogram: list[int] = field(default_factory=list)  # [k]: windows that accepted exactly k drafts (k = 0..T-1)
    nonfinite_windows: int = 0  # windows whose values went NaN/Inf (kept only with --allow-nonfinite)

    def __post_init__(self):
        n = max(self.window - 1, 0)
        self.offered = self.offered or [0] * n
        self.accepted = self.accepted or [0] * n
        self.histogram = self.histogram or [0] * (n + 1)

    def record(self, fed: int, kept: int) -> None:
        """One window: `fed` rows (1 + fed-1 drafts), of which the first `kept` were committed."""
        self.windows += 1
        self.rows_fed += fed
        self.rows_kept += kept
        accepted_drafts = kept - 1
        self.histogram[accepted_drafts] += 1
        for j in range(1, fed):  # draft j is examined only while every draft before it was accepted
            if j > accepted_drafts + 1:
                break
            self.offered[j - 1] += 1
            self.accepted[j - 1] += j <= accepted_drafts

    @property
    def per_position(self) -> list[float | None]:
        """Conditional acceptance of draft j (given 1..j-1 accepted); None where no window reached j."""
        return [a / o if o else None for a, o in zip(self.accepted, self.offered)]

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafts per window (tokens per window is this + 1)."""
        return (self.rows_kept - self.windows) / self.windows if self.windows else float("nan")

    def as_dict(self) -> dict:
        return {"window": self.window, "windows": self.windows, "rows_fed": self.rows_fed,
                "rows_kept": self.rows_kept, "mean_accepted": self.mean_accepted,
                "mean_tokens_per_window": self.rows_kept / self.windows if self.windows else None,
                "histogram": list(self.histogram), "offered": list(self.offered), "accepted": list(self.accepted),
                "per_position": self.per_position}

    def summary_line(self) -> str:
        per_pos = " ".join("-" if a is None else f"{a:.3f}" for a in self.per_position)
        hist = " ".join(f"{k}:{n}" for k, n in enumerate(self.histogram))
        return (f"{self.windows} windows, mean accepted drafts {self.mean_accepted:.3f}, "
                f"accepted-drafts histogram {hist}, per-position acceptance {per_pos or '-'}")


@dataclass(frozen=True)
class Acceptance:
    """Conditional acceptance per draft position: `rates[j-1]` for draft j, or one constant rate for every j."""

    rates: tuple[float, ...]
    constant: bool
    source: str  # "assumed" or the dump it was measured from

    @classmethod
    def assumed(cls, rate: float) -> Acceptance:
        return cls((float(rate),), True, "assumed")

    def rate(self, j: int) -> float:
        """Acceptance of draft j (1-based)."""
        return self.rates[0] if self.constant else self.rates[j - 1]

    def max_window(self) -> int | None:
        return None if self.constant else len(self.rates) + 1

    def expected_tokens(self, window: int) -> float:
        total, reach = 1.0, 1.0
        for j in range(1, window):
            reach *= self.rate(j)
            total += reach
        return total

    def draw_keep(self, rng: np.random.Generator, window: int) -> int:
        """Rows a window of `window` tokens commits: 1 + the drafts accepted before the first rejection."""
        keep = 1
        while keep < window and rng.random() < self.rate(keep):
            keep += 1
        return keep

    def describe(self) -> str:
        if self.constant:
            return f"{self.rates[0]:g} (assumed)"
        return f"measured per position {' '.join(f'{a:.3f}' for a in self.rates)} from {self.source}"


def _stats_from_dump(path: Path) -> dict:
    from ..sysio.files import read_text

    text = read_text(path, what="logprob dump")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        stats = (doc.get("meta") or {}).get(DUMP_TAG) if isinstance(doc, dict) else None
    else:
        prefix = f"# {DUMP_TAG} "
        line = next((ln for ln in text.splitlines() if ln.startswith(prefix)), None)
        try:
            stats = json.loads(line[len(prefix):]) if line else None
        except json.JSONDecodeError:
            raise InputError(f"{path}: the '{prefix.strip()}' line is not valid JSON") from None
    if not isinstance(stats, dict):
        raise InputError(f"{path}: no speculation statistics in this dump (write one with `strata logprobs "
                         f"--window T --draft-noise P --format json|tsv`)")
    return stats


def acceptance_from_dump(path: str | Path) -> Acceptance:
    """The per-position acceptance a `strata logprobs` loop measured (JSON meta or the TSV comment line)."""
    path = Path(path)
    stats = _stats_from_dump(path)
    offered, accepted = stats.get("offered"), stats.get("accepted")
    if not (isinstance(offered, list) and isinstance(accepted, list) and len(offered) == len(accepted)):
        raise InputError(f"{path}: speculation statistics lack matching 'offered'/'accepted' lists")
    rates = []
    for j, (o, a) in enumerate(zip(offered, accepted), start=1):
        if not isinstance(o, int) or not isinstance(a, int) or o < 0 or not 0 <= a <= o:
            raise InputError(f"{path}: draft position {j}: accepted {a!r} of offered {o!r} is not a count")
        if o == 0:
            break  # no window reached this draft: the measurement ends here
        rates.append(a / o)
    if not rates:
        raise InputError(f"{path}: the loop offered no drafts (it ran with --window 1): nothing was measured")
    return Acceptance(tuple(rates), False, str(path))
