"""--pcie-frac auto|F: parsing, the balance rule, the default, and the line the engine setup says (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.commands._tiers import tier_config
from strata_cli.engine.gpu.buffers import plan_buffers
from strata_cli.errors import InputError
from strata_cli.tiers.config import TierConfig
from strata_cli.tiers.share import (PCIE_GBS, POOL_GBS, balanced_pcie_frac, parse_pcie_frac,
                                    resolve_pcie_frac)
from strata_cli.tiers.setup import residency_for


def test_balance_rule_ends_both_streams_together():
    for pcie, pool in [(51.0, 77.7), (55.0, 73.0), (10.0, 30.0), (0.0, 5.0), (5.0, 0.0)]:
        f = balanced_pcie_frac(pcie, pool)
        assert 0.0 <= f <= 1.0
        if pcie and pool:  # bytes B of misses: f*B over PCIe and (1-f)*B on the pool take equally long
            assert abs(f / pcie - (1 - f) / pool) < 1e-12
    assert balanced_pcie_frac(0.0, 5.0) == 0.0 and balanced_pcie_frac(5.0, 0.0) == 1.0
    assert abs(balanced_pcie_frac() - PCIE_GBS / (PCIE_GBS + POOL_GBS)) < 1e-12
    with pytest.raises(ValueError):
        balanced_pcie_frac(0.0, 0.0)


@pytest.mark.parametrize("text,want", [("auto", "auto"), (" AUTO ", "auto"), ("0", 0.0), ("0.25", 0.25), ("1", 1.0),
                                       (0.5, 0.5), (1, 1.0)])
def test_parse(text, want):
    assert parse_pcie_frac(text) == want


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "half", "", "nan"])
def test_parse_rejects_in_one_line(bad):
    with pytest.raises(InputError, match="--pcie-frac .*expected auto or a share between 0 and 1"):
        parse_pcie_frac(bad)


def test_resolve_says_what_it_chose():
    frac, note = resolve_pcie_frac("auto")
    assert frac == balanced_pcie_frac()
    assert f"{frac:.2f}" in note and "--pcie-frac auto" in note and f"{PCIE_GBS:g} GB/s" in note
    frac, note = resolve_pcie_frac(0.25)
    assert frac == 0.25 and "--pcie-frac 0.25" in note
    # both rates measured (the pool at setup, the copy path once the staging buffers exist): split by them
    frac, note = resolve_pcie_frac("auto", 10.6, 24.0, "gather 40.0 GB/s, then DMA 60.0 GB/s, on 320 MiB")
    assert frac == pytest.approx(24.0 / 34.6)
    assert ("PCIe copy path 24.0 GB/s measured (gather 40.0 GB/s, then DMA 60.0 GB/s, on 320 MiB), CPU pool 10.6 "
            "GB/s measured on this model's experts") in note and f"{frac:.2f} of each layer" in note


def test_the_tier_floor_uses_the_rates_measured_for_auto():
    from types import SimpleNamespace

    from strata_cli.tiers.stats import tier_means

    history = [{"T": 1, "vram": 0, "pcie": 5, "cpu": 5, "vram_share": 0.0, "pcie_share": 0.5, "cpu_share": 0.5,
                "wait_b_ms": 0.0, "wait_flag_ms": 0.0, "host_wait_ms": 0.0, "pool_ms": 1.0, "pcie_bytes": 20e6,
                "cpu_bytes": 10e6, "gather_ms": 0.5, "copy_ms": 0.4}]
    for cfg, want in [(TierConfig(cache="0", pcie_frac=0.5), max(10e6 / (POOL_GBS * 1e6), 20e6 / (PCIE_GBS * 1e6))),
                      (TierConfig(cache="0", pcie_frac=0.5, pool_gbs=10.0, copy_gbs=10.0), 2.0)]:
        t = SimpleNamespace(cfg=cfg, stage_table=lambda: np.array([[-1]]))
        row = tier_means(t, SimpleNamespace(history=history), 1, 1, 5.0, 1.0)
        assert row["tier_floor_ms"] == pytest.approx(1.0 + want)
        assert row["copy_gb_s"] == pytest.approx(20e6 / 1e9 / 0.4e-3)  # the DMAs' rate (copy ms)


def test_pool_probe_times_the_pool_on_layer_0_experts_with_their_pages_in(fixture_dir):
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.share import probe_pool_gbs

    model = open_model(fixture_dir / "model-q8_0.gguf")
    calls = []

    class Pool:
        def expert_bytes(self, layer):
            return 1_000_000

        def compute(self, layer, x, plan):
            calls.append((layer, x.shape, plan.n_groups, sorted(plan.experts.tolist())))

    g = model.geometry
    gbs = probe_pool_gbs(model, pool=Pool(), repeats=2)
    rows = max(1, min(32, g.n_expert) // g.n_expert_used)
    assert len(calls) == 2 and gbs > 0
    assert calls[0] == (0, (rows, g.n_embd), rows * g.n_expert_used, list(range(rows * g.n_expert_used)))


def test_cli_default_is_the_cpu_pool_alone_and_auto_is_asked_for():
    assert tier_config(None, None, None, False, "spin") is None  # no tier option: every expert in VRAM
    assert tier_config(None, "0", None, False, "spin").pcie_frac == 0.0
    assert tier_config(None, "0", "auto", False, "spin").pcie_frac == "auto"
    assert tier_config(None, "0", "0.5", False, "spin").pcie_frac == 0.5
    assert tier_config(None, "0", "0", False, "spin").pcie_frac == 0.0
    assert tier_config(None, None, "auto", False, "spin").cache.kind == "all"


def test_engine_setup_resolves_auto_and_says_so(fixture_dir, monkeypatch):
    from strata_cli.model.gguf_file import open_model

    monkeypatch.delenv("STRATA_TEST_VERIFY_STALL", raising=False)
    model = open_model(fixture_dir / "model-q8_0.gguf")
    from strata_cli.tiers import setup

    monkeypatch.setattr(setup, "probe_pool_gbs", lambda m: 17.0)  # the pool's rate on this model's experts
    arena = plan_buffers(model.geometry, 64, 8).planned_bytes()
    table, note, cfg = residency_for(model, TierConfig(cache="3", pcie_frac="auto"), arena, 8)
    assert cfg.pcie_frac == balanced_pcie_frac(PCIE_GBS, 17.0) and (table < 0).any()
    assert cfg.share_auto and cfg.pool_gbs == 17.0 and cfg.copy_gbs is None  # the copy path: measured later
    assert "CPU pool 17.0 GB/s measured" in note
    assert note.startswith("expert cache: 3 of") and "PCIe share: " in note and "--pcie-frac auto" in note
    table, note, cfg = residency_for(model, TierConfig(cache="all", pcie_frac="auto"), arena, 8)
    assert table is None and "zero-doorbell" in note and "PCIe" not in note  # nothing missed: nothing to share
    assert residency_for(model, None, arena, 8) == (None, None, None)
    _, _, cfg = residency_for(model, TierConfig(cache="0", pcie_frac=0.5), arena, 8)
    assert cfg.pcie_frac == 0.5


@pytest.mark.parametrize("value", ["auto", "0.3"])
def test_commands_take_auto_and_numbers(fixture_dir, value):
    from strata_cli.cli import main

    model = str(fixture_dir / "model-q8_0.gguf")
    ok = CliRunner().invoke(main, ["logprobs", model, "--random", "4", "--device", "cpu", "--expert-cache", "0",
                                   "--pcie-frac", value])
    assert ok.exit_code == 0, ok.output
    assert "GPU engine only" in ok.output


def test_a_bad_share_is_one_line_on_any_device(fixture_dir):
    from strata_cli.cli import main

    model = str(fixture_dir / "model-q8_0.gguf")
    bad = CliRunner().invoke(main, ["verify-bench", model, "--window", "1", "-r", "1", "--device", "cpu",
                                    "--pcie-frac", "lots"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output  # a bad option value: usage error
    assert "--pcie-frac 'lots'" in bad.output
    assert np.isfinite(balanced_pcie_frac())
