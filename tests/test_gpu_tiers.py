"""The GPU engine's expert tiers against the all-resident engine: logits and greedy ids of speculative windows
with commits, for VRAM caches of 0 / some / all pairs, PCIe shares 0 / 0.5 / 1, split on and off; graph replay
against eager launches; the stall test's release."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from spec_windows import speculative_run

from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu

N_TOKENS = 40


def _rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _engine(model, **tiers):
    from strata_cli.engine.gpu import GPUEngine
    from strata_cli.engine.gpu.tiers import TierConfig

    return GPUEngine(model, tiers=TierConfig(**tiers) if tiers else None)


def _synthetic(tmp_path, preset, seed, ggml_type, **overrides):
    from strata_cli.synth import load_preset, write_model

    p = load_preset(preset).with_overrides(**overrides)
    path = tmp_path / f"{preset}-{seed}-{ggml_type}.gguf"
    write_model(path, p, seed=seed, ggml_type=ggml_type)
    return open_model(path)


def _models(fixture_dir, tmp_path):
    yield "fixture-q8_0", open_model(fixture_dir / "model-q8_0.gguf")
    yield "tiny-f16-5layers", _synthetic(tmp_path, "tiny", 11, "F16", layers=5, experts=12)
    yield "fixture-bf16", open_model(fixture_dir / "model-bf16.gguf")


CONFIGS = [dict(cache="0"), dict(cache="0", pcie_frac=0.5), dict(cache="0", pcie_frac=1.0),
           dict(cache="7"), dict(cache="7", pcie_frac=0.5), dict(cache="7", pcie_frac=1.0),
           dict(cache="7", split=True), dict(cache="0", pcie_frac=0.5, split=True), dict(cache="7", wait="stream")]


def test_tiers_equal_all_resident(fixture_dir, tmp_path):
    for name, model in _models(fixture_dir, tmp_path):
        tokens = np.random.default_rng(2).integers(0, model.geometry.n_vocab, N_TOKENS)
        base, base_ids = speculative_run(_engine(model), tokens, np.random.default_rng(5), 8)
        configs = CONFIGS if name == "fixture-q8_0" else CONFIGS[:1] + CONFIGS[4:5] + CONFIGS[7:8]
        for cfg in configs:
            eng = _engine(model, **cfg)
            assert eng.tiers is not None and not eng.tiers.all_resident
            got, ids = speculative_run(eng, tokens, np.random.default_rng(5), 8)
            err = _rel_err(got, base)
            assert err <= 1e-4, f"{name} {cfg}: max relative error {err:.2e}"
            np.testing.assert_array_equal(ids, base_ids, err_msg=f"{name} {cfg}")
            shares = eng.tier_host.history[-1]
            if cfg["cache"] == "0":
                assert shares["vram"] == 0
            if cfg.get("pcie_frac", 0) == 1.0:
                assert shares["cpu"] == 0 and shares["pcie"] > 0
            if cfg.get("pcie_frac", 0) == 0:
                assert shares["pcie"] == 0 and shares["cpu"] > 0


def test_cache_all_keeps_todays_graph(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    eng = _engine(model, cache="all")
    assert eng.tiers is None and "zero-doorbell" in eng.tier_note
    plain = _engine(model)
    assert eng.graph(4).summary().nodes == plain.graph(4).summary().nodes


def test_tiered_graph_replay_equals_eager(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    for cfg in (dict(cache="5", pcie_frac=0.5), dict(cache="5", pcie_frac=0.5, split=True)):
        eng = _engine(model, **cfg)
        runs = {}
        for eager in (True, False):
            eng.reset()
            rows = []
            for pos in range(0, 24, 6):
                rows.append(eng.run(tokens[pos:pos + 6], pos, eager=eager).logits)
                eng.commit(6, eager=eager)
            runs[eager] = np.concatenate(rows)
        np.testing.assert_array_equal(runs[True], runs[False], err_msg=str(cfg))


def test_stall_test_releases_and_a_fresh_engine_runs(fixture_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("STRATA_TEST_VERIFY_STALL", None)
    cmd = [sys.executable, "-m", "strata_cli", "stall-test", str(fixture_dir / "model-q8_0.gguf"), "--window", "2",
           "--timeout", "0.5", "--expert-cache", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("window 2 stalled at layer ") and "GPU waits released; streams idle after" in lines[0]
    idle_ms = float(lines[0].rsplit("after ", 1)[1].split()[0])
    assert idle_ms < 1000
    assert lines[1].startswith("a fresh engine ran a 4-token window")
