"""`--expert-cache all|auto|N|SIZE` parsed, and the bytes of one routed expert per layer. The residency itself (which
(layer, expert) pairs the cache holds, from a profile's ranked order) is chosen by the GPU engine that uploads them:
strata_cli/engine/gpu/tiers.py `choose_residency`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError

EXPERT_ROLES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


@dataclass(frozen=True)
class CacheSpec:
    kind: str        # "all" | "auto" | "slots" | "bytes"
    value: int = 0   # slots or bytes
    text: str = ""


def parse_cache_spec(text) -> CacheSpec:
    """'all', 'auto', a slot count ('0', '4096') or a size ('12GiB', '512MB', '1.5G' = GiB)."""
    raw = str(text).strip()
    low = raw.lower()
    if low in ("all", "auto"):
        return CacheSpec(low, 0, raw)
    if re.fullmatch(r"\d+", low):
        return CacheSpec("slots", int(low), raw)
    m = _SIZE.fullmatch(low)
    if m and m.group(2) in _UNITS:
        return CacheSpec("bytes", int(float(m.group(1)) * _UNITS[m.group(2)]), raw)
    raise OptionError(f"--expert-cache {raw!r}: expected all, auto, a slot count (e.g. 4096) or a size (e.g. 12GiB)")


def expert_bytes(model) -> np.ndarray:
    """int64 [L]: bytes of one routed expert (gate + up + down, as stored) in each layer."""
    g = model.geometry
    out = np.zeros(g.n_layers, dtype=np.int64)
    for layer in range(g.n_layers):
        for role in EXPERT_ROLES:
            out[layer] += model.info(f"blk.{layer}.{role}.weight").n_bytes // g.n_expert
    return out
