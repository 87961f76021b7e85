"""The expert tiers' configuration: one typed value, every option parsed once when it is made (commands/_tiers.py
makes it from the CLI options; tests and tools make it directly)."""

from __future__ import annotations

from dataclasses import dataclass

from .residency import CacheSpec, parse_cache_spec, parse_size
from .share import DEFAULT_PCIE_FRAC, ShareRates, parse_pcie_frac


@dataclass
class TierConfig:
    profile: str | None = None        # expert profile (YAML or STRP); None ranks pairs layer by layer, expert id order
    cache: CacheSpec | str = "all"    # --expert-cache all | auto | N slots | SIZE (12GiB, 500MB); a CacheSpec once made
    pcie_frac: float | str = DEFAULT_PCIE_FRAC  # share of a step's distinct misses copied by the copy engine, or auto
    #                                   (tiers/share.py; setup.residency_for resolves it to a number)
    wait: str = "spin"                # spin kernels or captured cuStreamWaitValue32
    timeout_s: float = 20.0           # bound of every GPU wait and of the host's wait for a ring
    stall_window: int = 0             # 1-based window whose last flag the host withholds (stall-test); 0 = never
    policy: str = "static"            # --expert-policy (tiers/cache_policy.py): how the slots change between windows
    max_copy: int | str | None = None  # bytes an adaptive policy copies into VRAM per window at most; None: the
    #                                   default from the fill path's rates (setup.residency_for, cache_policy.py)
    loaded_profile: object = None     # the profile as already read (an ExpertProfile): `-` (stdin) is read once
    counting: bool = False            # make-profile's counting run: the cache sets only its speed (no warning for a
    #                                   partial cache without a profile, setup.residency_for)
    # set while the engine is built (tiers/setup.residency_for, engine/gpu/tiers.rebalance_share), never by a user:
    share_auto: bool = False          # pcie_frac came from auto: re-balanced once the copy path is measured
    rates: ShareRates | None = None   # the pool's and the DMA's rates auto measured at load (tiers/share.py)

    def __post_init__(self):
        self.pcie_frac = parse_pcie_frac(self.pcie_frac)
        if not isinstance(self.cache, CacheSpec):
            self.cache = parse_cache_spec(self.cache)
        if self.max_copy is not None and not isinstance(self.max_copy, int):
            self.max_copy = parse_size(self.max_copy, "--expert-max-copy")
