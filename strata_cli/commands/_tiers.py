"""The expert-tier options of every command that builds the GPU engine (engine/gpu/tiers.py)."""

from __future__ import annotations

import click


def tier_options(f):
    """--expert-profile, --expert-cache, --pcie-frac, --split, --tier-wait (innermost first)."""
    options = [
        click.option("--tier-wait", type=click.Choice(["spin", "stream"]), default="spin", show_default=True,
                     help="How the window graph waits for the host: spin kernels on mapped words (bounded by a "
                     "GPU timer) or captured cuStreamWaitValue32 nodes."),
        click.option("--split", is_flag=True, help="Two token groups per window, so the CPU computes one "
                     "group's experts while the GPU runs the other (windows of T >= 2)."),
        click.option("--pcie-frac", default=None, metavar="auto|F",
                     help="Share of each layer's distinct VRAM misses copied over PCIe by the copy engine; "
                     "the CPU pool computes the rest. auto balances the copy engine's and the pool's rates "
                     "(strata_cli/tiers/share.py). [default: 0]"),
        click.option("--expert-cache", default=None, metavar="all|auto|N|SIZE",
                     help="Routed experts kept in VRAM: all, auto (what free memory allows), N (layer, expert) "
                     "slots, or a size like 12GiB. The rest stay in the memory-mapped file. [default: all]"),
        click.option("--expert-profile", type=click.Path(dir_okay=False), default=None,
                     help="Expert profile (YAML or STRP) ranking the (layer, expert) pairs for the cache."),
    ]
    for option in options:
        f = option(f)
    return f


def tier_config(expert_profile, expert_cache, pcie_frac, split, tier_wait, cache_override: str | None = None):
    """A TierConfig, or None when no tier option was given (every expert in VRAM, today's graph)."""
    from ..engine.gpu.tiers import TierConfig

    from ..tiers.residency import parse_cache_spec

    from ..tiers.share import parse_pcie_frac

    from ..fileio import is_stdio
    from ..tiers.profile import load_profile

    cache = cache_override if cache_override is not None else expert_cache
    # default 0, the CPU pool alone: a PCIe share on Flash-Next-size experts is not yet shown to finish its windows
    # on the H200 (docs/BENCHMARKS.md); auto and numbers are the user's choice. Bad values: one line on any device.
    frac = 0.0 if pcie_frac is None else parse_pcie_frac(pcie_frac)
    if cache is None and expert_profile is None and pcie_frac is None and not split and tier_wait == "spin":
        return None
    if cache is not None:
        parse_cache_spec(cache)  # a bad spec is one line on any device (the numpy engine ignores the tiers)
    if expert_profile is not None and not is_stdio(expert_profile):
        load_profile(expert_profile)  # so is a missing or malformed profile (stdin is read once, by the engine)
    return TierConfig(profile=expert_profile, cache=cache or "all", pcie_frac=frac, split=split, wait=tier_wait)
