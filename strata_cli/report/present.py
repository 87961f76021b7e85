"""Shared presenters: one list of row dicts, printed as a table, Markdown, TSV, CSV, JSON or JSON lines.

table and md are for reading (each column's display format applies); csv, tsv, json and jsonl carry raw values
(a count stays 1090, never "1,090"; floats keep every digit), so scripts parse them back. A table on a terminal is
drawn by rich; piped or redirected it is plain ASCII, no colour. Data goes to stdout; diagnostics (`warn`,
`err_console`) go to stderr.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

from ..errors import InputError
from ..sysio.files import stdout_text

FORMATS = ("table", "json", "jsonl", "csv", "md", "tsv")
# what every command's --format offers (tsv only where a command has a dump format of its own)
RECORD_FORMATS = ("table", "json", "jsonl", "csv", "md")


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


def raw(value: Any) -> str:
    """A value as csv/tsv write it: the number itself (repr precision), a list as space-separated values, a dict
    as space-separated key:value pairs, None and non-finite floats as the empty field."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return " ".join(f"{k}:{raw(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return " ".join(raw(v) for v in value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return raw(value.tolist())
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value).replace("\t", " ").replace("\n", " ")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fold_line(text: str, width: int, indent: str = "  ") -> list[str]:
    """A header line (`strata 0.1.0 @ abc | device cpu (...) | numpy ...`) as lines of at most `width` columns, cut at
    its field boundaries (` | `, the separator dropped at a cut), a field longer than a line at its spaces, and only a
    word longer than a line (a long path) inside it; continuation lines indented. Words and numbers stay whole."""
    from rich.cells import cell_len

    if cell_len(text) <= width or width - len(indent) < 10:
        return [text]
    lines = [""]

    def fits(piece: str) -> bool:
        return cell_len(lines[-1] + piece) <= width

    def add(piece: str, sep: str) -> bool:
        """piece on the current line (after sep), else on a new one; False when it is longer than a line."""
        if lines[-1].strip() and fits(sep + piece):
            lines[-1] += sep + piece
            return True
        if lines[-1].strip():
            lines.append(indent)
        if fits(piece):
            lines[-1] += piece
            return True
        return False

    for field in text.split(" | "):
        if add(field, " | "):
            continue
        for word in field.split(" "):  # the field alone is longer than a line
            if add(word, " "):
                continue
            while not fits(word):  # one word longer than a line: cut it where the line ends
                k = max(1, width - cell_len(lines[-1]))
                lines[-1] += word[:k]
                lines.append(indent)
                word = word[k:]
            lines[-1] += word
    return lines


def _table(rows: list[dict], cols: list[Column], title: str | None, header_lines: Iterable[str], out) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    con = Console(file=out if out is not None else stdout_text())
    plain = not con.is_terminal
    if plain:  # piped or redirected: ASCII borders, no colour, and the table's own width (rich assumes 80)
        con = Console(file=con.file, no_color=True, highlight=False, width=1 << 14, legacy_windows=False)
    for line in header_lines:  # piped: one line each; on a terminal folded to its width (the terminal would cut)
        for part in [line] if plain else fold_line(line, con.width):
            con.print(part, style=None if plain else "dim", markup=False, highlight=False, soft_wrap=True)
    cells = [[c.render(row.get(c.key)) for c in cols] for row in rows]
    if not plain:  # a terminal: cells keep their full width, headers wrap; too wide even so, one block per row
        table = _fitted_table(cols, cells, title, con.width)
        con.print(table)
        con.file.flush()
        return
    table = Table(title=title, box=box.ASCII, title_style=None)
    for c in cols:
        table.add_column(c.title, justify=c.justify)
    for row in cells:
        table.add_row(*row)
    if plain:
        width = con.measure(table).maximum
        con = Console(file=con.file, no_color=True, highlight=False, width=width)
    con.print(table)
    con.file.flush()


def _fitted_table(cols: list[Column], cells: list[list[str]], title: str | None, width: int):
    """A terminal table no wider than `width` whose cells are never cut (rich would squeeze a wide table into
    `33.1…` cells and `ms/w…` headers): every column at least as wide as its widest cell, headers folded onto more
    lines; where even that does not fit, the table turned (one row per column, one column per row), and where that
    does not fit either, one key/value block per row."""
    from rich import box
    from rich.cells import cell_len
    from rich.console import Group
    from rich.table import Table

    def table_of(columns, rows, table_title, show_header=True):
        table = Table(title=table_title, box=box.HEAVY_HEAD if show_header else box.SIMPLE, title_style="italic",
                      show_header=show_header)
        for title_text, justify, min_width in columns:
            table.add_column(title_text, justify=justify, min_width=min_width, no_wrap=False, overflow="fold")
        for row in rows:
            table.add_row(*row)
        return table

    widths = [max([cell_len(row[i]) for row in cells] + [1]) for i in range(len(cols))]
    header_words = [max([cell_len(w) for w in c.title.split()] + [1]) for c in cols]
    needed = sum(max(w, min(h, 10)) + 3 for w, h in zip(widths, header_words)) + 1
    if needed <= width or len(cols) <= 2:
        return table_of([(c.title, c.justify, w) for c, w in zip(cols, widths)], cells, title)
    key_width = max(cell_len(c.title) for c in cols)
    row_widths = [max([cell_len(row[i]) for i in range(len(cols))] + [1]) for row in cells]
    if key_width + sum(w + 3 for w in row_widths) + 4 <= width:
        turned = [[c.title, *(row[i] for row in cells)] for i, c in enumerate(cols)]
        return table_of([("", "left", key_width), *(("", "right", w) for w in row_widths)], turned, title,
                        show_header=False)
    blocks = [table_of([("key", "left", key_width), ("value", "right", max(widths))],
                       [[c.title, value] for c, value in zip(cols, row)], None, show_header=False) for row in cells]
    return Group(*([f"[italic]{title}[/italic]"] if title else []), *blocks)


def emit(rows: list[dict], columns: Sequence[Column | str] | None, fmt: str, *, title: str | None = None,
         header_lines: Iterable[str] = (), out=None, meta: dict | None = None) -> None:
    """Print `rows` in `fmt` (one of FORMATS) to `out` (default stdout).

    table: `header_lines` above a table titled `title`.  md: `header_lines` as text, `### title`, a Markdown table.
    tsv: `# ` + each header line, a header row of keys, then the rows.  csv: a header row of keys, then the rows.
    json: {"meta": meta, "rows": rows} with every key of every row.  jsonl: one JSON object per row, every key.
    csv/tsv/json/jsonl hold raw values; table/md apply each column's format. No columns given: every key of the
    rows, in first-seen order.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown output format '{fmt}' (choose from {', '.join(FORMATS)})")
    cols = _columns(columns, rows)
    try:
        _emit(rows, cols, fmt, title=title, header_lines=header_lines, out=out, meta=meta)
    except BrokenPipeError:
        raise
    except OSError as exc:  # a full device behind stdout or -o: one line naming where
        from ..sysio.files import os_error

        raise os_error(exc, getattr(out, "name", None) or "stdout", "write the output") from None


def _emit(rows, cols, fmt, *, title, header_lines, out, meta) -> None:
    if fmt == "table":
        _table(rows, cols, title, header_lines, out)
        return
    fh = out if out is not None else stdout_text()
    if fmt == "json":
        doc = {"meta": meta, "rows": rows}
        fh.write(json.dumps(_jsonable(doc), indent=2, default=str) + "\n")
    elif fmt == "jsonl":
        for row in rows:
            fh.write(json.dumps(_jsonable(row), default=str) + "\n")
    elif fmt == "md":
        for line in header_lines:
            fh.write(f"{line}\n\n")
        if title:
            fh.write(f"### {title}\n\n")
        fh.write("| " + " | ".join(_md_cell(c.title) for c in cols) + " |\n")
        fh.write("|" + "|".join("---:" if c.justify == "right" else ":---" for c in cols) + "|\n")
        for row in rows:
            fh.write("| " + " | ".join(_md_cell(c.render(row.get(c.key))) for c in cols) + " |\n")
        fh.write("\n")
    elif fmt == "tsv":
        for line in header_lines:
            fh.write(f"# {line}\n")
        fh.write("\t".join(c.key for c in cols) + "\n")
        for row in rows:
            fh.write("\t".join(raw(row.get(c.key)) for c in cols) + "\n")
    else:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow([c.key for c in cols])
        for row in rows:
            writer.writerow([raw(row.get(c.key)) for c in cols])
    fh.flush()
