"""Shared presenters: one list of row dicts, printed as a rich table, TSV, CSV or JSON.

Data goes to stdout; diagnostics (`warn`, `err_console`) go to stderr.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

from .errors import InputError

FORMATS = ("table", "tsv", "json", "csv")


@dataclass(frozen=True)
class Column:
    """One output column. `fmt` is a format spec (".3f") or a callable; it applies to table/tsv/csv, not JSON.

    `header` is shown in the table; tsv and csv name the column by `key`, which stays stable for scripts.
    """

    key: str
    header: str | None = None
    fmt: str | Callable[[Any], str] | None = None
    justify: str = "right"

    @property
    def title(self) -> str:
        return self.header or self.key

    def render(self, value: Any) -> str:
        if value is None:
            return ""
        if callable(self.fmt):
            return self.fmt(value)
        if self.fmt:
            return format(value, self.fmt)
        return str(value)


@lru_cache(maxsize=None)
def console():
    """The stdout console (data). Rich picks up sys.stdout at write time, so redirection still works."""
    from rich.console import Console

    return Console()


@lru_cache(maxsize=None)
def err_console():
    """The stderr console (diagnostics, warnings, progress)."""
    from rich.console import Console

    return Console(stderr=True)


def warn(msg: str) -> None:
    err_console().print(f"strata: warning: {msg}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _columns(columns: Sequence[Column | str] | None, rows: list[dict]) -> list[Column]:
    if not columns:
        keys: dict[str, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        columns = list(keys)
    return [c if isinstance(c, Column) else Column(c) for c in columns]


def _jsonable(value: Any) -> Any:
    """Plain JSON values: numpy scalars and arrays unwrapped, non-finite floats -> None (keeps the JSON valid)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy scalar or array, without importing numpy
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(column: Column, row: dict) -> str:
    # tabs and newlines would break a TSV line
    return column.render(row.get(column.key)).replace("\t", " ").replace("\n", " ")


def emit(rows: list[dict], columns: Sequence[Column | str] | None, fmt: str, *, title: str | None = None,
         header_lines: Iterable[str] = (), out=None, meta: dict | None = None) -> None:
    """Print `rows` in `fmt` (one of FORMATS) to `out` (default stdout).

    table: rich Table, `header_lines` above it (dim), `title` on top.  tsv: `# ` + each header line, a header row
    of keys, then the rows.  csv: header row of keys, then the rows.  json: {"meta": meta, "rows": rows} with every
    key of every row and raw (unformatted) values.  No columns given: every key of the rows, in first-seen order.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown output format '{fmt}' (choose from {', '.join(FORMATS)})")
    cols = _columns(columns, rows)
    if fmt == "table":
        from rich.console import Console
        from rich.table import Table

        con = Console(file=out) if out is not None else console()
        for line in header_lines:
            con.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)
        table = Table(title=title)
        for c in cols:
            table.add_column(c.title, justify=c.justify)
        for row in rows:
            table.add_row(*(c.render(row.get(c.key)) for c in cols))
        if not con.is_terminal:  # rich assumes 80 columns for a pipe or file and would cut cells: use the table's width
            natural = con.measure(table, options=con.options.update(max_width=1 << 14)).maximum
            if natural > con.width:
                con = Console(file=con.file, width=natural)
        con.print(table)
        return
    fh = out if out is not None else sys.stdout
    if fmt == "json":
        doc = {"meta": meta, "rows": rows}
        fh.write(json.dumps(_jsonable(doc), indent=2, default=str) + "\n")
    elif fmt == "tsv":
        for line in header_lines:
            fh.write(f"# {line}\n")
        fh.write("\t".join(c.key for c in cols) + "\n")
        for row in rows:
            fh.write("\t".join(_cell(c, row) for c in cols) + "\n")
    else:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow([c.key for c in cols])
        for row in rows:
            writer.writerow([c.render(row.get(c.key)) for c in cols])
    fh.flush()
