"""The logprob dump: one tab-separated line per position, as the seed engine's STRATA_LOGPOS writes it.

    pos  target  lp(target)  top_id  lp(top_id)  match  lp(extra_id)  lp(target) renormalised without extra_id
    [K more fields `id:logprob`, most likely first]

Row p is the distribution after tokens[0..p]; its target is tokens[p+1]. Floats have 9 decimals, top-K logprobs 6;
the last two fixed fields are nan where there is no extra id (or it is the target). No header row; `#` lines are
comments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

from .errors import InputError

N_FIXED = 8
_FIELDS = ("pos", "target", "lp_target", "top_id", "lp_top", "match", "lp_extra", "lp_target_renorm")


@dataclass
class LogprobRow:
    pos: int
    target: int
    lp_target: float
    top_id: int
    lp_top: float
    match: int
    lp_extra: float
    lp_target_renorm: float
    topk: list[tuple[int, float]] = field(default_factory=list)


def _f(x: float, decimals: int) -> str:
    return "nan" if math.isnan(x) else f"{x:.{decimals}f}"


def format_row(r: LogprobRow) -> str:
    fields = [str(r.pos), str(r.target), _f(r.lp_target, 9), str(r.top_id), _f(r.lp_top, 9), str(int(r.match)),
              _f(r.lp_extra, 9), _f(r.lp_target_renorm, 9)]
    fields += [f"{tid}:{_f(lp, 6)}" for tid, lp in r.topk]
    return "\t".join(fields)


def write_tsv(rows: Iterable[LogprobRow], fh: IO[str], comments: Iterable[str] = ()) -> None:
    for line in comments:
        fh.write(f"# {line}\n")
    for r in rows:
        fh.write(format_row(r) + "\n")


def _parse_line(fields: list[str], where: str) -> LogprobRow:
    if len(fields) < N_FIXED:
        raise InputError(f"{where}: expected at least {N_FIXED} tab-separated fields, got {len(fields)}")
    values: list = []
    for i, (name, text) in enumerate(zip(_FIELDS, fields)):
        kind = float if name.startswith("lp_") else int
        try:
            values.append(kind(text))
        except ValueError:
            noun = "a number" if kind is float else "an integer"
            raise InputError(f"{where}: field {i + 1} ({name}) is not {noun}: {text!r}") from None
    if values[5] not in (0, 1):
        raise InputError(f"{where}: field 6 (match) must be 0 or 1, got {fields[5]!r}")
    topk = []
    for i, text in enumerate(fields[N_FIXED:], start=N_FIXED + 1):
        tid, sep, lp = text.partition(":")
        try:
            if not sep:
                raise ValueError
            topk.append((int(tid), float(lp)))
        except ValueError:
            raise InputError(f"{where}: field {i} is not a top-k 'id:logprob' pair: {text!r}") from None
    return LogprobRow(*values, topk=topk)


def read_tsv(path: str | Path) -> list[LogprobRow]:
    """Rows of a dump file; `#` and blank lines skipped. A malformed line is an InputError naming file:line."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read logprob dump: {exc}") from None
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        rows.append(_parse_line(line.split("\t"), f"{path}:{lineno}"))
    return rows


def rows_to_json(rows: Iterable[LogprobRow]) -> list[dict]:
    """Plain dicts for JSON: topk as [[id, logprob], ...], nan (and +-inf) as None so the JSON stays valid."""

    def num(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    out = []
    for r in rows:
        out.append({"pos": r.pos, "target": r.target, "lp_target": num(r.lp_target), "top_id": r.top_id,
                    "lp_top": num(r.lp_top), "match": r.match, "lp_extra": num(r.lp_extra),
                    "lp_target_renorm": num(r.lp_target_renorm), "topk": [[tid, num(lp)] for tid, lp in r.topk]})
    return out
