"""The PCIe share at Flash-Next width: expert matrices of 1.7 MB (2560 x 640 Q8_0), far above the 64 KB that a
driver copies inline, DMA'd from the engine's page-locked store of its experts (engine/gpu/expert_store.py) while the
window's graph waits on flagB. Logits and greedy ids must equal the all-resident engine's, with several engines over
one mapped model alive at once or built one after the other (PCIe share, all-resident, PCIe share again: nothing of
the file is page-locked, so no upload can start in registered memory and end outside it)."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_engines import rel_err, synthetic_model, tiered_engine
from spec_windows import speculative_run

pytestmark = pytest.mark.gpu


def test_pcie_share_of_flash_next_sized_experts_equals_all_resident(tmp_path):
    model = synthetic_model(tmp_path, "flash-next", 4, "Q8_0", layers=4, experts=16, vocab=4096, ngram_vocab=100)
    assert model.info("blk.0.ffn_down_exps.weight").n_bytes // 16 > 1 << 20  # over 1 MB per expert
    tokens = np.random.default_rng(3).integers(0, model.geometry.n_vocab, 24)
    base, base_ids = speculative_run(tiered_engine(model), tokens, np.random.default_rng(6), 8)
    engines = []
    for cfg in (dict(cache="0", pcie_frac=0.5), dict(cache="20", pcie_frac=1.0)):
        eng = tiered_engine(model, **cfg)
        engines.append(eng)  # kept alive: engines over one file at once
        got, ids = speculative_run(eng, tokens, np.random.default_rng(6), 8)
        err = rel_err(got, base)
        assert err <= 1e-4, f"{cfg}: max relative error {err:.2e}"
        np.testing.assert_array_equal(ids, base_ids, err_msg=str(cfg))
        assert eng.tier_host.history[-1]["pcie"] > 0, cfg
    for eng in engines:
        eng.close()
        eng.close()  # idempotent


@pytest.mark.parametrize("drop", [False, True])
def test_auto_measures_the_copy_path_and_keeps_or_drops_the_pcie_share(tmp_path, monkeypatch, drop):
    """--pcie-frac auto with the setup's pool probe faked so that PCIe pays at setup (a pool of 0.05 or 10 GB/s
    against the constant DMA rate): the store is made and the copy path measured on the device (the real DMA). Against
    a pool of 0.05 GB/s the measured path still pays: a share > 0 copied in the windows. drop: the measurement runs
    but reports a DMA of 0.5 GB/s against a pool of 10, so no share gains the margin: the PCIe path is dropped before
    the warm-up (no flagB wait recorded, no copy thread, the store unregistered). Both equal the all-resident run."""
    from strata_cli.engine.gpu import tiers as tiers_mod
    from strata_cli.tiers import setup
    from strata_cli.tiers.share import best_pcie_frac

    pool_gbs = 10.0 if drop else 0.05
    monkeypatch.setattr(setup, "probe_pool_gbs", lambda model: pool_gbs)
    if drop:
        real = tiers_mod.ExpertTiers.measure_copy_path

        def slow_dma(self, repeats=3):
            _, nbytes = real(self, repeats)
            return 0.5, nbytes

        monkeypatch.setattr(tiers_mod.ExpertTiers, "measure_copy_path", slow_dma)
    model = synthetic_model(tmp_path, "flash-next", 4, "Q8_0", layers=4, experts=16, vocab=4096, ngram_vocab=100)
    tokens = np.random.default_rng(3).integers(0, model.geometry.n_vocab, 16)
    base, base_ids = speculative_run(tiered_engine(model), tokens, np.random.default_rng(6), 6)
    with tiered_engine(model, cache="0", pcie_frac="auto") as eng:
        rates = eng.tiers.cfg.rates
        assert rates.dma_measured and rates.dma_gbs > 0 and rates.pool_gbs == pool_gbs
        frac = eng.tiers.cfg.pcie_frac
        assert frac == best_pcie_frac(rates) and (frac > 0) == (not drop) and eng.tiers.pcie == (frac > 0)
        assert "DMA" in eng.tier_note and "measured" in eng.tier_note and "predicted tier ms" in eng.tier_note
        got, ids = speculative_run(eng, tokens, np.random.default_rng(6), 6)
        assert rel_err(got, base) <= 1e-4
        np.testing.assert_array_equal(ids, base_ids)
        # the windows' shares move from the build's (tiers/share.ShareTuner; a tiny expert's share may fall under one
        # expert a step), so some window, not each, copied
        assert any(h["pcie"] > 0 for h in eng.tier_host.history) == (frac > 0)
        assert all((h["pcie_frac"] > 0) == (frac > 0) for h in eng.tier_host.history)
        assert (eng.tier_host._copier is not None) == (frac > 0) and (eng.tiers.store is not None) == (frac > 0)


def test_pcie_then_all_resident_then_pcie_in_one_process(tmp_path):
    """The order that failed (#17): an all-resident engine's dense uploads after a PCIe-share engine closed, then a
    PCIe-share engine again; each against the first all-resident run."""
    model = synthetic_model(tmp_path, "flash-next", 5, "Q8_0", layers=4, experts=16, vocab=4096, ngram_vocab=100)
    tokens = np.random.default_rng(4).integers(0, model.geometry.n_vocab, 16)
    runs = []
    for cfg in (dict(cache="0", pcie_frac=1.0), {}, dict(cache="3", pcie_frac=0.5)):
        with tiered_engine(model, **cfg) as eng:
            runs.append(speculative_run(eng, tokens, np.random.default_rng(2), 6))
            if cfg:
                assert eng.tier_host.history[-1]["pcie"] > 0, cfg
                assert eng.tier_host.history[-1]["copy_ms"] > 0, cfg
    for cfg, (got, ids) in zip(("pcie 1", "pcie 0.5"), (runs[0], runs[2])):
        assert rel_err(got, runs[1][0]) <= 1e-4, cfg
        np.testing.assert_array_equal(ids, runs[1][1], err_msg=cfg)


def test_deep_eager_warm_up_with_a_pcie_share_never_waits_for_the_bound(tmp_path):
    """#17: a PCIe-share engine's warm-up (one eager window) on a 48-layer model, the first PCIe engine of a fresh
    process (run it alone to see the module loads): its launcher runs ahead into the driver while the GPU waits for
    flagB; without the launch gate the copy thread's calls queued behind it until each wait's 20 s bound. With the
    gate no wait of the warm-up comes near its bound (the GPU's wait times of that window are still in wait_ns: a
    build's time would also count kernel compiles), and eager and graph windows equal the all-resident run."""
    model = synthetic_model(tmp_path, "tiny", 7, "Q8_0", layers=48, experts=16)
    tokens = np.random.default_rng(8).integers(0, model.geometry.n_vocab, 12)
    with tiered_engine(model, cache="0", pcie_frac=0.5, timeout_s=20.0) as eng:
        waited_s = eng.tiers.wait_ns.host.max() / 1e9
        assert waited_s < 5.0, f"a warm-up wait took {waited_s:.1f} s (the bound is 20 s)"
        assert int(eng.tiers.words.host[4]) == 0 and eng.tiers.launch_gate is None  # ERR word clear
        eager = [eng.run(tokens[:4], eager=True).logits]
        eng.reset()
        graph = [eng.run(tokens[:4]).logits]
        assert eng.tier_host.history[-1]["pcie"] > 0 and eng.tier_host.history[-1]["copy_ms"] > 0
    with tiered_engine(model) as base:
        want = base.run(tokens[:4]).logits
    for name, got in (("eager", eager[0]), ("graph", graph[0])):
        assert rel_err(got, want) <= 1e-4, name
