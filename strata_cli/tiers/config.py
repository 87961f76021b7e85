"""The expert tiers' configuration: one typed value, every option parsed once when it is made (commands/_tiers.py
makes it from the CLI options; tests and tools make it directly)."""

from __future__ import annotations

from dataclasses import dataclass

from .residency import CacheSpec, parse_cache_spec
from .share import parse_pcie_frac


@dataclass
class TierConfig:
    profile: str | None = None        # expert profile (YAML or STRP); None ranks pairs layer by layer, expert id order
    cache: CacheSpec | str = "all"    # --expert-cache all | auto | N slots | SIZE (12GiB, 500MB); a CacheSpec once made
    pcie_frac: float | str = 0.0      # share of a step's distinct misses copied by the copy engine, or "auto"
    #                                   (tiers/share.py; setup.residency_for resolves it to a number)
    split: bool = False               # two token groups per window
    wait: str = "spin"                # spin kernels or captured cuStreamWaitValue32
    timeout_s: float = 20.0           # bound of every GPU wait and of the host's wait for a ring
    stall_window: int = 0             # 1-based window whose last flag the host withholds (stall-test); 0 = never

    def __post_init__(self):
        self.pcie_frac = parse_pcie_frac(self.pcie_frac)
        if not isinstance(self.cache, CacheSpec):
            self.cache = parse_cache_spec(self.cache)
