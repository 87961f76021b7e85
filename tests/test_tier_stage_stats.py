"""verify-bench's expert-tier columns per stage of the layer split, on the CPU. Each stage is a tiered stand-in
engine over its layers (tests/test_tier_windows_cpu.py: the real ExpertTiers and TierHost, numpy kernels, a faked
driver) behind a SplitEngine; its windows are served by its own tier host. The records' stage rows, filled as
verify-bench fills them (commands/_stages.add_stages), are checked against the same windows through one tiered
engine over every layer, against what each stage's host counted, and in the json and table / md printers."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from test_tier_windows_cpu import Reference, _run_window, _stream_order, _tiered, bind_fakes

from strata_cli.commands._stages import add_stages, emit_stage_table
from strata_cli.engine.layer_plan import SplitConfig, plan_split
from strata_cli.engine.layer_split import SplitEngine
from strata_cli.model.gguf_file import open_model
from strata_cli.report.present import emit
from strata_cli.report.records import BenchRecord
from strata_cli.tiers.config import TierConfig
from strata_cli.tiers.stats import TIER_COLUMNS, add_tier_stats, tier_floor_ms

SIZES = [4, 1, 3, 4, 1, 4, 1]  # the records' T = 1 and 4 keep their last N_WINDOWS windows; T = 3 is in no record
N_WINDOWS = 2
COUNTS = (3, 5)
COPY_RATE = 1e11  # bytes/s: the device copy rate a GPU record carries (the stage's floor)


def _serve(monkeypatch, model, cfg, layers, ref):
    """A tiered stand-in engine over layers [lo, hi) (None: every layer) that served every window of ref."""
    engine, kernels, rt = _tiered(monkeypatch, model, cfg, layers)
    kernels.ref = ref
    for moes, T in zip(ref.by_window, SIZES):
        bind_fakes(monkeypatch, kernels, rt)  # this engine's launches and driver (the last _tiered bound its own)
        ref.current = moes
        _run_window(monkeypatch, engine, kernels, rt, moes, T)
    return engine


def _records():
    return [BenchRecord(window=T, samples_ms=[9.0], host_samples_ms=[1.0], kept=[1], expected_tokens=1.0,
                        copy_bytes_per_s=COPY_RATE) for T in (1, 4)]


def _split_run(monkeypatch, fixture_dir, tier_args):
    """(model, the split's records, its stage engines, the whole-model engine's records) of the same windows."""
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    windows = [tokens[sum(SIZES[:i]):sum(SIZES[:i + 1])] for i in range(len(SIZES))]
    ref = Reference(model, windows, monkeypatch)
    cfg = TierConfig(**tier_args, timeout_s=10.0)
    plan = plan_split(SplitConfig(len(COUNTS), COUNTS), model, None)
    for layers in [p.layers for p in plan] + [(0, model.geometry.n_layers)]:  # recorded before any _tiered binds
        for T in range(1, 17):  # (every T _tiered asks for)
            _stream_order(monkeypatch, model.geometry, T, 1, layers)
    stages = [_serve(monkeypatch, model, cfg, p.layers, ref) for p in plan]
    whole = _serve(monkeypatch, model, cfg, None, ref)
    for s in stages:
        s.n_ctx, s.capabilities = 64, None  # what SplitEngine reads of its first stage besides g, max_t, model
    split = SplitEngine(stages, plan)
    for w, T in enumerate(SIZES):  # each stage's window ms (its gpu_ms is that less its waits)
        split._record_times(T, [1.0 + w, 2.0 + w], [0.125])
    records, whole_records = _records(), _records()
    add_stages(records, split, model, N_WINDOWS)
    add_tier_stats(whole_records, whole, N_WINDOWS)
    for engine in [*stages, whole]:
        engine.tier_host.close()
        engine.tiers.close()
    return model, records, stages, whole_records


def _counted(stage, T):
    """The means over the stage's last N_WINDOWS windows of T rows as its own tier host counted them."""
    rows = [h for h in stage.tier_host.history if h["T"] == T][-N_WINDOWS:]
    assert len(rows) == N_WINDOWS
    entries = (stage.layers[1] - stage.layers[0]) * T * stage.g.n_expert_used
    assert all(h["vram"] + h["pcie"] + h["cpu"] == entries for h in rows)
    return {k: float(np.mean([h[k] / entries for h in rows])) for k in ("vram", "pcie", "cpu")} | \
        {k: float(np.mean([h[k] for h in rows])) / 1e6 for k in ("pcie_bytes", "cpu_bytes")}


def _check_own_counts(records, stages, n_cached):
    """Each stage row's tier columns are its own host's counts over its own layers."""
    for rec in records:
        for row, stage in zip(rec.stages, stages):
            t, mine = row["tiers"], _counted(stage, rec.window)
            n_layers = stage.layers[1] - stage.layers[0]
            assert t["vram_share"] == pytest.approx(mine["vram"]) and t["cpu_share"] == pytest.approx(mine["cpu"])
            assert t["pcie_share"] == pytest.approx(mine["pcie"])
            assert t["pcie_mb"] == pytest.approx(mine["pcie_bytes"]) and t["cpu_mb"] == pytest.approx(mine["cpu_bytes"])
            # the hit rate's denominator: the stage's own (layer, expert) pairs, not the model's
            assert t["vram_pairs"] == pytest.approx(n_cached / (n_layers * stage.g.n_expert))
            waits = t["wait_b_ms"] + t["wait_flag_ms"]
            assert t["gpu_ms"] == pytest.approx(max(row["ms_mean"] - waits, 0.0))
            floor = row["read_bytes"] / COPY_RATE * 1e3
            assert t["tier_floor_ms"] == pytest.approx(tier_floor_ms(floor, t["cpu_mb"] * 1e6, t["pcie_mb"] * 1e6))


def test_stage_tier_stats_add_up_to_the_unsplit_run(monkeypatch, fixture_dir):
    """Nothing cached (the stages' residency and the whole model's are the same: none), half the misses over PCIe:
    every layer's step plans the same entries split or not, so the stages' bytes sum to the whole run's and their
    shares, weighted by their layers, are its shares."""
    model, records, stages, whole = _split_run(monkeypatch, fixture_dir, dict(cache="0", pcie_frac=0.5))
    L = model.geometry.n_layers
    for rec, one in zip(records, whole):
        rows = [row["tiers"] for row in rec.stages]
        for key in ("pcie_mb", "cpu_mb"):
            assert sum(r[key] for r in rows) == pytest.approx(one.tiers[key], rel=1e-12), (rec.window, key)
            assert all(r[key] > 0 for r in rows)
        for key in ("vram_share", "pcie_share", "cpu_share"):
            weighted = sum(r[key] * n for r, n in zip(rows, COUNTS)) / L
            assert weighted == pytest.approx(one.tiers[key], rel=1e-12), (rec.window, key)
        assert all(r["vram_share"] == 0 and r["pcie_frac"] == 0.5 for r in rows)
    _check_own_counts(records, stages, 0)


def test_stage_tier_stats_in_json_and_table(monkeypatch, fixture_dir, capsys):
    """A cache per stage (7 pairs each of its own layers): the hit rate of each stage's own pairs; every tier
    column per stage in the json rows (flat stageI_* keys, no whole-engine tier keys), and in the table / md
    printers' stage table, one row per T and stage."""
    _, records, stages, _ = _split_run(monkeypatch, fixture_dir, dict(cache="7", pcie_frac=0.5))
    _check_own_counts(records, stages, 7)
    assert sum(row["tiers"]["vram_share"] for rec in records for row in rec.stages) > 0
    out = io.StringIO()
    emit([rec.flat() for rec in records], None, "json", out=out)
    rows = json.loads(out.getvalue())["rows"]
    for row, rec in zip(rows, records):
        assert "vram_share" not in row and "cpu_mb" not in row  # a split has no whole-engine tiers
        for i, stage in enumerate(rec.stages):
            for key, _, _ in TIER_COLUMNS:
                assert row[f"stage{i}_{key}"] == stage["tiers"][key], (i, key)
            assert row[f"stage{i}_expert_cache"] == "7"
    capsys.readouterr()
    emit_stage_table(records, "md")
    lines = capsys.readouterr().out.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header[:8] == ["T", "stage", "device", "layers", "ms/window", "GB read", "weight GB", "hand-off ms"]
    assert header[8:] == [h for _, h, _ in TIER_COLUMNS]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[1:]]
    assert [(c[0], c[1], c[3]) for c in cells] == [("1", "0", "0..2"), ("1", "1", "3..7"), ("4", "0", "0..2"),
                                                   ("4", "1", "3..7")]
    cpu_mb = header.index("CPU MB")
    assert [c[cpu_mb] for c in cells] == [f"{row['tiers']['cpu_mb']:.2f}" for rec in records for row in rec.stages]
    emit_stage_table(records, "table")
    out = capsys.readouterr().out
    assert "layer split: per stage" in out and "wait flag ms" in out and "PCIe MB" in out


def test_a_stage_without_tiers_leaves_its_tier_cells_empty(capsys):
    """One stage tiered, the other all resident (its experts fit its budget: no tiers): the stage table has the tier
    columns, filled on the tiered stage's row only; the flat row has tier keys of that stage only."""
    rec = BenchRecord(window=2, samples_ms=[1.0], host_samples_ms=[1.0], kept=[1], expected_tokens=1.0)
    base = dict(device=0, weight_bytes=10, ms_median=1.0, ms_mean=1.0, read_bytes=5)
    rec.stages = [dict(stage=0, layers="0..3", handoff_ms_median=0.1, **base),
                  dict(stage=1, layers="4..7", handoff_ms_median=None, **base, tiers={"cpu_mb": 1.5, "swaps": 0.0})]
    emit_stage_table([rec], "md")
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header, *cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    at = header.index("CPU MB")
    assert [c[at] for c in cells] == ["", "1.50"] and [c[header.index("swaps")] for c in cells] == ["", "0.0"]
    row = rec.flat()
    assert row["stage1_cpu_mb"] == 1.5 and "stage0_cpu_mb" not in row and "cpu_mb" not in row
