"""The expert-tier options of every command that builds the GPU engine, parsed into one tiers/config.TierConfig."""

from __future__ import annotations

import click

from ._common import STDIN, FileParam


def tier_options(f):
    """--expert-profile, --expert-cache, --expert-policy, --expert-max-copy, --pcie-frac, --tier-wait
    (innermost first); the command takes them as **tier_args and hands them to tier_config."""
    from ..tiers.cache_policy import DEFAULT_MAX_COPY, FILL_WINDOW_MS, GATHER_GBS, POLICIES
    from ..tiers.share import PCIE_GBS

    options = [
        click.option("--tier-wait", type=click.Choice(["spin", "stream"]), default="spin", show_default=True,
                     help="How the window graph waits for the host: spin kernels on mapped words (bounded by a "
                     "GPU timer) or captured cuStreamWaitValue32 nodes."),
        click.option("--pcie-frac", default=None, metavar="auto|F",
                     help="Share of each layer's distinct VRAM misses copied over PCIe by the copy engine "
                     "from a page-locked copy of the experts; the CPU pool computes the rest. auto picks the share "
                     "where the pool's and the DMA's measured rates balance, 0 where PCIe loses, and keeps "
                     "balancing each window size between windows (strata_cli/tiers/share.py). [default: auto]"),
        click.option("--expert-max-copy", default=None, metavar="SIZE",
                     help="Bytes an adaptive --expert-policy copies into VRAM per window at most. The default is "
                     "what the fill path (without a PCIe share the host's gather after a window's last step, then "
                     f"the DMA) moves in {FILL_WINDOW_MS:g} ms, the shortest window, so a window's fills land "
                     "before the boundary after the next: at the gather and DMA rates --pcie-frac auto measured, "
                     "else at the H200's "
                     f"({GATHER_GBS:g} and {PCIE_GBS:g} GB/s: {DEFAULT_MAX_COPY}), never more than the cache's "
                     "slots hold."),
        click.option("--expert-policy", type=click.Choice(list(POLICIES)), default="static",
                     show_default=True, help="How the VRAM cache changes between windows: static keeps the "
                     "profile's set; lru / lfu swap in the experts the last windows picked most recently / most "
                     "often (strata_cli/tiers/cache_policy.py)."),
        click.option("--expert-cache", default=None, metavar="all|auto|N|SIZE",
                     help="Routed experts kept in VRAM: all, auto (what free memory allows), N (layer, expert) "
                     "slots, or a size like 12GiB. The rest stay in the memory-mapped file. [default: all]"),
        click.option("--expert-profile", type=FileParam(STDIN, dir_okay=False), default=None,
                     help="Expert profile (YAML or STRP) ranking the (layer, expert) pairs for the cache."),
    ]
    for option in options:
        f = option(f)
    return f


def tier_config(expert_profile, expert_cache, pcie_frac, tier_wait, expert_policy="static",
                expert_max_copy=None, cache_override: str | None = None, stall_window: int | None = None):
    """The one TierConfig of the options (each parsed here, once; a bad value is one line on any device, the numpy
    engine ignores the tiers), or None when no tier option was given and no stall window asked for (every expert in
    VRAM, today's graph). stall_window None: STRATA_TEST_VERIFY_STALL's."""
    from .. import settings
    from ..tiers.config import TierConfig
    from ..tiers.expert_profile import load_profile
    from ..tiers.share import DEFAULT_PCIE_FRAC

    cache = cache_override if cache_override is not None else expert_cache
    stall = settings.TEST_VERIFY_STALL.value() if stall_window is None else stall_window
    # the default share (tiers/share.DEFAULT_PCIE_FRAC) is auto: the split between the pool and the copy engine by
    # their measured rates (bench/tiers_device.sh measured it faster than the pool alone at every T)
    cfg = TierConfig(profile=expert_profile, cache="all" if cache is None else cache,
                     pcie_frac=DEFAULT_PCIE_FRAC if pcie_frac is None else pcie_frac, wait=tier_wait,
                     stall_window=stall, policy=expert_policy,
                     max_copy=expert_max_copy)
    if cache is None and expert_profile is None and pcie_frac is None and tier_wait == "spin" \
            and not stall and expert_policy == "static" and expert_max_copy is None:
        return None
    if expert_profile is not None:  # so is a missing or malformed profile, and `-` is read here, once
        cfg.loaded_profile = load_profile(expert_profile)
    return cfg
