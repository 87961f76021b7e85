"""The GPU layer split (engine/gpu/layer_split.py) on one GPU: two and three stage engines over disjoint layer
ranges on the same device (`--gpus 0,0`), the hand-off through a device buffer, against the one-engine run;
graph replay against eager launches; verify-bench's per-stage record; the refusals. On a host with two GPUs the
same tests run with real devices where `_devices` finds them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from gpu_engines import gpu_engine, rel_err, synthetic_model
from spec_windows import assert_same_state, committed_state, speculative_run

from strata_cli.cli import main
from strata_cli.engine import make_engine
from strata_cli.engine.layer_plan import SplitConfig, plan_split, split_config
from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu

N_TOKENS = 48


def _n_visible() -> int:
    from strata_cli.gpu.runtime import cupy

    return int(cupy().cuda.runtime.getDeviceCount())


def _devices(n: int) -> tuple[int, ...]:
    """n stages: on n distinct devices where the host has them, else all on device 0."""
    return tuple(range(n)) if _n_visible() >= n else (0,) * n


def _split_engine(model, counts, devices=None, tiers=None):
    from strata_cli.engine.gpu.layer_split import GPUSplitEngine

    devices = devices or _devices(len(counts))
    plan = plan_split(SplitConfig(len(counts), tuple(counts), devices), model, _n_visible())
    return GPUSplitEngine(model, plan, tiers=tiers)


def _models(fixture_dir, tmp_path):
    yield "fixture-f32", open_model(fixture_dir / "model-f32.gguf"), [(1, 7), (4, 4), (2, 3, 3)]
    yield "fixture-q8_0", open_model(fixture_dir / "model-q8_0.gguf"), [(2, 6), (1, 1, 6)]
    yield "tiny-f16-6layers", synthetic_model(tmp_path, "tiny", 4, "F16", layers=6, experts=12), [(3, 3), (1, 4, 1)]


def test_split_equals_one_engine_across_windows_with_commits(fixture_dir, tmp_path):
    for name, model, splits in _models(fixture_dir, tmp_path):
        tokens = np.random.default_rng(0).integers(0, model.geometry.n_vocab, N_TOKENS)
        if model.geometry.eos_token_id is not None:
            tokens[N_TOKENS // 3] = model.geometry.eos_token_id
        with gpu_engine(model) as whole:
            want, want_ids = speculative_run(whole, tokens, np.random.default_rng(1), 16, allow_zero=True)
            want_state = committed_state(whole)
        for counts in splits:
            with _split_engine(model, counts) as split:
                got, got_ids = speculative_run(split, tokens, np.random.default_rng(1), 16, allow_zero=True)
                err = rel_err(got, want)
                assert err <= 1e-4, f"{name} split {counts}: max relative error {err:.2e}"
                np.testing.assert_array_equal(got_ids, want_ids, err_msg=f"{name} split {counts}")
                assert_same_state(committed_state(split), want_state, rtol=1e-4, what=f"{name} split {counts}")


# expert tiers per stage: (fixture, layer counts, tier options, which stages are tiered). --expert-cache N is per
# stage (16 experts a layer: "32" keeps a 2-layer stage all resident, its zero-doorbell graph, no tiers object)
TIER_SPLITS = [("q8_0", (3, 5), dict(cache="0", pcie_frac=0.5), (True, True)),
               ("q8_0", (2, 6), dict(cache="32"), (False, True)),
               ("q8_0", (5, 3), dict(cache="7", pcie_frac=1.0), (True, True)),
               ("bf16", (4, 4), dict(cache="9", pcie_frac=0.5, policy="lru"), (True, True)),
               ("q8_0", (1, 4, 3), dict(cache="1B"), (True, True, True))]


@pytest.mark.parametrize("kind,counts,tier_args,tiered", TIER_SPLITS,
                         ids=[f"{k}-{'-'.join(map(str, c))}-{'-'.join(f'{a}={v}' for a, v in t.items())}"
                              for k, c, t, _ in TIER_SPLITS])
def test_split_with_tiers_equals_one_engine_all_resident(fixture_dir, kind, counts, tier_args, tiered):
    from strata_cli.tiers.config import TierConfig

    model = open_model(fixture_dir / f"model-{kind}.gguf")
    g = model.geometry
    tokens = np.random.default_rng(2).integers(0, g.n_vocab, N_TOKENS)
    with gpu_engine(model) as whole:
        want, want_ids = speculative_run(whole, tokens, np.random.default_rng(3), 16, allow_zero=True)
        want_state = committed_state(whole)
    what = f"{kind} split {counts} {tier_args}"
    with _split_engine(model, counts, tiers=TierConfig(**tier_args)) as split:
        assert tuple(s.tiers is not None for s in split.stages) == tiered, what
        for s in split.stages:
            if s.tiers is not None:  # its own residency (other layers hold no slot), steps over its layers only
                lo, hi = s.layers
                assert (s.tiers.table_host[:lo] < 0).all() and (s.tiers.table_host[hi:] < 0).all()
                assert sorted(s.tiers.resident) == list(range(lo, hi))
                assert s.tiers.wait_ns.host.shape == ((hi - lo) * 2, 2)
                if tier_args["cache"].isdigit():  # an adaptive cache: with the copies still in flight
                    pending = len(s.tiers.fill.policy.pending) if s.tiers.fill is not None else 0
                    assert (s.tiers.table_host >= 0).sum() + pending == min(int(tier_args["cache"]),
                                                                             (hi - lo) * g.n_expert)
        got, got_ids = speculative_run(split, tokens, np.random.default_rng(3), 16, allow_zero=True)
        err = rel_err(got, want)
        assert err <= 1e-4, f"{what}: max relative error {err:.2e}"
        np.testing.assert_array_equal(got_ids, want_ids, err_msg=what)
        assert_same_state(committed_state(split), want_state, rtol=1e-4, what=what)
        n_windows = None
        for s in split.stages:
            if s.tiers is not None:
                history = s.tier_host.history
                n_windows = len(history) if n_windows is None else n_windows
                assert len(history) == n_windows > 0 and s.tier_host.windows == n_windows  # every window served
                lo, hi = s.layers
                assert all(h["vram"] + h["pcie"] + h["cpu"] == (hi - lo) * h["T"] * g.n_expert_used for h in history)
                assert sum(h["cpu"] + h["pcie"] for h in history) > 0  # misses were served by this stage's host
        assert "expert cache" in split.tier_note and "of layers" in split.tier_note


def test_split_graph_replay_equals_eager(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    with _split_engine(model, (3, 5)) as split:
        runs = {}
        for eager in (True, False):
            split.reset()
            rows = []
            for pos, T in ((0, 8), (8, 1), (9, 5), (14, 16)):
                rows.append(split.run(tokens[pos:pos + T], pos, eager=eager).logits)
                split.commit(T, eager=eager)
            runs[eager] = np.concatenate(rows)
        np.testing.assert_array_equal(runs[True], runs[False])
        assert set(split.capture_ms) == {1, 5, 8, 16}
        for s in split.stages:  # one captured graph per stage per T
            assert set(s.graphs) == {1, 5, 8, 16}


def test_stages_hold_only_their_layers(fixture_dir):
    model = open_model(fixture_dir / "model-f32.gguf")
    with _split_engine(model, (3, 5)) as split:
        first, last = split.stages
        assert "token_embd.weight" in first.w._raw and "token_embd.weight" not in last.w._raw
        assert "output.weight" in last.w._raw and "output.weight" not in first.w._raw
        assert all(int(n.split(".")[1]) < 3 for n in [*first.w._raw, *first.w._f32] if n.startswith("blk."))
        assert all(int(n.split(".")[1]) >= 3 for n in [*last.w._raw, *last.w._f32] if n.startswith("blk."))
        # layout GGGA GGGA: the first stage (layers 0..2) holds GDN state only, the last the attention layers 3, 7
        assert "S.0" in first.buf and "S.0" not in last.buf and "S.4" in last.buf
        assert "kc.3" not in first.buf and "kc.3" in last.buf and "kc.7" in last.buf
        assert first.has_ple and not last.has_ple  # the tiny model's PLE layer is 1


def test_split_timer_records_every_stage(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    with _split_engine(model, (2, 3, 3)) as split:
        timer = split.window_timer()
        split.reset()
        for pos in range(0, 12, 4):
            ms, host_ms = timer(split, tokens[pos:pos + 4], pos, 4)
            stage_ms, hand_ms = split.stage_times[4][-1]
            assert len(stage_ms) == 3 and len(hand_ms) == 2
            assert min(stage_ms) > 0 and min(hand_ms) >= 0 and sum(stage_ms) + sum(hand_ms) <= ms * 1.01 + 0.01
        assert split.n_past == 12
        report = split.stage_report(4, 3)
        assert [r["layers"] for r in report] == ["0..1", "2..4", "5..7"] and report[-1]["handoff_ms_median"] is None


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_verify_bench_split_record(fixture_dir, tmp_cache):
    out = _cli("verify-bench", str(fixture_dir / "model-q8_0.gguf"), "--device", "gpu", "--window", "1,4", "-r", "5",
               "--gpus", ",".join(map(str, _devices(2))), "--layer-split", "4,4", "--format", "json")
    assert out.exit_code == 0, out.output
    for row in json.loads(out.stdout)["rows"]:
        assert row["stage0_layers"] == "0..3" and row["stage1_layers"] == "4..7"
        assert row["stage0_ms_median"] > 0 and row["stage1_ms_median"] > 0 and row["stage0_handoff_ms_median"] >= 0
        assert 0 < row["stage0_read_bytes"] and 0 < row["stage1_read_bytes"]
        assert row["stage0_weight_bytes"] + row["stage1_weight_bytes"] > row["read_bytes"] * 0.5


def test_verify_bench_split_tier_stats_per_stage(fixture_dir, tmp_cache):
    """Tiers on every stage (a budget per GPU that holds nothing, half the misses over PCIe): each stage's tier
    columns in the json (its shares, bytes, waits, floor), none for the whole engine, and their bytes add up to the
    one-engine run of the same windows (same seed, same routing: the stages run the same kernels on the same R);
    the table's per-stage table has the tier columns. The CPU twin: tests/test_tier_stage_stats.py."""
    args = ["verify-bench", str(fixture_dir / "model-q8_0.gguf"), "--device", "gpu", "--window", "1,4", "-r", "3",
            "--expert-cache", "1B", "--pcie-frac", "0.5"]
    split_args = ["--gpus", ",".join(map(str, _devices(2))), "--layer-split", "4,4"]
    whole, split = _cli(*args, "--format", "json"), _cli(*args, *split_args, "--format", "json")
    assert whole.exit_code == 0 and split.exit_code == 0, split.output
    for one, row in zip(json.loads(whole.stdout)["rows"], json.loads(split.stdout)["rows"]):
        assert "vram_share" not in row and row["window"] == one["window"]
        for i in (0, 1):
            assert row[f"stage{i}_vram_share"] == 0 and row[f"stage{i}_vram_pairs"] == 0
            assert row[f"stage{i}_pcie_share"] + row[f"stage{i}_cpu_share"] == pytest.approx(1.0)
            assert row[f"stage{i}_pcie_mb"] > 0 and row[f"stage{i}_cpu_mb"] > 0 and row[f"stage{i}_pool_ms"] > 0
            assert row[f"stage{i}_gpu_ms"] > 0 and row[f"stage{i}_wait_flag_ms"] >= 0
            assert row[f"stage{i}_tier_floor_ms"] > 0
        for key in ("pcie_mb", "cpu_mb"):
            assert row[f"stage0_{key}"] + row[f"stage1_{key}"] == pytest.approx(one[key], rel=1e-9), key
    table = _cli(*args, *split_args)
    assert table.exit_code == 0, table.output
    assert "layer split: per stage" in table.stdout and "CPU MB" in table.stdout and "wait flag ms" in table.stdout


def test_logprobs_split_equals_unsplit_on_gpu(fixture_dir, tmp_cache):
    path = str(fixture_dir / "model-f32.gguf")
    args = ["logprobs", path, "--random", "30", "--window", "6", "--device", "gpu", "--format", "json"]
    base, split = _cli(*args), _cli(*args, "--gpus", ",".join(map(str, _devices(3))))
    assert base.exit_code == 0 and split.exit_code == 0, split.output
    a, b = json.loads(base.stdout)["rows"], json.loads(split.stdout)["rows"]
    assert [r["top_id"] for r in a] == [r["top_id"] for r in b]
    assert max(abs(x["lp_target"] - y["lp_target"]) for x, y in zip(a, b)) <= 1e-3


def test_split_refusals_on_gpu(fixture_dir, tmp_cache):
    model = open_model(fixture_dir / "model-f32.gguf")
    n = _n_visible()
    out = _cli("verify-bench", str(fixture_dir / "model-f32.gguf"), "--device", "gpu", "-r", "1",
               "--gpus", str(n + 1))
    assert out.exit_code == 2
    assert f"{n} CUDA device{'s' if n != 1 else ''} visible" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    from strata_cli.tiers.config import TierConfig

    # expert tiers combine with --gpus: a budget per GPU that holds nothing is fine (every expert missed) ...
    with make_engine(model, "gpu", tiers=TierConfig(cache="1B"), split=split_config("0,0", None)) as split:
        assert all(s.tiers is not None and (s.tiers.table_host < 0).all() for s in split.stages)
    out = _cli("verify-bench", str(fixture_dir / "model-q8_0.gguf"), "--device", "gpu", "-r", "1", "--window", "2",
               "--gpus", "0,0", "--expert-cache", "1B", "--pcie-frac", "0.5")
    assert out.exit_code == 0, out.output
    said = " ".join(out.stderr.split())  # (the console wraps long lines at the terminal's width)
    for i, layers in enumerate(("0..3", "4..7")):  # one line per stage: its own residency, nothing in VRAM
        assert f"stage {i} (layers {layers}): expert cache: 0 of 64 (layer, expert) pairs of layers {layers}" \
            in said, out.stderr
    # ... and a profile of another model is refused as without --gpus
    from strata_cli.tiers.expert_profile import ExpertProfile, save_profile

    g = model.geometry
    path = tmp_cache / "other.yaml"
    save_profile(ExpertProfile(n_layers=g.n_layers + 1, n_expert=g.n_expert, ranked=np.zeros((1, 2), np.int32),
                               slots=1, counts=np.ones((g.n_layers + 1, g.n_expert), np.int64)), path)
    out = _cli("verify-bench", str(fixture_dir / "model-f32.gguf"), "--device", "gpu", "-r", "1", "--gpus", "0,0",
               "--expert-cache", "3", "--expert-profile", str(path))
    assert out.exit_code == 1 and "profile of another geometry" in out.stderr, out.output
    assert len(out.stderr.strip().splitlines()) == 1
