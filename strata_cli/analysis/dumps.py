"""The logprob dump: one tab-separated line per position, as the seed engine's STRATA_LOGPOS writes it.

    pos  target  lp(target)  top_id  lp(top_id)  match  lp(extra_id)  lp(target) renormalised without extra_id
    [K more fields `id:logprob`, most likely first]

Row p is the distribution after tokens[0..p]; its target is tokens[p+1]. Floats have 9 decimals, top-K logprobs 6;
the last two fixed fields are nan where there is no extra id (or it is the target). No header row; `#` lines are
comments.

The JSON dump (`strata logprobs --format json`) holds the same rows as objects under "rows" (topk as [[id, logprob],
...], nan as null) and, with `--full-dist`, each row's whole log-prob distribution under "dist"; the JSONL dump
(`--format jsonl`) one such object per line. `read_dump` reads all three kinds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

from ..errors import InputError

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
    dist: list[float] | None = None  # the full log-prob distribution over the vocabulary (JSON dumps only)
    nonfinite: bool = False  # the window's values went NaN/Inf (written only with --allow-nonfinite)


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


def _read_text(path: str | Path) -> str:
    """The dump's text (`-` = stdin); unreadable, binary or non-UTF-8 files fail in one line naming why."""
    from ..sysio.files import read_text

    return read_text(path, what="logprob dump")


def read_tsv(path: str | Path, text: str | None = None) -> list[LogprobRow]:
    """Rows of a dump file; `#` and blank lines skipped. A malformed line is an InputError naming file:line."""
    lines = (_read_text(path) if text is None else text).splitlines()
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        rows.append(_parse_line(line.split("\t"), f"{path}:{lineno}"))
    return rows


def _json_number(value, where: str, name: str) -> float:
    if value is None:
        return float("nan")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: '{name}' is not a number: {value!r}")
    return float(value)


def _json_int(value, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: '{name}' is not an integer: {value!r}")
    return value


def _row_from_json(obj, where: str) -> LogprobRow:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object, got {type(obj).__name__}")
    missing = [k for k in _FIELDS if k not in obj]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")
    values = [_json_number(obj[k], where, k) if k.startswith("lp_") else _json_int(obj[k], where, k)
              for k in _FIELDS]
    if values[5] not in (0, 1):
        raise InputError(f"{where}: 'match' must be 0 or 1, got {obj['match']!r}")
    topk = []
    for pair in obj.get("topk") or []:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise InputError(f"{where}: 'topk' entries must be [id, logprob] pairs, got {pair!r}")
        topk.append((_json_int(pair[0], where, "topk id"), _json_number(pair[1], where, "topk logprob")))
    dist = obj.get("dist")
    if dist is not None:
        if not isinstance(dist, list) or not dist:
            raise InputError(f"{where}: 'dist' must be a list of log-probs")
        dist = [_json_number(x, where, "dist") for x in dist]
    return LogprobRow(*values, topk=topk, dist=dist)


def read_json(path: str | Path, text: str | None = None) -> list[LogprobRow]:
    """Rows of a JSON dump ({"meta": ..., "rows": [...]}, as `strata logprobs --format json` writes it)."""
    text = _read_text(path) if text is None else text
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise InputError(f"{path}: a JSON dump needs a 'rows' list (strata logprobs --format json)")
    return [_row_from_json(obj, f"{path}: row {i}") for i, obj in enumerate(rows)]


def read_jsonl(path: str | Path, text: str | None = None) -> list[LogprobRow]:
    """Rows of a JSONL dump (one row object per line, as `strata logprobs --format jsonl` writes it)."""
    text = _read_text(path) if text is None else text
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        rows.append(_row_from_json(obj, f"{path}:{lineno}"))
    return rows


def read_dump(path: str | Path) -> list[LogprobRow]:
    """A TSV, JSON or JSONL logprob dump: TSV unless the first non-blank character is `{`; then one JSON document
    with a "rows" list, or (a first line that is a whole row object) one row per line."""
    text = _read_text(path)
    if not text.lstrip().startswith("{"):
        return read_tsv(path, text)
    first = text.lstrip().split("\n", 1)[0]
    try:
        is_row = "rows" not in json.loads(first)
    except (json.JSONDecodeError, TypeError):
        is_row = False
    return read_jsonl(path, text) if is_row else read_json(path, text)


def nonfinite_rows(rows: Iterable[LogprobRow]) -> list[LogprobRow]:
    """Rows whose target or top-1 logprob (or a top-k logprob) is NaN/Inf: a model or engine that went wrong.
    lp_extra and the renormalised logprob are nan by design where there is no extra id, so they do not count."""
    bad = []
    for r in rows:
        values = [r.lp_target, r.lp_top] + [lp for _, lp in r.topk] + list(r.dist or ())
        if r.nonfinite or not all(math.isfinite(v) for v in values):
            bad.append(r)
    return bad


def rows_to_json(rows: Iterable[LogprobRow]) -> list[dict]:
    """Plain dicts for JSON: topk as [[id, logprob], ...], nan (and +-inf) as None so the JSON stays valid."""

    def num(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    out = []
    for r in rows:
        out.append({"pos": r.pos, "target": r.target, "lp_target": num(r.lp_target), "top_id": r.top_id,
                    "lp_top": num(r.lp_top), "match": r.match, "lp_extra": num(r.lp_extra),
                    "lp_target_renorm": num(r.lp_target_renorm), "topk": [[tid, num(lp)] for tid, lp in r.topk]})
        if r.dist is not None:
            out[-1]["dist"] = [num(lp) for lp in r.dist]
        if r.nonfinite:
            out[-1]["nonfinite"] = True
    return out
