"""`strata compare` and its library: statistics, alignment errors, thresholds and exit codes, JSON output."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.analysis.compare import compare_rows, threshold_failures
from strata_cli.analysis.dumps import LogprobRow, write_tsv
from strata_cli.errors import InputError

N = 50


def _rows(n: int = N, k: int = 4, seed: int = 0) -> list[LogprobRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n):
        lps = np.sort(-rng.exponential(2.0, size=k))[::-1]
        ids = [int(i) for i in rng.choice(512, size=k, replace=False)]
        target = ids[1] if p % 2 else int(rng.integers(512))
        rows.append(LogprobRow(p, target, float(lps[1]) if p % 2 else -9.0, ids[0], float(lps[0]),
                               int(ids[0] == target), float("nan"), float("nan"),
                               [(i, float(v)) for i, v in zip(ids, lps)]))
    return rows


def _write(path, rows):
    with open(path, "w") as fh:
        write_tsv(rows, fh)
    return str(path)


def _compare(*args):
    return CliRunner().invoke(main, ["compare", *map(str, args)])


def test_identical_dumps():
    rows = _rows()
    summary, diffs = compare_rows(rows, copy.deepcopy(rows))
    assert summary.rows == N
    assert summary.max_abs_delta == summary.mean_abs_delta == summary.p99_abs_delta == 0.0
    assert summary.top1_agreement == 1.0
    assert summary.mean_topk_overlap == 1.0
    assert summary.match_rate_a == summary.match_rate_b == sum(r.match for r in rows) / N
    assert all(d.abs_delta == 0.0 and d.top1_agree for d in diffs)


def test_perturbed_dumps():
    a = _rows()
    b = copy.deepcopy(a)
    b[7].lp_target += 0.25
    b[20].lp_target -= 0.01
    b[30].top_id = 511 if b[30].top_id != 511 else 510  # top-1 disagreement at one position
    b[30].topk = [(b[30].top_id, -0.1)] + a[30].topk[1:]  # 3 of 4 ids shared
    summary, diffs = compare_rows(a, b)
    assert summary.max_abs_delta == pytest.approx(0.25)
    assert summary.max_delta_pos == 7
    assert summary.mean_abs_delta == pytest.approx(0.26 / N)
    expected_p99 = np.percentile([d.abs_delta for d in diffs], 99)
    assert summary.p99_abs_delta == pytest.approx(expected_p99)
    assert 0.01 < summary.p99_abs_delta < 0.25
    assert summary.top1_agreement == pytest.approx((N - 1) / N)
    assert diffs[30].topk_overlap == pytest.approx(0.75)
    assert summary.mean_topk_overlap == pytest.approx((N - 1 + 0.75) / N)


def test_rows_are_aligned_by_position_not_order():
    a = _rows()
    b = list(reversed(copy.deepcopy(a)))
    summary, _ = compare_rows(a, b)
    assert summary.max_abs_delta == 0.0 and summary.top1_agreement == 1.0


def test_topk_overlap_uses_the_smaller_k_and_is_none_without_topk():
    a = _rows(k=4)
    b = copy.deepcopy(a)
    for r in b:
        r.topk = r.topk[:2]
    b[0].topk = []
    summary, diffs = compare_rows(a, b)
    assert diffs[0].topk_overlap is None
    assert all(d.topk_overlap == 1.0 for d in diffs[1:])
    assert summary.mean_topk_overlap == 1.0


def test_nan_delta_is_the_worst_and_fails_a_threshold():
    a = _rows()
    b = copy.deepcopy(a)
    b[12].lp_target = float("nan")
    summary, _ = compare_rows(a, b)
    assert math.isnan(summary.max_abs_delta) and summary.max_delta_pos == 12
    assert threshold_failures(summary, max_delta=1.0)


def test_position_sets_must_match():
    a = _rows()
    with pytest.raises(InputError, match=r"positions differ: 49 is in A but not in B"):
        compare_rows(a, copy.deepcopy(a[:-1]))


def test_targets_must_match():
    a = _rows()
    b = copy.deepcopy(a)
    b[5].target += 1
    b[9].target += 1
    with pytest.raises(InputError, match=r"target differs at position 5: "):
        compare_rows(a, b)


def test_duplicate_positions_are_an_error():
    a = _rows()
    with pytest.raises(InputError, match="position 3 appears twice"):
        compare_rows(a + [copy.deepcopy(a[3])], a)


def test_cli_identical_passes_tight_thresholds(tmp_path):
    rows = _rows()
    result = _compare(_write(tmp_path / "a.tsv", rows), _write(tmp_path / "b.tsv", rows),
                      "--max-delta", "0", "--min-top1", "1")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert "top-1 agreement" in result.stdout


def test_cli_thresholds_only_apply_when_given(tmp_path):
    a = _rows()
    b = copy.deepcopy(a)
    for r in b:
        r.lp_target -= 0.5
        r.top_id += 1
    pa, pb = _write(tmp_path / "a.tsv", a), _write(tmp_path / "b.tsv", b)
    assert _compare(pa, pb).exit_code == 0

    result = _compare(pa, pb, "--max-delta", "0.1")
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert "--max-delta 0.1" in result.stderr and "0.5" in result.stderr

    result = _compare(pa, pb, "--min-top1", "0.5")
    assert result.exit_code == 3
    assert "--min-top1 0.5" in result.stderr and "0.0000" in result.stderr

    assert _compare(pa, pb, "--max-delta", "0.6", "--min-top1", "0").exit_code == 0


def test_cli_mismatched_positions_is_exit_1(tmp_path):
    rows = _rows()
    result = _compare(_write(tmp_path / "a.tsv", rows), _write(tmp_path / "b.tsv", rows[:10]))
    assert result.exit_code == 1
    assert result.stderr.startswith("strata: error: positions differ: 10 is in ")
    assert result.stderr.count("\n") == 1


def test_cli_json_output(tmp_path):
    a = _rows()
    b = copy.deepcopy(a)
    b[4].lp_target += 0.125
    pa, pb = _write(tmp_path / "a.tsv", a), _write(tmp_path / "b.tsv", b)
    result = _compare(pa, pb, "--format", "json", "--max-delta", "0.2")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["meta"]["summary"]["rows"] == N
    assert doc["meta"]["summary"]["max_abs_delta"] == pytest.approx(0.125)
    assert doc["meta"]["summary"]["max_delta_pos"] == 4
    assert doc["meta"]["passed"] is True
    assert doc["rows"] == []

    doc = json.loads(_compare(pa, pb, "--format", "json", "--per-position").stdout)
    assert [r["pos"] for r in doc["rows"]] == list(range(N))
    assert doc["rows"][4]["abs_delta"] == pytest.approx(0.125)


def test_cli_per_position_table(tmp_path):
    rows = _rows(n=5)
    result = _compare(_write(tmp_path / "a.tsv", rows), _write(tmp_path / "b.tsv", rows), "--per-position")
    assert result.exit_code == 0
    assert "per position" in result.stdout
    assert "top-k overlap" in result.stdout
