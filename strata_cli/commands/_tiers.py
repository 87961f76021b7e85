"""The expert-tier options of every command that builds the GPU engine (engine/gpu/tiers.py)."""

from __future__ import annotations

import click


def tier_options(f):
    """--expert-profile, --expert-cache, --expert-policy, --expert-max-copy, --pcie-frac, --split, --tier-wait
    (innermost first); the command takes them as **tier_args and hands them to tier_config."""
    from ..tiers.cache_policy import DEFAULT_MAX_COPY, POLICIES

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
        click.option("--expert-max-copy", default=None, metavar="SIZE",
                     help="Bytes an adaptive --expert-policy copies into VRAM per window at most. "
                     f"[default: {DEFAULT_MAX_COPY}]"),
        click.option("--expert-policy", type=click.Choice(list(POLICIES)), default="static",
                     show_default=True, help="How the VRAM cache changes between windows: static keeps the "
                     "profile's set; lru / lfu swap in the experts the last windows picked most recently / most "
                     "often (strata_cli/tiers/cache_policy.py)."),
        click.option("--expert-cache", default=None, metavar="all|auto|N|SIZE",
                     help="Routed experts kept in VRAM: all, auto (what free memory allows), N (layer, expert) "
                     "slots, or a size like 12GiB. The rest stay in the memory-mapped file. [default: all]"),
        click.option("--expert-profile", type=click.Path(dir_okay=False), default=None,
                     help="Expert profile (YAML or STRP) ranking the (layer, expert) pairs for the cache."),
    ]
    for option in options:
        f = option(f)
    return f


def tier_config(expert_profile, expert_cache, pcie_frac, split, tier_wait, expert_policy="static",
                expert_max_copy=None, cache_override: str | None = None):
    """A TierConfig, or None when no tier option was given (every expert in VRAM, today's graph)."""
    from ..engine.gpu.tiers import TierConfig
    from ..tiers.residency import parse_cache_spec, parse_size
    from ..tiers.cache_policy import DEFAULT_MAX_COPY
    from ..tiers.share import parse_pcie_frac

    cache = cache_override if cache_override is not None else expert_cache
    # default 0, the CPU pool alone: a PCIe share on Flash-Next-size experts is not yet shown to finish its windows
    # on the H200 (docs/BENCHMARKS.md); auto and numbers are the user's choice. Bad values: one line on any device.
    frac = 0.0 if pcie_frac is None else parse_pcie_frac(pcie_frac)
    max_copy = parse_size(DEFAULT_MAX_COPY if expert_max_copy is None else expert_max_copy, "--expert-max-copy")
    if cache is None and expert_profile is None and pcie_frac is None and not split and tier_wait == "spin" \
            and expert_policy == "static" and expert_max_copy is None:
        return None
    if cache is not None:
        parse_cache_spec(cache)  # a bad spec is one line on any device (the numpy engine ignores the tiers)
    return TierConfig(profile=expert_profile, cache=cache or "all", pcie_frac=frac, split=split, wait=tier_wait,
                      policy=expert_policy, max_copy=max_copy)
