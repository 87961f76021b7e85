"""The logprob dump: exact line format, round trip, nan handling, and one-line errors for malformed lines."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from strata_cli.analysis.dumps import LogprobRow, read_tsv, rows_to_json, write_tsv
from strata_cli.errors import InputError

NAN = float("nan")


def _random_rows(n: int, k: int, seed: int = 0) -> list[LogprobRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n):
        lps = np.sort(-rng.exponential(2.0, size=k))[::-1]
        ids = rng.choice(512, size=k, replace=False)
        target = int(rng.integers(512))
        extra = NAN if p % 3 == 0 else float(-rng.exponential(5.0))
        renorm = NAN if p % 3 == 0 else float(-rng.exponential(2.0))
        rows.append(LogprobRow(p, target, float(-rng.exponential(2.0)), int(ids[0]), float(lps[0]),
                               int(ids[0] == target), extra, renorm,
                               [(int(i), float(v)) for i, v in zip(ids, lps)]))
    return rows


def _same(a: float, b: float, tol: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol


def test_line_format_is_exact():
    row = LogprobRow(3, 17, -1.2345678912, 5, -0.1, 0, NAN, NAN, [(5, -0.1), (17, -1.2345678912)])
    fh = io.StringIO()
    write_tsv([row], fh, comments=["model tiny", "seed 0"])
    assert fh.getvalue() == ("# model tiny\n# seed 0\n"
                             "3\t17\t-1.234567891\t5\t-0.100000000\t0\tnan\tnan\t5:-0.100000\t17:-1.234568\n")


def test_no_topk_means_exactly_eight_fields():
    fh = io.StringIO()
    write_tsv([LogprobRow(0, 1, -2.0, 1, -2.0, 1, -3.0, -1.5, [])], fh)
    assert fh.getvalue().rstrip("\n").split("\t") == ["0", "1", "-2.000000000", "1", "-2.000000000", "1",
                                                      "-3.000000000", "-1.500000000"]


def test_round_trip(tmp_path):
    rows = _random_rows(40, k=8)
    path = tmp_path / "dump.tsv"
    with open(path, "w") as fh:
        write_tsv(rows, fh, comments=["a comment"])
    back = read_tsv(path)
    assert len(back) == len(rows)
    for a, b in zip(rows, back):
        assert (a.pos, a.target, a.top_id, a.match) == (b.pos, b.target, b.top_id, b.match)
        for name in ("lp_target", "lp_top", "lp_extra", "lp_target_renorm"):
            assert _same(getattr(a, name), getattr(b, name), 5e-10), name
        assert [i for i, _ in a.topk] == [i for i, _ in b.topk]
        assert all(abs(x - y) <= 5e-7 for (_, x), (_, y) in zip(a.topk, b.topk))
    assert sum(math.isnan(r.lp_extra) for r in back) == 14  # positions 0, 3, ..., 39


def test_read_skips_comments_and_blank_lines_and_accepts_c_nan(tmp_path):
    path = tmp_path / "seed.tsv"
    path.write_text("# written by the seed engine\n\n"
                    "0\t4\t-1.000000000\t4\t-1.000000000\t1\t-nan\t-nan\n"
                    "\n1\t9\t-2.5\t4\t-0.5\t0\t-7.25\t-2.4\t4:-0.500000\r\n")
    rows = read_tsv(path)
    assert [r.pos for r in rows] == [0, 1]
    assert math.isnan(rows[0].lp_extra) and math.isnan(rows[0].lp_target_renorm)
    assert rows[0].topk == []
    assert rows[1].topk == [(4, -0.5)]
    assert rows[1].lp_extra == -7.25


def test_rows_to_json_is_valid_json_with_nulls():
    rows = [LogprobRow(0, 1, -2.0, 1, -2.0, 1, NAN, NAN, [(1, -2.0), (7, -3.5)])]
    doc = rows_to_json(rows)
    assert doc == [{"pos": 0, "target": 1, "lp_target": -2.0, "top_id": 1, "lp_top": -2.0, "match": 1,
                    "lp_extra": None, "lp_target_renorm": None, "topk": [[1, -2.0], [7, -3.5]]}]
    json.dumps(doc, allow_nan=False)


GOOD = "0\t4\t-1.0\t4\t-1.0\t1\tnan\tnan"


@pytest.mark.parametrize("bad, needle", [
    ("0\t4\t-1.0\t4\t-1.0\t1\tnan", "at least 8"),
    ("0\tfour\t-1.0\t4\t-1.0\t1\tnan\tnan", "field 2 (target)"),
    ("0\t4\t-1.0x\t4\t-1.0\t1\tnan\tnan", "field 3 (lp_target)"),
    ("0\t4\t-1.0\t4\t-1.0\t2\tnan\tnan", "match"),
    ("0\t4\t-1.0\t4\t-1.0\t1\tnan\tnan\t4-1.0", "field 9"),
    ("0\t4\t-1.0\t4\t-1.0\t1\tnan\tnan\t4:-1.0\tx:-2.0", "field 10"),
    ("0\t4\t-1.0\t4\t-1.0\t1\tnan\tnan\t4:oops", "field 9"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, needle):
    path = tmp_path / "bad.tsv"
    path.write_text(f"# header\n{GOOD}\n\n{bad}\n{GOOD}\n")
    with pytest.raises(InputError) as info:
        read_tsv(path)
    message = str(info.value)
    assert message.startswith(f"{path}:4: ")
    assert needle in message
    assert "\n" not in message


def test_missing_file_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_tsv(tmp_path / "absent.tsv")
