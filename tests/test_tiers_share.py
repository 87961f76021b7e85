"""--pcie-frac auto|F: parsing, the share model and auto's choice, the default, and the line the engine setup says
(no GPU needed)."""

from __future__ import annotations


import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.commands._tiers import tier_config
from strata_cli.engine.gpu.buffers import plan_buffers
from strata_cli.errors import InputError
from strata_cli.tiers.config import TierConfig
from strata_cli.tiers.share import (AUTO_MIN_GAIN, DEFAULT_PCIE_FRAC, PCIE_GBS, POOL_GBS, ShareRates, best_pcie_frac, parse_pcie_frac,
                                    resolve_pcie_frac, shares_ms, window_ms)
from strata_cli.tiers.setup import residency_for

def test_the_pool_and_the_dma_run_side_by_side():
    r = ShareRates(pool_gbs=50.0, dma_gbs=100.0)
    host, pcie, tier = shares_ms(1e9, 1e9, r)  # 1 GB on the pool, 1 GB over PCIe
    assert host == pytest.approx(20.0) and pcie == pytest.approx(10.0) and tier == host
    assert window_ms(0.0, 2e9, r) == pytest.approx((40.0, 0.0, 40.0))
    assert window_ms(1.0, 2e9, r) == pytest.approx((0.0, 20.0, 20.0))
    assert window_ms(0.5, 2e9, r) == pytest.approx((20.0, 10.0, 20.0))


def test_auto_chooses_the_meeting_point():
    # the host's and the copy engine's times meet at dma / (dma + pool): the best share
    for pool, dma in [(52.0, 54.7), (10.0, 30.0), (77.7, 51.0)]:
        f = best_pcie_frac(ShareRates(pool, dma), step=1e-4)
        assert f == pytest.approx(dma / (dma + pool), abs=2e-4)
    r = ShareRates(pool_gbs=20.0, dma_gbs=60.0)
    f = best_pcie_frac(r)
    assert f == pytest.approx(60.0 / 80.0, abs=0.011)
    assert window_ms(f, 1e9, r)[2] < (1 - AUTO_MIN_GAIN) * window_ms(0.0, 1e9, r)[2]
    frac, note = resolve_pcie_frac("auto", r, 10**9)
    assert frac == f and f"at the chosen {f:g}" in note and "(constant, not measured)" in note
    assert "CPU pool 20.0 GB/s; DMA 60.0 GB/s" in note and "from the page-locked store" in note
    # the predicted times at 0 and the chosen share, and at the fractions tiers_device.sh runs
    t0 = window_ms(0.0, 1e9, r)[2]
    assert f"(1.00 GB): {t0:.1f} at 0," in note and f"{window_ms(0.25, 1e9, r)[2]:.1f} at 0.25" in note


def test_auto_keeps_0_when_the_predicted_gain_is_under_the_margin():
    r = ShareRates(pool_gbs=100.0, dma_gbs=8.0)  # the best share ~7 % faster than 0
    best = best_pcie_frac(r, min_gain=0.0)
    gain = 1 - window_ms(best, 1e9, r)[2] / window_ms(0.0, 1e9, r)[2]
    assert best > 0 and 0 < gain < AUTO_MIN_GAIN
    frac, note = resolve_pcie_frac("auto", r, 10**9)
    assert frac == 0.0 and f"no share is predicted {AUTO_MIN_GAIN:.0%} faster than 0" in note
    assert note.startswith("PCIe share: 0 of each layer's distinct misses") and "(chosen)" in note


def test_rates_must_be_positive():
    for bad in [(0.0, 1.0), (1.0, -1.0), (float("nan"), 1.0)]:
        with pytest.raises(ValueError, match="must be > 0"):
            ShareRates(*bad)
    with pytest.raises(ValueError, match="needs the measured rates"):
        resolve_pcie_frac("auto")


@pytest.mark.parametrize("text,want", [("auto", "auto"), (" AUTO ", "auto"), ("0", 0.0), ("0.25", 0.25), ("1", 1.0),
                                       (0.5, 0.5), (1, 1.0)])
def test_parse(text, want):
    assert parse_pcie_frac(text) == want


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "half", "", "nan"])
def test_parse_rejects_in_one_line(bad):
    with pytest.raises(InputError, match="--pcie-frac .*expected auto or a share between 0 and 1"):
        parse_pcie_frac(bad)


def test_resolve_says_what_it_chose():
    frac, note = resolve_pcie_frac(0.25)
    assert frac == 0.25 and "--pcie-frac 0.25" in note


def test_the_tier_floor_uses_the_model_at_the_rates_measured_for_auto():
    from types import SimpleNamespace

    from strata_cli.tiers.stats import tier_means

    history = [{"T": 1, "vram": 0, "pcie": 5, "cpu": 5, "vram_share": 0.0, "pcie_share": 0.5, "cpu_share": 0.5,
                "wait_b_ms": 0.0, "wait_flag_ms": 0.0, "host_wait_ms": 0.0, "pool_ms": 1.0, "pcie_bytes": 20e6,
                "cpu_bytes": 10e6, "issue_ms": 0.5, "copy_ms": 0.4}]
    measured = ShareRates(pool_gbs=10.0, dma_gbs=10.0)
    # no rates (a given share): the constants, a lower bound
    for cfg, want in [(TierConfig(cache="0", pcie_frac=0.5), max(10e6 / (POOL_GBS * 1e6), 20e6 / (PCIE_GBS * 1e6))),
                      # host 1 ms of pool beside 2 ms of DMA
                      (TierConfig(cache="0", pcie_frac=0.5, rates=measured), 2.0)]:
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


def test_cli_default_is_auto_and_a_share_is_asked_for():
    assert tier_config(None, None, None, "spin") is None  # no tier option: every expert in VRAM
    assert tier_config(None, "0", None, "spin").pcie_frac == "auto" == DEFAULT_PCIE_FRAC  # measured faster than 0
    assert tier_config(None, "0", "auto", "spin").pcie_frac == "auto"
    assert tier_config(None, "0", "0.5", "spin").pcie_frac == 0.5
    assert tier_config(None, "0", "0", "spin").pcie_frac == 0.0
    assert tier_config(None, None, "auto", "spin").cache.kind == "all"


def test_engine_setup_resolves_auto_and_says_so(fixture_dir, monkeypatch):
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.residency import expert_bytes

    monkeypatch.delenv("STRATA_TEST_VERIFY_STALL", raising=False)
    model = open_model(fixture_dir / "model-q8_0.gguf")
    from strata_cli.tiers import setup

    arena = plan_buffers(model.geometry, 64, 8).planned_bytes()
    monkeypatch.setattr(setup, "probe_pool_gbs", lambda m: 17.0)  # the pool's rate on this model's experts
    # a pool slower than the constant DMA: a share > 0, the store made, the DMA measured later (rebalance_share)
    table, note, cfg = residency_for(model, TierConfig(cache="3", pcie_frac="auto"), arena, 8)
    rates = ShareRates(17.0, PCIE_GBS)
    assert cfg.pcie_frac == best_pcie_frac(rates) > 0 and (table < 0).any()
    assert cfg.share_auto and cfg.rates == rates and not cfg.rates.dma_measured
    assert "CPU pool 17.0 GB/s; DMA" in note and "(constant, not measured)" in note
    window = model.geometry.n_expert_used * int(expert_bytes(model).sum())
    assert f"({window / 1e9:.2f} GB): {window_ms(0.0, window, rates)[2]:.1f} at 0," in note
    assert note.startswith("expert cache: 3 of") and "PCIe share: " in note and "--pcie-frac auto" in note
    # a pool so fast that no share gains the margin: 0, and no staging in the budget (the same cache as a given 0)
    monkeypatch.setattr(setup, "probe_pool_gbs", lambda m: 1000.0)
    staged = []
    monkeypatch.setattr(setup, "_staging_bytes", lambda model, cfg, *a: staged.append(cfg.pcie_frac) or 0)
    table, note, cfg = residency_for(model, TierConfig(cache="3", pcie_frac="auto"), arena, 8)
    assert cfg.pcie_frac == 0.0 and staged == [0.0] and not cfg.share_auto and cfg.rates is None
    assert "no share is predicted" in note
    table, note, cfg = residency_for(model, TierConfig(cache="all", pcie_frac="auto"), arena, 8)
    assert table is None and "zero-doorbell" in note and "PCIe" not in note  # nothing missed: nothing to share
    assert residency_for(model, None, arena, 8) == (None, None, None)
    _, _, cfg = residency_for(model, TierConfig(cache="0", pcie_frac=0.5), arena, 8)
    assert cfg.pcie_frac == 0.5 and cfg.rates is None


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


# ---- ShareTuner: --pcie-frac auto between windows

def _window(frac: float, pool_gbs: float, dma_gbs: float, steps: int = 48, misses: int = 10,
            expert_bytes: int = 2_000_000) -> dict:
    """The stats of a window whose steps each miss `misses` experts: the plan's rule (the last floor(n * frac)
    over PCIe), the pool and the DMAs at the given rates."""
    from strata_cli.tiers.plan import n_pcie

    pcie = steps * n_pcie(misses, frac) * expert_bytes
    cpu = steps * misses * expert_bytes - pcie
    return dict(cpu_bytes=cpu, pcie_bytes=pcie, pool_ms=cpu / 1e6 / pool_gbs, copy_ms=pcie / 1e6 / dma_gbs)


def _tier_ms(stats: dict) -> float:
    return max(stats["pool_ms"], stats["copy_ms"])


@pytest.mark.parametrize("seed_pool,pool,dma", [(63.0, 45.6, 39.9), (3.5, 46.4, 39.2), (64.0, 61.5, 40.7),
                                                (20.0, 80.0, 20.0)])
def test_share_tuner_moves_the_share_to_where_the_windows_rates_balance(seed_pool, pool, dma):
    """Seeded from the build's probes (one of them the 3.5 GB/s probe of 2026-12-03 that chose 0.93), the share
    reaches the windows' own balance within a few windows: the mean tier time of windows 4..20 within 6 % of the
    best share's (whole experts a step), and far under the seed's where the seed was off."""
    from strata_cli.tiers.share import ShareTuner

    seed = ShareRates(seed_pool, 45.3, dma_measured=True)
    tuner = ShareTuner(best_pcie_frac(seed), seed)
    best = min(_tier_ms(_window(k / 10, pool, dma)) for k in range(11))
    times = []
    for _ in range(20):
        stats = _window(tuner.frac(8), pool, dma)
        times.append(_tier_ms(stats))
        tuner.observe(8, stats)
    assert np.mean(times[3:]) <= 1.06 * best, (times, best)
    got_pool, got_dma = tuner.rates(8)
    assert got_pool == pytest.approx(pool, rel=1e-3) and got_dma == pytest.approx(dma, rel=1e-3)
    if abs(best_pcie_frac(seed) - dma / (pool + dma)) > 0.1:
        assert np.mean(times[3:]) < 0.9 * times[0]


def test_share_tuner_keeps_each_window_size_apart_and_seeds_a_new_one_from_the_nearest():
    from strata_cli.tiers.share import ShareTuner

    tuner = ShareTuner(0.45, ShareRates(63.0, 45.0))
    assert tuner.frac(1) == 0.45  # T = 1 seen first: the build's share
    for _ in range(8):
        tuner.observe(8, _window(tuner.frac(8), 30.0, 45.0))  # the pool slow at T = 8: more over PCIe
    assert tuner.frac(8) > 0.55 and tuner.frac(1) == 0.45  # T = 1 untouched
    assert tuner.frac(4) == tuner.frac(8) and tuner.rates(4) == tuner.rates(8)  # the nearest T seen (8, not 1)
    assert tuner.frac(2) == tuner.frac(1)  # equally near 1 and 4 by log T: the smaller


def test_share_tuner_leaves_what_a_window_did_not_measure():
    from strata_cli.tiers.share import TUNE_MIN, ShareTuner

    tuner = ShareTuner(0.5, ShareRates(40.0, 40.0))
    tuner.observe(1, dict(cpu_bytes=0, pcie_bytes=0, pool_ms=0.0, copy_ms=0.0))  # no misses: nothing moves
    assert tuner.frac(1) == 0.5 and tuner.rates(1) == (40.0, 40.0)
    tuner.observe(1, dict(cpu_bytes=4e6, pcie_bytes=4e6, pool_ms=0.1, copy_ms=0.0))  # no DMA time: its rate kept
    assert tuner.rates(1) == pytest.approx((40.0, 40.0)) and tuner.frac(1) == pytest.approx(0.5)
    for _ in range(30):  # a DMA ever slower: the share falls to TUNE_MIN, never to 0 (the engine keeps its PCIe path)
        tuner.observe(1, dict(cpu_bytes=8e6, pcie_bytes=1e6, pool_ms=0.2, copy_ms=100.0))
    assert tuner.frac(1) == TUNE_MIN
    for _ in range(30):  # the pool ever slower: all over PCIe at most
        tuner.observe(1, dict(cpu_bytes=8e6, pcie_bytes=1e6, pool_ms=1e4, copy_ms=0.001))
    assert tuner.frac(1) == 1.0
    with pytest.raises(ValueError, match="share in"):
        ShareTuner(0.0, ShareRates(40.0, 40.0))
