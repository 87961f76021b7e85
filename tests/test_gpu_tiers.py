"""The GPU engine's expert tiers against the all-resident engine: logits and greedy ids of speculative windows
with commits, for VRAM caches of 0 / some / all pairs, PCIe shares 0 / 0.5 / 1; graph replay
against eager launches; the stall test's release."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gpu_engines import rel_err, synthetic_model, tiered_engine
from spec_windows import speculative_run

from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu

N_TOKENS = 40


def _model(name, fixture_dir, tmp_path):
    if name == "tiny-f16-5layers":
        return synthetic_model(tmp_path, "tiny", 11, "F16", layers=5, experts=12)
    return open_model(fixture_dir / f"model-{name.split('-')[1]}.gguf")


CONFIGS = [dict(cache="0"), dict(cache="0", pcie_frac=0.5), dict(cache="0", pcie_frac=1.0),
           dict(cache="7"), dict(cache="7", pcie_frac=0.5), dict(cache="7", pcie_frac=1.0),
           dict(cache="7", wait="stream"), dict(cache="7", pcie_frac="auto"), dict(cache="0", pcie_frac="auto")]
FEW = [0, 1, 4, 7]  # cache 0 / some, PCIe 0 / 0.5 / auto


def _equal_all_resident(name, model, configs, n_ctx=None, n_tokens=N_TOKENS):
    """Every config's speculative windows with commits (draft noise) against the all-resident engine's."""
    tokens = np.random.default_rng(2).integers(0, model.geometry.n_vocab, n_tokens)
    with tiered_engine(model, n_ctx) as base_engine:
        base, base_ids = speculative_run(base_engine, tokens, np.random.default_rng(5), 8)
    for cfg in configs:
        eng = tiered_engine(model, n_ctx, **cfg)
        try:
            assert eng.tiers is not None and not eng.tiers.all_resident
            got, ids = speculative_run(eng, tokens, np.random.default_rng(5), 8)
            err = rel_err(got, base)
            assert err <= 1e-4, f"{name} {cfg}: max relative error {err:.2e}"
            np.testing.assert_array_equal(ids, base_ids, err_msg=f"{name} {cfg}")
            served = eng.tier_host.history
            total = {key: sum(w[key] for w in served) for key in ("vram", "pcie", "cpu")}
            if cfg["cache"] == "0":
                assert total["vram"] == 0
            frac = eng.tiers.cfg.pcie_frac
            if cfg.get("pcie_frac") == "auto":  # the model's choice on the rates measured (0 where PCIe loses)
                from strata_cli.tiers.share import best_pcie_frac

                # an auto share that resolved to 0 at setup builds --pcie-frac 0's config, no rates
                # (tiers/setup.resolved_config); one the measured copy path dropped keeps them (engine/gpu/tiers.py)
                rates = eng.tiers.cfg.rates
                assert (frac == 0) if rates is None else (frac == best_pcie_frac(rates) < 1), (frac, rates)
                assert eng.tiers.pcie == (frac > 0)
            assert isinstance(frac, float)
            if frac == 1.0:
                assert total["cpu"] == 0 and total["pcie"] > 0
            if frac == 0:
                assert total["pcie"] == 0 and total["cpu"] > 0
            yield cfg, eng, total
        finally:  # a failed check too: a live engine's page-locked experts would fail the next test's
            eng.close()  # before the next engine is built (engine.close() releases threads and pinned memory)


@pytest.mark.parametrize("name,configs", [("fixture-q8_0", CONFIGS[:6]), ("fixture-q8_0", CONFIGS[6:]),
                                          ("tiny-f16-5layers", [CONFIGS[i] for i in FEW]),
                                          ("fixture-bf16", [CONFIGS[i] for i in FEW])],
                         ids=["fixture-q8_0-a", "fixture-q8_0-b", "tiny-f16-5layers", "fixture-bf16"])
def test_tiers_equal_all_resident(fixture_dir, tmp_path, name, configs):
    for _ in _equal_all_resident(name, _model(name, fixture_dir, tmp_path), configs):
        pass


@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q2_K"])
def test_scaled_flash_next_equals_all_resident(tmp_path, ggml_type):
    """The Flash-Next geometry (hidden 2560, 10 experts per row, QSA every 4th layer, PLE) shrunk to 4 layers of 12
    experts: at T = 1 a layer misses 10 distinct experts, so auto keeps a CPU share (and sends a PCIe share where the
    rates measured here make it pay: tests/test_gpu_tiers_pcie.py forces that case). Q2_K:
    the benchmark file's block types (Q2_K gate/up, Q4_0 down), so the VRAM slots and the PCIe staging views go
    through the one-launch gate/up GEMV of a block type, and the pool through its K-quant kernels."""
    model = synthetic_model(tmp_path, "flash-next", 3, ggml_type, layers=4, experts=12, vocab=512, ngram_vocab=1000)
    configs = [dict(cache="0", pcie_frac="auto"), dict(cache="0"), dict(cache="0", pcie_frac=1.0),
               dict(cache="20", pcie_frac=0.5)]
    if ggml_type != "Q8_0":
        configs = configs[::3]
    for cfg, eng, total in _equal_all_resident(f"flash-next-L4-E12-{ggml_type}", model, configs, n_ctx=64,
                                               n_tokens=24):
        if cfg.get("pcie_frac") == "auto":
            assert (total["pcie"] > 0) == (eng.tiers.cfg.pcie_frac > 0) and total["cpu"] > 0, total


@pytest.mark.parametrize("seed,ggml_type", [(61, "F32"), (62, "BF16")])
def test_random_geometries_equal_all_resident(tmp_path, seed, ggml_type):
    from random_models import random_preset, write_random

    rng = np.random.default_rng(seed)
    model = write_random(tmp_path, random_preset(rng, num_experts=int(rng.integers(6, 13))), seed, ggml_type)
    configs = [dict(cache="0", pcie_frac="auto"), dict(cache="3", pcie_frac=0.5), dict(cache="0")]
    for _ in _equal_all_resident(f"random-{seed}-{ggml_type}", model, configs, n_ctx=64):
        pass


@pytest.mark.parametrize("cache", ["auto", "all", "0", "7"])
def test_gpu_routing_counts_equal_numpy(fixture_dir, cache):
    """make-profile --device gpu --expert-cache CACHE: the picks are the numpy engine's wherever the experts live:
    all resident (auto on any card holds the fixture's; the doorbell-free graph with its route tap), none (every
    step rings the host) or some (the host is rung with the VRAM-served picks too)."""
    from strata_cli.engine.routing import count_routing

    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:24]
    gpu, cpu = count_routing(model, tokens, 8, 64, device="gpu", cache=cache), count_routing(model, tokens, 8, 64)
    g = model.geometry
    assert gpu.sum() == cpu.sum() == len(tokens) * g.n_layers * g.n_expert_used
    assert np.minimum(gpu, cpu).sum() >= 0.98 * cpu.sum()  # a near-tie in the router may flip a pick


def test_counting_engine_all_resident_keeps_todays_graph_plus_its_tap(fixture_dir):
    """auto on the fixture: every expert in VRAM, no tiers, the doorbell-free graph; the counting run's graph is
    that graph plus one copy node a layer (its route tap), and verify-bench's engine captures none of them."""
    from strata_cli.engine.routing import _routing_engine

    model = open_model(fixture_dir / "model-q8_0.gguf")
    engine, tap = _routing_engine(model, "gpu", 64, lambda layer, ids: None, "auto")
    with engine:
        assert engine.tiers is None and tap is engine.route_tap and "zero-doorbell" in engine.tier_note
        tapped = engine.graph(4).summary().nodes
    with tiered_engine(model, 64) as plain:
        assert plain.route_tap is None
        assert tapped == plain.graph(4).summary().nodes + model.geometry.n_layers


def test_cache_all_keeps_todays_graph(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    eng = tiered_engine(model, cache="all")
    assert eng.tiers is None and "zero-doorbell" in eng.tier_note
    plain = tiered_engine(model)
    assert eng.graph(4).summary().nodes == plain.graph(4).summary().nodes


def test_tiered_graph_replay_equals_eager(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    for cfg in (dict(cache="5", pcie_frac=0.5),):
        eng = tiered_engine(model, **cfg)
        runs = {}
        for eager in (True, False):
            eng.reset()
            rows = []
            for pos in range(0, 24, 6):
                rows.append(eng.run(tokens[pos:pos + 6], pos, eager=eager).logits)
                eng.commit(6, eager=eager)
            runs[eager] = np.concatenate(rows)
        eng.close()
        np.testing.assert_array_equal(runs[True], runs[False], err_msg=str(cfg))


def test_stall_test_releases_and_a_fresh_engine_runs(fixture_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("STRATA_TEST_VERIFY_STALL", None)
    cmd = [sys.executable, "-m", "strata_cli", "stall-test", str(fixture_dir / "model-q8_0.gguf"),
           "--stall-window", "2", "--timeout", "0.5", "--expert-cache", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("window 2 stalled at layer ") and "GPU waits released; streams idle after" in lines[0]
    idle_ms = float(lines[0].rsplit("after ", 1)[1].split()[0])
    assert idle_ms < 1000
    assert lines[1].startswith("a fresh engine ran a 4-token window")


def test_an_engine_that_fails_to_build_releases_its_tier_host(fixture_dir, monkeypatch):
    """A construction that fails after the tiers are attached (here: the warm-up window) closes what it made: the
    tier host leaves the watchdog's list and its copy thread stops; the construction's error is the one raised."""
    import threading

    from strata_cli.engine.gpu.engine import GPUEngine
    from strata_cli.tiers import watchdog

    def broken_warm_up(self):
        self.built_tier_host = self.tier_host
        raise RuntimeError("planted warm-up failure")

    monkeypatch.setattr(GPUEngine, "_warm_up", broken_warm_up)
    made = []
    real_init = GPUEngine._build

    def build(self, *args):
        made.append(self)
        real_init(self, *args)

    monkeypatch.setattr(GPUEngine, "_build", build)
    before = set(threading.enumerate())  # (another test's engine in this worker may still hold its copy thread)
    with pytest.raises(RuntimeError, match="planted warm-up failure"):
        tiered_engine(open_model(fixture_dir / "model-q8_0.gguf"), cache="3", pcie_frac=0.5)
    eng = made[0]
    assert eng.closed and eng.built_tier_host not in set(watchdog._live)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("strata-pcie")]
