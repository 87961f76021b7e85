"""`--expert-cache all|auto|N|SIZE` parsed, the bytes of one routed expert per layer, the order the cache fills in
(a profile's, or the default), the slot table of its first N pairs, and the residency: which (layer, expert) pairs
the VRAM cache holds (`choose_residency`; the GPU engine uploads them). `strata cache-sim` replays the same tables.
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
AUTO_MARGIN = 1 << 30  # bytes left free by --expert-cache auto (CuPy pools, cuBLAS-free kernels' launches, driver)


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


def parse_size(text, option: str) -> int:
    """Bytes of a size like '512MiB', '1.5G' (= GiB), '2GB' or a plain byte count ('4096')."""
    low = str(text).strip().lower()
    if re.fullmatch(r"\d+", low):
        return int(low)
    m = _SIZE.fullmatch(low)
    if m and m.group(2) in _UNITS:
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    raise OptionError(f"{option} {str(text).strip()!r}: expected a size in bytes like 512MiB, 2GB or 4096")


def expert_bytes(model) -> np.ndarray:
    """int64 [L]: bytes of one routed expert (gate + up + down, as stored) in each layer."""
    g = model.geometry
    out = np.zeros(g.n_layers, dtype=np.int64)
    for layer in range(g.n_layers):
        for role in EXPERT_ROLES:
            out[layer] += model.info(f"blk.{layer}.{role}.weight").n_bytes // g.n_expert
    return out


def fill_order(n_layers: int, n_expert: int, profile=None) -> np.ndarray:
    """(layer, expert) pairs in cache-fill order [L*E, 2] int64: the profile's ranked order (then its other pairs by
    count), or without a profile expert-major, so each layer gets the same share: (0, 0), (1, 0), ..., (L-1, 0),
    (0, 1), ..."""
    default = np.stack(np.meshgrid(np.arange(n_layers), np.arange(n_expert), indexing="xy"), axis=-1).reshape(-1, 2)
    if profile is None:
        return default.astype(np.int64)
    ranked = np.asarray(profile.order(), dtype=np.int64)
    seen = np.zeros((n_layers, n_expert), dtype=bool)
    seen[ranked[:, 0], ranked[:, 1]] = True
    rest = default[~seen[default[:, 0], default[:, 1]]]
    return np.concatenate([ranked, rest]).astype(np.int64)


def slot_table(n_layers: int, n_expert: int, ranked: np.ndarray, n_pairs: int) -> np.ndarray:
    """[L, E] int32: the slot of each of the first n_pairs ranked pairs within its layer's VRAM array, else -1.
    Slots within a layer follow the expert id (a layer's resident experts are uploaded in id order). A layer's
    count of slots is its capacity under every cache policy (tiers/cache_policy.py)."""
    table = np.full((n_layers, n_expert), -1, dtype=np.int32)
    chosen = np.zeros((n_layers, n_expert), dtype=bool)
    top = ranked[:n_pairs]
    chosen[top[:, 0], top[:, 1]] = True
    for layer in range(n_layers):
        ids = np.flatnonzero(chosen[layer])
        table[layer, ids] = np.arange(len(ids), dtype=np.int32)
    return table


def expert_names(layer: int) -> list[str]:
    return [f"blk.{layer}.{role}.weight" for role in EXPERT_ROLES]


def is_expert_tensor(name: str) -> bool:
    return name.endswith(tuple(f"{role}.weight" for role in EXPERT_ROLES))


def ranked_pairs(model, profile_path: str | None, loaded=None) -> np.ndarray:
    """(layer, expert) pairs hottest first [L*E, 2]: fill_order of the profile (checked against the model), or the
    default order without one. loaded: the profile already read from profile_path (stdin cannot be read twice)."""
    g = model.geometry
    profile = loaded
    if profile_path is not None:
        if profile is None:
            from .expert_profile import load_profile

            profile = load_profile(profile_path)
        profile.check_model(g, "stdin" if str(profile_path) == "-" else profile_path)
    return fill_order(g.n_layers, g.n_expert, profile)


def residency_table(model, ranked: np.ndarray, n_pairs: int) -> np.ndarray:
    """[L, E] int32 slot table of the model's first n_pairs ranked pairs (slot_table)."""
    return slot_table(model.geometry.n_layers, model.geometry.n_expert, ranked, n_pairs)


def stage_pairs(ranked: np.ndarray, layers: tuple[int, int] | None) -> np.ndarray:
    """The ranked pairs of layers [lo, hi) only, in their order (a stage of the layer split ranks and fills its own
    layers; None: every layer)."""
    if layers is None:
        return ranked
    lo, hi = layers
    return ranked[(ranked[:, 0] >= lo) & (ranked[:, 0] < hi)]


def choose_residency(model, cfg, free_bytes: int | None, fixed_bytes: int,
                     layers: tuple[int, int] | None = None) -> tuple[np.ndarray, str]:
    """The residency table for cfg (a TierConfig), and the one line saying what was chosen. free_bytes: device memory
    free now (None: unknown); fixed_bytes: what the engine needs besides routed experts (dense weights, arena).
    layers [lo, hi): a stage of the layer split: the table keeps the model's [L, E] shape (global layer indexes) but
    only the stage's rows can hold slots (other rows -1, never read), chosen from the profile's ranking restricted to
    those layers, with the whole budget (--expert-cache N or SIZE is per stage, i.e. per GPU)."""
    kind, value = cfg.cache.kind, cfg.cache.value
    per_pair = expert_bytes(model)
    ranked = stage_pairs(ranked_pairs(model, cfg.profile, cfg.loaded_profile), layers)
    total_pairs = len(ranked)
    cum = np.cumsum(per_pair[ranked[:, 0]])
    if kind == "all":
        n = total_pairs
    elif kind == "slots":
        n = min(value, total_pairs)
    else:
        budget = value if kind == "bytes" else max(0, (free_bytes or 0) - fixed_bytes - AUTO_MARGIN)
        n = int(np.searchsorted(cum, budget, side="right"))
    table = residency_table(model, ranked, n)
    gib = float(cum[n - 1]) / 2**30 if n else 0.0
    source = f"profile {cfg.profile}" if cfg.profile else "no profile: expert id order"
    where = "" if layers is None else f" of layers {layers[0]}..{layers[1] - 1}"
    what = f"expert cache: {n} of {total_pairs} (layer, expert) pairs{where} in VRAM ({gib:.2f} GiB, " \
           f"{n / max(total_pairs, 1):.1%}; --expert-cache {cfg.cache.text}, {source})"
    if kind == "auto" and free_bytes is not None:
        what += f"; {free_bytes / 2**30:.1f} GiB free before loading"
    return table, what
