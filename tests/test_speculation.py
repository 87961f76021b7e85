"""Measured speculation: the --draft-noise loop's acceptance histogram, mean accepted drafts and per-position
acceptance; verify-bench --acceptance-from prices windows with them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.errors import InputError
from strata_cli.analysis.logprobs import speculative_dump
from strata_cli.model.gguf_file import open_model
from strata_cli.analysis.speculation import Acceptance, LoopStats, acceptance_from_dump
from strata_cli.synth import load_preset, write_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.gguf"
    write_model(path, load_preset("tiny").with_overrides(layers=4, experts=4, vocab=64), seed=1, ggml_type="F32")
    return path


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def test_loop_stats_count_by_hand():
    stats = LoopStats(4)
    stats.record(4, 4)  # all 3 drafts accepted
    stats.record(4, 2)  # draft 1 accepted, draft 2 rejected (draft 3 never examined)
    stats.record(4, 1)  # draft 1 rejected
    stats.record(2, 2)  # a short last window: its one draft accepted
    assert stats.histogram == [1, 2, 0, 1]
    assert stats.offered == [4, 2, 1] and stats.accepted == [3, 1, 1]
    assert stats.per_position == [0.75, 0.5, 1.0]
    assert stats.mean_accepted == (3 + 1 + 0 + 1) / 4
    assert (stats.windows, stats.rows_fed, stats.rows_kept) == (4, 14, 9)


def test_expected_tokens_closed_form_and_measured():
    for a in (0.0, 0.3, 0.7, 0.95):
        for T in (1, 2, 5, 9):
            closed = (1 - a ** T) / (1 - a)
            assert Acceptance.assumed(a).expected_tokens(T) == pytest.approx(closed, rel=1e-12)
    assert Acceptance.assumed(1.0).expected_tokens(6) == 6
    measured = Acceptance((0.9, 0.5, 0.2), False, "x")
    assert measured.expected_tokens(4) == pytest.approx(1 + 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.2)
    assert measured.max_window() == 4


def test_draw_keep_follows_the_rates():
    acc = Acceptance((0.8, 0.25), False, "x")
    rng = np.random.default_rng(0)
    keeps = np.array([acc.draw_keep(rng, 3) for _ in range(20000)])
    assert np.mean(keeps) == pytest.approx(acc.expected_tokens(3), rel=0.02)
    assert np.mean(keeps >= 2) == pytest.approx(0.8, abs=0.01)


def test_loop_acceptance_matches_the_draft_noise(model):
    engine = ReferenceEngine(open_model(model))
    tokens = np.random.default_rng(0).integers(0, 64, 161)
    _, stats = speculative_dump(engine, tokens, 4, draft_noise=0.4, seed=3)
    assert sum(stats.histogram) == stats.windows and stats.rows_kept == len(tokens) - 1
    for rate, offered in zip(stats.per_position, stats.offered):
        assert offered > 10 and rate == pytest.approx(0.6, abs=0.2)  # a draft survives the noise w.p. 1 - P
    _, clean = speculative_dump(engine, tokens, 4, seed=3)
    assert clean.per_position == [1.0, 1.0, 1.0] and clean.histogram[:3] == [0, 0, 0]


def test_logprobs_reports_and_dumps_the_acceptance(model, tmp_path):
    tsv, js = tmp_path / "d.tsv", tmp_path / "d.json"
    common = ["logprobs", model, "--random", 60, "--window", 4, "--draft-noise", 0.3, "--seed", 2, "--device", "cpu"]
    result = run(*common, "-o", tsv)
    assert "per-position acceptance" in result.stderr and "histogram" in result.stderr
    run(*common, "--format", "json", "-o", js)
    spec = json.loads(js.read_text())["meta"]["speculation"]
    line = next(ln for ln in tsv.read_text().splitlines() if ln.startswith("# speculation "))
    assert json.loads(line[len("# speculation "):]) == spec
    assert len(spec["histogram"]) == 4 and sum(spec["histogram"]) == spec["windows"]
    assert spec["mean_accepted"] == pytest.approx(sum(k * n for k, n in enumerate(spec["histogram"])) / spec["windows"])
    for dump in (tsv, js):
        acc = acceptance_from_dump(dump)
        assert list(acc.rates) == pytest.approx([a / o for a, o in zip(spec["accepted"], spec["offered"])])
        assert acc.source == str(dump)


def test_verify_bench_uses_the_measured_acceptance(model, tmp_path):
    dump = tmp_path / "d.json"
    run("logprobs", model, "--random", 80, "--window", 4, "--draft-noise", 0.5, "--seed", 1, "--device", "cpu",
        "--format", "json", "-o", dump)
    rates = acceptance_from_dump(dump).rates
    doc = json.loads(run("verify-bench", model, "--device", "cpu", "-r", 2, "-d", 4, "--window", "1,2,4",
                         "--acceptance-from", dump, "--format", "json").stdout)
    rows = {r["window"]: r for r in doc["rows"]}
    assert rows[2]["expected_tokens"] == pytest.approx(1 + rates[0])
    assert rows[4]["expected_tokens"] == pytest.approx(1 + rates[0] + rates[0] * rates[1] +
                                                       rates[0] * rates[1] * rates[2])
    assert rows[4]["acceptance_source"] == str(dump) and rows[4]["acceptance"] is None
    assert rows[4]["acceptance_per_position"] == pytest.approx(list(rates))
    assumed = json.loads(run("verify-bench", model, "--device", "cpu", "-r", 2, "-d", 4, "--window", "2",
                             "--acceptance", 0.5, "--format", "json").stdout)["rows"][0]
    assert assumed["expected_tokens"] == pytest.approx(1.5) and assumed["acceptance_source"] == "assumed"


def test_acceptance_errors_are_one_line(model, tmp_path):
    dump = tmp_path / "d.json"
    run("logprobs", model, "--random", 20, "--window", 3, "--device", "cpu", "--format", "json", "-o", dump)
    no_stats = tmp_path / "plain.json"
    no_stats.write_text(json.dumps({"meta": {}, "rows": []}))
    w1 = tmp_path / "w1.tsv"
    run("logprobs", model, "--random", 20, "--window", 1, "--device", "cpu", "-o", w1)
    cases = [(["--window", "4", "--acceptance-from", dump], "up to T = 3", 1),
             (["--acceptance-from", dump, "--acceptance", "0.5"], "not both", 2),  # two options: a usage error
             (["--acceptance-from", no_stats], "no speculation statistics", 1),
             (["--acceptance-from", w1], "offered no drafts", 1),
             (["--acceptance-from", tmp_path / "missing.json"], "missing.json", 1)]
    for args, needle, code in cases:
        result = CliRunner().invoke(main, ["verify-bench", str(model), "--device", "cpu", "-r", "1",
                                           *map(str, args)])
        assert result.exit_code == code and needle in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(InputError, match="not a count"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"meta": {"speculation": {"offered": [2], "accepted": [3]}}}))
        acceptance_from_dump(bad)
