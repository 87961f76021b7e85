"""The layer split on the CPU: the plan (which layers, bytes per stage), the option checks, and the numpy engine
split into stages (engine/layer_split.py) against the one-engine run, exactly, across windows with commits."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from spec_windows import assert_same_state, committed_state, speculative_run

from strata_cli.cli import main
from strata_cli.engine import make_engine
from strata_cli.engine.layer_plan import (SplitConfig, balanced_ranges, layer_bytes, parse_layer_split, plan_split,
                                          split_config)
from strata_cli.engine.layer_split import ReferenceSplit
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.errors import InputError, OptionError
from strata_cli.model.gguf_file import open_model


@pytest.fixture(scope="module")
def model(fixture_dir):
    return open_model(fixture_dir / "model-f32.gguf")


def _brute_force(per, n, first, last):
    """The smallest largest-stage bytes over every way to cut len(per) layers into n non-empty ranges."""
    best = None
    for cuts in itertools.combinations(range(1, len(per)), n - 1):
        bounds = (0, *cuts, len(per))
        loads = [sum(per[a:b]) for a, b in zip(bounds, bounds[1:])]
        loads[0] += first
        loads[-1] += last
        best = max(loads) if best is None else min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_balanced_ranges_are_optimal_and_contiguous(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 11))
    per = [int(x) for x in rng.integers(1, 1000, L)]
    first, last = int(rng.integers(0, 3000)), int(rng.integers(0, 3000))
    for n in range(1, L + 1):
        ranges = balanced_ranges(per, n, first, last)
        assert len(ranges) == n and ranges[0][0] == 0 and ranges[-1][1] == L
        assert all(a < b for a, b in ranges) and all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))
        loads = [sum(per[a:b]) for a, b in ranges]
        loads[0] += first
        loads[-1] += last
        assert max(loads) == _brute_force(per, n, first, last), (per, n, ranges)


def test_layer_bytes_cover_the_file_and_the_resident_experts(model):
    per, first, last = layer_bytes(model)
    total = sum(info.n_bytes for info in model.tensors.values())
    assert sum(per) + first + last == total
    g = model.geometry
    none_resident = np.full((g.n_layers, g.n_expert), -1)
    per_dense, _, _ = layer_bytes(model, none_resident)
    experts = [sum(model.info(f"blk.{layer}.ffn_{p}_exps.weight").n_bytes for p in ("gate", "up", "down"))
               for layer in range(g.n_layers)]
    assert [a - b for a, b in zip(per, per_dense)] == experts
    half = none_resident.copy()
    half[:, : g.n_expert // 2] = 0
    per_half, _, _ = layer_bytes(model, half)
    assert [a - b for a, b in zip(per_half, per_dense)] == [e * (g.n_expert // 2) // g.n_expert for e in experts]


def test_plan_by_bytes_and_by_counts(model):
    L = model.geometry.n_layers
    assert [s.device for s in plan_split(SplitConfig(2), model, None)] == [None, None]  # the numpy path
    stages = plan_split(SplitConfig(2), model, 2)
    assert [s.device for s in stages] == [0, 1]
    assert stages[0].layers[0] == 0 and stages[0].layers[1] == stages[1].layers[0] and stages[1].layers[1] == L
    per, first, last = layer_bytes(model)
    assert sum(s.bytes for s in stages) == sum(per) + first + last
    assert max(s.bytes for s in stages) == _brute_force(per, 2, first, last)
    stages = plan_split(split_config("0,0,0", "1,2,5"), model, 1)
    assert [s.layers for s in stages] == [(0, 1), (1, 3), (3, L)] and [s.device for s in stages] == [0, 0, 0]


@pytest.mark.parametrize("gpus, split, message", [
    (None, "4,4", "--layer-split needs --gpus N"),
    ("0", None, "--gpus 0: give 1 or more"),
    ("two", None, "--gpus 'two': expected a device count"),
    ("0,", None, "an empty item"),
    ("0,-1", None, "device ids are 0 or more"),
    ("2", "4,2,2", "has 3 ranges for --gpus 2"),
    ("2", "4,0", "an empty range"),
    ("2", "4,x", "expected comma-separated layer counts"),
])
def test_split_options_refused_in_one_line(gpus, split, message):
    with pytest.raises(OptionError, match=message) as err:
        split_config(gpus, split)
    assert "\n" not in str(err.value)


def test_plan_refuses_what_the_model_or_host_lacks(model):
    L = model.geometry.n_layers
    with pytest.raises(OptionError, match=f"sums to 7 layers, the model has {L}"):
        plan_split(split_config("2", "3,4"), model, None)
    with pytest.raises(OptionError, match="--gpus 2: 1 CUDA device visible"):
        plan_split(split_config("2", None), model, 1)
    with pytest.raises(OptionError, match="--gpus 0,3: 2 CUDA devices visible"):
        plan_split(split_config("0,3", None), model, 2)
    with pytest.raises(OptionError, match=f"the model has {L} layers"):
        plan_split(split_config(str(L + 1), None), model, None)
    assert parse_layer_split(" 3, 5") == (3, 5)


# stage boundaries: one after the PLE layer (1), one at it, three stages, one stage holding one layer
SPLITS = [(1, 7), (2, 6), (4, 4), (1, 1, 6), (3, 1, 4), (2, 3, 2, 1)]


@pytest.mark.parametrize("counts", SPLITS)
def test_numpy_split_equals_one_engine_exactly(model, fixture_dir, counts):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    plan = plan_split(SplitConfig(len(counts), counts), model, None)
    split = ReferenceSplit(model, plan)
    whole = ReferenceEngine(model)
    for seed in (0, 1):
        got, got_ids = speculative_run(split, tokens, np.random.default_rng(seed), 9, allow_zero=True)
        want, want_ids = speculative_run(whole, tokens, np.random.default_rng(seed), 9, allow_zero=True)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_ids, want_ids)
        assert_same_state(committed_state(split), committed_state(whole), what=f"split {counts}")
    # a window run and not committed, then a different one: the split drops it as the one engine does
    split.reset()
    whole.reset()
    for eng in (split, whole):
        eng.run(tokens[:6], 0)
        eng.commit(6)
        eng.run(np.roll(tokens[6:13], 1), 6)  # dropped
    a, b = split.run(tokens[6:13], 6), whole.run(tokens[6:13], 6)
    np.testing.assert_array_equal(a.logits, b.logits)
    with pytest.raises(InputError, match="outside 0..7"):
        split.commit(8)
    stage_ms, hand_ms = split.stage_times[7][-1]
    assert len(stage_ms) == len(counts) and len(hand_ms) == len(counts) - 1 and min(stage_ms) > 0


def test_numpy_split_names_the_stage_that_went_nonfinite(model, fixture_dir):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:4]
    split = ReferenceSplit(model, plan_split(SplitConfig(2, (4, 4)), model, None))
    w = split.stages[1].w
    w.get("blk.5.attn_qkv.weight")
    w._f64["blk.5.attn_qkv.weight"] = np.full_like(w._f64["blk.5.attn_qkv.weight"], np.nan)
    result = split.run(tokens, 0)
    assert result.nonfinite == "layer 5 Gated DeltaNet"


def test_numpy_split_timer_times_every_stage_inside_the_window(model, fixture_dir):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    split = ReferenceSplit(model, plan_split(SplitConfig(3, (2, 3, 3)), model, None))
    timer = split.window_timer()
    for pos in range(0, 12, 4):
        ms, _ = timer(split, tokens[pos:pos + 4], pos, 4)
        stage_ms, hand_ms = split.stage_times[4][-1]
        assert len(stage_ms) == 3 and len(hand_ms) == 2 and 0 < sum(stage_ms) + sum(hand_ms) <= ms
    assert split.n_past == 12
    report = split.stage_report(4, 2)
    assert [r["layers"] for r in report] == ["0..1", "2..4", "5..7"] and report[-1]["handoff_ms_median"] is None
    assert report[0]["ms_median"] == float(np.median([w[0][0] for w in split.stage_times[4][-2:]]))


def test_make_engine_builds_the_numpy_split(model):
    from strata_cli.engine import Engine

    engine = make_engine(model, "cpu", split=split_config("3", None))
    assert isinstance(engine, ReferenceSplit) and isinstance(engine, Engine) and len(engine.stages) == 3
    assert [s.layers for s in engine.stages] == [p.layers for p in engine.plan]


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_logprobs_split_equals_unsplit(fixture_dir, tmp_cache):
    path = str(fixture_dir / "model-f32.gguf")
    base = _cli("logprobs", path, "--random", "24", "--window", "5", "--device", "cpu", "--draft-noise", "0.3")
    split = _cli("logprobs", path, "--random", "24", "--window", "5", "--device", "cpu", "--draft-noise", "0.3",
                 "--gpus", "3", "--layer-split", "2,3,3")
    assert base.exit_code == 0 and split.exit_code == 0, split.output
    rows = lambda out: [line for line in out.splitlines() if not line.startswith("#")]  # noqa: E731
    assert rows(split.stdout) == rows(base.stdout) and len(rows(base.stdout)) == 23
    assert "layer split: stage 0: layers 0..1" in split.stderr


def test_cli_verify_bench_reports_every_stage(fixture_dir, tmp_cache):
    out = _cli("verify-bench", str(fixture_dir / "model-f32.gguf"), "--device", "cpu", "--window", "1,4", "-r", "3",
               "--warmup", "0", "-d", "4", "--gpus", "2", "--format", "json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["rows"]
    L = open_model(fixture_dir / "model-f32.gguf").geometry.n_layers
    for row in rows:
        assert row["stage0_device"] is None and row["stage1_device"] is None  # numpy stages: no device
        a, b = (int(x) for x in row["stage0_layers"].split(".."))
        c, d = (int(x) for x in row["stage1_layers"].split(".."))
        assert a == 0 and c == b + 1 and d == L - 1
        assert row["stage0_ms_median"] > 0 and row["stage1_ms_median"] > 0
        assert row["stage0_handoff_ms_median"] >= 0 and row["stage1_handoff_ms_median"] is None
        assert row["stage0_read_bytes"] + row["stage1_read_bytes"] > 0


STAGE_KEYS = ("device", "layers", "ms_median", "ms_mean", "read_bytes", "weight_bytes", "handoff_ms_median")


def _table_rows(text: str, title: str) -> list[list[str]]:
    """The cells of the table titled `title` in table (ASCII, piped) or md output: its header row first."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().lstrip("# ") == title)
    rows = []
    for line in lines[at + 1:]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("| "):  # not a +---+ / |---| rule
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


@pytest.mark.parametrize("fmt", ["table", "md", "csv", "jsonl", "json"])
def test_cli_verify_bench_stages_in_every_printer(fixture_dir, tmp_cache, fmt):
    """Issue 21's item 3 on the numpy path: each stage's time, bytes and hand-off in every printer (table / md: the
    per-stage table, one row per T and stage; csv / json / jsonl: stageI_* keys), and a split without tiers prints no
    tier column."""
    import csv

    from strata_cli.tiers.stats import TIER_COLUMNS

    out = _cli("verify-bench", str(fixture_dir / "model-f32.gguf"), "--device", "cpu", "--window", "1,4", "-r", "2",
               "--warmup", "0", "-d", "4", "--gpus", "2", "--layer-split", "3,5", "--format", fmt)
    assert out.exit_code == 0, out.output
    tier_keys = {key for key, _, _ in TIER_COLUMNS} | {"expert_cache", "pcie_frac"}
    if fmt in ("table", "md"):
        header, *cells = _table_rows(out.stdout, "layer split: per stage")
        assert header == ["T", "stage", "device", "layers", "ms/window", "GB read", "weight GB", "hand-off ms"]
        assert [(c[0], c[1], c[3]) for c in cells] == [("1", "0", "0..2"), ("1", "1", "3..7"), ("4", "0", "0..2"),
                                                       ("4", "1", "3..7")]
        assert all(float(c[4]) > 0 and float(c[5]) > 0 for c in cells)
        assert [c[7] != "" for c in cells] == [True, False] * 2  # the last stage hands off nothing
        main_header = _table_rows(out.stdout, "verify windows")[0]
        assert not {h for _, h, _ in TIER_COLUMNS} & set(main_header + header)
        return
    text = out.stdout
    rows = (json.loads(text)["rows"] if fmt == "json" else [json.loads(line) for line in text.splitlines()]
            if fmt == "jsonl" else list(csv.DictReader(text.splitlines())))
    assert [int(r["window"]) for r in rows] == [1, 4]
    for row in rows:
        for i in (0, 1):
            assert all(f"stage{i}_{key}" in row for key in STAGE_KEYS), sorted(row)
            assert float(row[f"stage{i}_ms_median"]) > 0 and float(row[f"stage{i}_read_bytes"]) > 0
        assert row["stage0_layers"] == "0..2" and float(row["stage0_handoff_ms_median"]) >= 0
        assert not [k for k in row if k in tier_keys or k.split("_", 1)[-1] in tier_keys]


@pytest.mark.parametrize("args, message", [
    (["--layer-split", "4,4"], "--layer-split needs --gpus N"),
    (["--gpus", "2", "--layer-split", "3,4"], "sums to 7 layers, the model has 8"),
    (["--gpus", "2", "--layer-split", "8,0"], "an empty range"),
    (["--gpus", "9"], "the model has 8 layers"),
])
def test_cli_refuses_bad_splits_in_one_line(fixture_dir, tmp_cache, args, message):
    out = _cli("verify-bench", str(fixture_dir / "model-f32.gguf"), "--device", "cpu", "-r", "1", *args)
    assert out.exit_code == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_stage_window_bytes_add_up_to_the_window(model, rows):
    from strata_cli.analysis.traffic import window_bytes

    whole = window_bytes(model, rows)
    for counts in SPLITS:
        plan = plan_split(SplitConfig(len(counts), counts), model, None)
        parts = [window_bytes(model, rows, p.layers) for p in plan]
        for key in ("dense", "experts", "total"):
            assert sum(p[key] for p in parts) == pytest.approx(whole[key], rel=1e-12), (counts, key)
        assert all(p["total"] > 0 for p in parts)


def test_gpu_stage_arena_holds_its_layers_state_only(model):
    """engine/gpu/buffers.plan_buffers of a stage (arithmetic only, no device): the per-layer state of its own
    layers, the PLE buffers iff it holds the PLE layer, and the shared window buffers; together the stages hold
    every layer's state once."""
    from strata_cli.engine.gpu.buffers import plan_buffers

    g = model.geometry
    whole = {name for name, _, _ in plan_buffers(g, 64, 4).specs}
    per_layer = {n for n in whole if n.rsplit(".", 1)[-1].isdigit()}
    seen: list[str] = []
    for lo, hi in [(0, 1), (1, 4), (4, g.n_layers)]:
        names = {name for name, _, _ in plan_buffers(g, 64, 4, (lo, hi)).specs}
        mine = {n for n in names if n.rsplit(".", 1)[-1].isdigit()}
        assert all(lo <= int(n.rsplit(".", 1)[1]) < hi for n in mine)
        assert ("ple_history" in names) == (lo <= g.ple.layer < hi)
        assert {"R", "mixed", "block_out", "inj", "logits", "tokens", "positions"} <= names
        seen += sorted(mine)
    assert sorted(seen) == sorted(per_layer)
