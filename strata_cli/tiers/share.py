"""`--pcie-frac auto|F`: the share of each step's distinct VRAM misses copied over PCIe, the CPU pool computing the rest.

auto balances the two streams: a miss share f over PCIe takes f·B/pcie_rate, the rest (1-f)·B/pool_rate; both end
together at f = pcie_rate / (pcie_rate + pool_rate). The rates are constants measured on the H200 host, not probed
at engine setup: a probe there would time the copy of cold memory-mapped pages (the file's page cache, not the
link), and in a window the copies and the pool share the host's memory bandwidth, which a lone probe does not see.
    PCIE_GBS  51 GB/s  cudaMemcpyAsync host -> device (docs/gpu-toolchain-notes.md §7)
    POOL_GBS  77.7 GB/s  the CPU pool on Q8_0 experts, 16 cores (docs/BENCHMARKS.md, the pool's table)
"""

from __future__ import annotations

from ..errors import OptionError

PCIE_GBS = 51.0
POOL_GBS = 77.7
AUTO = "auto"


def balanced_pcie_frac(pcie_gbs: float = PCIE_GBS, pool_gbs: float = POOL_GBS) -> float:
    """The share whose copies take as long as the pool's rest: pcie / (pcie + pool)."""
    if not (pcie_gbs >= 0 and pool_gbs >= 0) or pcie_gbs + pool_gbs <= 0:
        raise ValueError(f"rates must be >= 0 and not both 0 (PCIe {pcie_gbs}, pool {pool_gbs})")
    return pcie_gbs / (pcie_gbs + pool_gbs)


def parse_pcie_frac(text) -> float | str:
    """'auto' or a number in [0, 1] (the CLI's --pcie-frac and TierConfig.pcie_frac)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        if raw.lower() == AUTO:
            return AUTO
        try:
            value = float(raw)
        except ValueError:
            raise OptionError(f"--pcie-frac {raw!r}: expected auto or a share between 0 and 1") from None
    if not 0.0 <= value <= 1.0:
        raise OptionError(f"--pcie-frac {text!r}: expected auto or a share between 0 and 1")
    return value


def resolve_pcie_frac(value) -> tuple[float, str]:
    """(the share to use, the line saying what was chosen)."""
    parsed = parse_pcie_frac(value)
    if parsed == AUTO:
        frac = balanced_pcie_frac()
        return frac, (f"PCIe share: {frac:.2f} of each layer's distinct misses over PCIe, the rest on the CPU pool "
                      f"(--pcie-frac auto: copy engine {PCIE_GBS:g} GB/s, CPU pool {POOL_GBS:g} GB/s, both streams "
                      "end together)")
    return parsed, f"PCIe share: {parsed:g} of each layer's distinct misses over PCIe (--pcie-frac {parsed:g})"
