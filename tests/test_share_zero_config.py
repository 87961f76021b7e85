"""--pcie-frac auto that resolves to 0 gives the config --pcie-frac 0 gives (tiers/setup.resolved_config)."""

from strata_cli.tiers.config import TierConfig
from strata_cli.tiers.setup import resolved_config
from strata_cli.tiers.share import ShareRates


def test_auto_resolved_to_zero_equals_explicit_zero():
    rates = ShareRates(50.0, 18.0)  # the pool 50, the DMA 18 GB/s
    auto = resolved_config(TierConfig(cache="0", pcie_frac="auto"), 0.0, True, rates)
    zero = resolved_config(TierConfig(cache="0", pcie_frac=0.0), 0.0, False, None)
    assert auto == zero
    assert auto.rates is None and not auto.share_auto


def test_auto_share_above_zero_keeps_rates():
    rates = ShareRates(20.0, 100.0)
    cfg = resolved_config(TierConfig(cache="0", pcie_frac="auto"), 0.3, True, rates)
    assert cfg.share_auto and cfg.rates == rates and cfg.pcie_frac == 0.3
