"""Which (layer, expert) pairs live in VRAM: `--expert-cache all|auto|N|SIZE` resolved against a profile.

The cache fills its slots with the profile's first ranked pairs. `table[l, e]` is the pair's slot or
-1 (a miss: PCIe or CPU pool); `pairs[s]` is the pair held by slot s. Every slot is `slot_bytes` wide, the
largest gate+up+down of one expert over the layers (the tensor types may differ per layer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .profile import ExpertProfile

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
    raise InputError(f"--expert-cache {raw!r}: expected all, auto, a slot count (e.g. 4096) or a size (e.g. 12GiB)")


def expert_bytes(model) -> np.ndarray:
    """int64 [L]: bytes of one routed expert (gate + up + down, as stored) in each layer."""
    g = model.geometry
    out = np.zeros(g.n_layers, dtype=np.int64)
    for layer in range(g.n_layers):
        for role in EXPERT_ROLES:
            out[layer] += model.info(f"blk.{layer}.{role}.weight").n_bytes // g.n_expert
    return out


@dataclass
class Residency:
    table: np.ndarray    # int32 [L, E]: slot or -1
    pairs: np.ndarray    # int32 [n_slots, 2]: (layer, expert) of each slot
    slot_bytes: int
    reason: str = ""     # how the slot count was chosen (commands print it)

    @classmethod
    def build(cls, profile: ExpertProfile | None, n_layers: int, n_expert: int, n_slots: int, slot_bytes: int,
              reason: str = "") -> "Residency":
        n_pairs = n_layers * n_expert
        n_slots = max(0, min(int(n_slots), n_pairs))
        if profile is not None:
            order = profile.order()
        elif n_slots in (0, n_pairs):
            order = np.stack(np.divmod(np.arange(n_pairs), n_expert), axis=1).astype(np.int32)
        else:
            raise InputError(f"--expert-cache {n_slots} of {n_pairs} pairs needs --expert-profile (which pairs to "
                             "keep in VRAM)")
        pairs = np.ascontiguousarray(order[:n_slots], dtype=np.int32)
        table = np.full((n_layers, n_expert), -1, dtype=np.int32)
        table[pairs[:, 0], pairs[:, 1]] = np.arange(n_slots, dtype=np.int32)
        return cls(table=table, pairs=pairs, slot_bytes=int(slot_bytes), reason=reason)

    @property
    def n_slots(self) -> int:
        return len(self.pairs)

    @property
    def n_pairs(self) -> int:
        return self.table.size

    @property
    def all_resident(self) -> bool:
        """No miss possible: the window may use the zero-doorbell graph."""
        return self.n_slots == self.n_pairs

    @property
    def resident_bytes(self) -> int:
        return self.n_slots * self.slot_bytes

    def row(self, layer: int) -> np.ndarray:
        return self.table[layer]

    def describe(self) -> str:
        share = self.n_slots / self.n_pairs
        text = (f"expert cache: {self.n_slots} of {self.n_pairs} (layer, expert) pairs in VRAM ({share:.1%}, "
                f"{self.resident_bytes / 2**30:.2f} GiB)")
        return f"{text}, {self.reason}" if self.reason else text


def resolve_slots(spec: CacheSpec, n_pairs: int, slot_bytes: int, free_bytes: int | None = None) -> tuple[int, str]:
    """(slots, how they were chosen). `auto` needs free_bytes: what VRAM has left after dense weights, KV, buffers."""
    if spec.kind == "all":
        return n_pairs, "all experts (--expert-cache all)"
    if spec.kind == "slots":
        return min(spec.value, n_pairs), f"--expert-cache {spec.text}"
    if spec.kind == "bytes":
        n = min(spec.value // max(slot_bytes, 1), n_pairs)
        return n, f"--expert-cache {spec.text} / {slot_bytes:,} bytes per slot"
    if free_bytes is None:
        raise InputError("--expert-cache auto needs the device's free memory (use it with --device gpu)")
    n = min(max(int(free_bytes), 0) // max(slot_bytes, 1), n_pairs)
    return n, f"auto: {max(int(free_bytes), 0) / 2**30:.2f} GiB free after weights and buffers"


def residency_for(spec: CacheSpec | str, model, profile: ExpertProfile | None, profile_path=None,
                  free_bytes: int | None = None) -> Residency:
    """The residency a command asked for on `model` (the profile checked against the model's geometry)."""
    if isinstance(spec, str):
        spec = parse_cache_spec(spec)
    g = model.geometry
    if profile is not None:
        profile.check_model(g, profile_path or "expert profile")
    per_layer = expert_bytes(model)
    slot_bytes = int(per_layer.max())
    n_slots, reason = resolve_slots(spec, g.n_layers * g.n_expert, slot_bytes, free_bytes)
    return Residency.build(profile, g.n_layers, g.n_expert, n_slots, slot_bytes, reason)
