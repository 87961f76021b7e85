"""The profiling variant of the window graph on the device: same numbers as the normal graph, the normal graph
without stamps, every planned stamp written in order inside the event-timed window; `strata profile` and
STRATA_VERIFY_PROFILE end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu

STAMP = "stamp_globaltimer"


def _engine(fixture_dir):
    from strata_cli.engine.gpu import GPUEngine

    return GPUEngine(open_model(fixture_dir / "model-q8_0.gguf"))


def _run(eng, tokens, T, profile, eager=False):
    """Windows of T tokens over `tokens`, every row kept: logits and ids of each."""
    eng.reset()
    logits, ids = [], []
    for pos in range(0, len(tokens) - T + 1, T):
        eng.stage_window(tokens[pos:pos + T])
        with eng.stream:
            eng.buf["logits"].fill(np.nan)
        eng.launch_window(T, eager=eager, profile=profile)
        eng.stream.synchronize()
        logits.append(eng.buf["logits"][:T].get())
        ids.append(eng.stage.out_ids.host[:T].copy())
        eng.launch_commit(T)
        eng.stream.synchronize()
        eng.n_past += T
    return np.concatenate(logits), np.concatenate(ids)


@pytest.mark.parametrize("T", [1, 8])
def test_profiling_graph_equals_normal_graph(fixture_dir, T):
    eng = _engine(fixture_dir)
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:32].astype(np.int64)
    normal = _run(eng, tokens, T, profile=False)
    stamped = _run(eng, tokens, T, profile=True)
    eager = _run(eng, tokens, T, profile=True, eager=True)
    assert np.isfinite(normal[0]).all()
    for got in (stamped, eager):
        np.testing.assert_array_equal(got[0], normal[0])
        np.testing.assert_array_equal(got[1], normal[1])


def test_normal_graph_has_no_stamps_and_the_profile_graph_one_per_stage(fixture_dir):
    eng = _engine(fixture_dir)
    g = eng.g
    for T in (1, 4):
        normal, prof = eng.graph(T).summary(), eng.graph(T, profile=True).summary()
        plan = eng.profile_plans[T]
        assert STAMP not in dict(normal.kinds)
        assert dict(prof.kinds)[STAMP] == len(plan.slots)
        assert prof.nodes == normal.nodes + len(plan.slots)
        rest = {k: c for k, c in prof.kinds if k != STAMP}
        assert rest == dict(normal.kinds)
    plan = eng.profile_plans[1]
    assert plan.stages[0] == "begin" and plan.stages[-1] == "argmax"
    assert plan.stages[1:3] == ["ple", "embed"]  # the PLE's n-gram rows and key / value GEMV: the window's inputs
    for layer in range(g.n_layers):
        stages = [s for s, lay in zip(plan.stages, plan.layers) if lay == layer]
        # the previous layer's MoE write goes into the first read's norm (the PLE layer: with the PLE's mix)
        first = "hc0-norm" if layer == 0 else "hc0-write+norm"
        assert stages[:3] == [first, "hc0-down", "hc-read0"]
        assert ("gdn-mix" in stages) == (not g.layer_is_attn[layer])
        assert ("qsa-mix" in stages) == bool(g.layer_is_attn[layer])
        # the shared expert is an entry of the routed experts' launches (its weights appended to theirs)
        for stage in ("out-proj", "hc1-write+norm", "hc-read1", "router", "experts", "gap"):
            assert stage in stages, (layer, stage)


@pytest.mark.parametrize("T", [1, 8])
def test_stamps_are_ordered_and_inside_the_event_time(fixture_dir, T):
    from strata_cli.analysis.speculation import Acceptance
    from strata_cli.engine.stage_timing import aggregate, stage_durations
    from strata_cli.analysis.window_timing import profile_windows

    eng = _engine(fixture_dir)
    run = profile_windows(eng, T, 6, 16, 1, Acceptance.assumed(0.7))
    plan, stamps = run["plan"], run["stamps"]
    assert stamps.shape == (6, eng.buf["stamps"].shape[0])
    t = stamps[:, plan.slots].astype(np.int64)
    assert (t > 0).all()
    assert (np.diff(t, axis=1) >= 0).all()
    span_ms = (t[:, -1] - t[:, 0]) / 1e6
    assert (span_ms <= run["event_ms"] + 0.002).all()  # the events bracket the graph (globaltimer granularity)
    np.testing.assert_array_equal(stage_durations(stamps, plan.slots).sum(axis=1), t[:, -1] - t[:, 0])
    rep = aggregate(stamps, plan, run["event_ms"], T)
    assert 0 < rep.stamped_ms <= rep.event_ms + 0.002


def test_profile_command_and_graph_nodes_profile(fixture_dir):
    model = str(fixture_dir / "model-q8_0.gguf")
    runner = CliRunner()
    res = runner.invoke(main, ["profile", model, "--window", "4", "-r", "5", "-d", "8", "--per-layer",
                               "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    meta, rows = doc["meta"], doc["rows"]
    groups = {r["group"] for r in rows}
    assert {"GDN", "QSA", "head", "total"} <= groups
    stamped = next(r["ms"] for r in rows if r["group"] == "total" and r["stage"] == "stamped")
    assert stamped == pytest.approx(meta["stamped_ms"]) and meta["event_ms"] >= stamped - 0.002
    assert any(r["layer"] == "0" for r in rows)
    table = runner.invoke(main, ["profile", model, "--window", "1", "--windows", "3", "--context", "4"])  # old names
    assert table.exit_code == 0 and "event-timed" in table.stdout and "█" in table.stdout
    nodes = runner.invoke(main, ["graph-nodes", model, "--window", "2", "--profile", "--format", "json"])
    assert nodes.exit_code == 0
    kinds = {r["node"]: r["count"] for r in json.loads(nodes.stdout)["rows"]}
    assert kinds[STAMP] > 0


def test_verify_profile_env_prints_the_summary(fixture_dir, monkeypatch):
    from strata_cli.engine import stage_timing

    monkeypatch.setenv("STRATA_VERIFY_PROFILE", "1")
    monkeypatch.setattr(stage_timing, "ACTIVE", [])
    model = str(fixture_dir / "model-q8_0.gguf")
    res = CliRunner().invoke(main, ["verify-bench", model, "--device", "gpu", "--window", "1,4", "-r", "3",
                                    "-d", "8", "--format", "json"])
    assert res.exit_code == 0, res.output
    json.loads(res.stdout)  # the summary goes to stderr: stdout stays one JSON document
    lines = [line for line in res.stderr.splitlines() if line.startswith("strata verify profile")]
    # the context's prefill windows are windows too (T = 8 here): one line per window size that ran
    assert {"strata verify profile T=1", "strata verify profile T=4"} <= {line.split(":")[0] for line in lines}
    assert all(" GDN layers: " in line and " | QSA layers: " in line and "ms/window over" in line for line in lines)
    res = CliRunner().invoke(main, ["logprobs", model, "--random", "12", "--window", "4", "--device", "gpu",
                                    "--format", "tsv"])
    assert res.exit_code == 0, res.output
    assert "strata verify profile T=4:" in res.stderr


@pytest.mark.parametrize("T", [1, 8])
def test_profile_stage_floors(fixture_dir, T):
    """Each stage's bytes, floor and x floor: the stages' bytes sum to meta.read_bytes; their weights + experts are
    verify-bench's read_bytes of the same window plus what the device's copies add (tests/test_stage_bytes.py holds
    that growth to the uploads on the CPU); no stage of more than 1 MB beats its floor (a stage under 0.9x would read
    fewer bytes than the ledger counts, or the copy rate is off)."""
    model = str(fixture_dir / "model-q8_0.gguf")
    runner = CliRunner()
    res = runner.invoke(main, ["profile", model, "--window", str(T), "-r", "20", "-d", "32", "--per-layer",
                               "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    meta, rows = doc["meta"], doc["rows"]
    assert meta["copy_bytes_per_s"] > 1e11 and meta["floor_ms"] == pytest.approx(
        meta["read_bytes"] / meta["copy_bytes_per_s"] * 1e3)
    stages = [r for r in rows if r["layer"] == "all" and r["stage"] != "(all stages)"]
    per_layer = [r for r in rows if r["layer"] not in ("all", "")]
    for group in (stages, per_layer):
        assert sum(r["bytes"] for r in group) == pytest.approx(meta["read_bytes"])
    assert meta["read_bytes"] == pytest.approx(meta["weight_bytes"] + meta["expert_bytes"] + meta["state_bytes"])
    bench = runner.invoke(main, ["verify-bench", model, "--device", "gpu", "--window", str(T), "-r", "3", "-d", "32",
                                 "--format", "json"])
    assert bench.exit_code == 0, bench.output
    record = next(r for r in json.loads(bench.stdout)["rows"] if r["window"] == T)
    assert record["read_bytes"] == pytest.approx(meta["window_read_bytes"], abs=1)
    growth = meta["weight_bytes"] + meta["expert_bytes"] - record["read_bytes"]
    assert growth == pytest.approx(meta["upload_growth_bytes"], abs=1) and 0 <= growth < 0.1 * record["read_bytes"]
    # stages, layers, the groups' sums and the window's: the fixture's window reads 2.9 MB at T = 1 (5 at T = 8)
    big = [r for r in rows if r["bytes"] and r["bytes"] > 1e6]
    assert any(r["stage"] == "event-timed window" for r in big)
    for r in rows:
        if r["bytes"]:
            assert r["floor_us"] == pytest.approx(r["bytes"] / meta["copy_bytes_per_s"] * 1e6)
            assert r["x_floor"] == pytest.approx(r["ms"] * 1e3 / r["floor_us"])
    assert all(r["x_floor"] >= 0.9 for r in big), [(r["layer"], r["stage"], r["x_floor"]) for r in big]
    table = runner.invoke(main, ["profile", model, "--window", str(T), "-r", "3", "-d", "8"])
    assert table.exit_code == 0 and "x floor" in table.stdout and "floor:" in table.stdout
