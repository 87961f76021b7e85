"""The layer split's plan (pure Python, no device): which contiguous layer range [a, b) each of N stages holds
and how many weight bytes that puts on each.

`--gpus N` alone splits by bytes: stage i holds its layers' dense weights and the routed experts it keeps in VRAM,
stage 0 also the embedding (and the PLE table when the PLE layer is its), the last stage the head (output_hc_*,
output.weight); the ranges minimise the largest stage's bytes (an exact search: contiguous ranges of L layers
into N non-empty parts, O(N L^2), L <= a few hundred). `--layer-split L1,L2,...` gives the layer counts instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import OptionError
from ..model.names import PLE_TABLE

_BLK = re.compile(r"^blk\.(\d+)\.")
EXPERT_SUFFIXES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


@dataclass(frozen=True)
class SplitConfig:
    """--gpus N|ID,ID,... and --layer-split (parsed once, commands/_split.py): devices None = the first `gpus`
    devices; counts None = split by bytes."""

    gpus: int
    counts: tuple[int, ...] | None = None
    devices: tuple[int, ...] | None = None

    def device_ids(self) -> tuple[int, ...]:
        return self.devices if self.devices is not None else tuple(range(self.gpus))


@dataclass(frozen=True)
class StagePlan:
    index: int
    device: int | None   # CUDA device id; None on the numpy path (its stages run one after the other on the CPU)
    layers: tuple[int, int]  # [a, b)
    bytes: int           # weight bytes the stage holds

    @property
    def n_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def describe(self) -> str:
        a, b = self.layers
        where = "" if self.device is None else f"device {self.device}, "
        return f"stage {self.index}: {where}layers {a}..{b - 1} ({self.bytes / 2**20:,.1f} MiB)"


def parse_layer_split(text: str) -> tuple[int, ...]:
    """`3,5` -> (3, 5); an empty item, a non-integer or a count below 1 (an empty range) is one usage error."""
    counts = _int_list("--layer-split", text, "comma-separated layer counts like 24,24")
    if min(counts) < 1:
        raise OptionError(f"--layer-split '{text}': every stage needs at least one layer (an empty range)")
    return counts


def _int_list(option: str, text: str, what: str) -> tuple[int, ...]:
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise OptionError(f"{option} '{text}': an empty item in the list (expected {what})")
    try:
        return tuple(int(item) for item in items)
    except ValueError:
        raise OptionError(f"{option} '{text}': expected {what}") from None


def split_config(gpus: str | None, layer_split: str | None) -> SplitConfig | None:
    """The one SplitConfig of --gpus / --layer-split (None: no split), checked as far as no model or device is
    needed. --gpus N: stages on devices 0..N-1; --gpus 0,0 (a comma list): the device of each stage, one id
    allowed twice (two stages on one GPU, the split's one-GPU check)."""
    if layer_split is not None and gpus is None:
        raise OptionError("--layer-split needs --gpus N (the number of stages it splits the layers over)")
    if gpus is None:
        return None
    ids = _int_list("--gpus", str(gpus), "a device count like 2 or device ids like 0,1")
    devices = None
    if "," in str(gpus):
        if min(ids) < 0:
            raise OptionError(f"--gpus '{gpus}': device ids are 0 or more")
        devices, n = ids, len(ids)
    else:
        n = ids[0]
        if n < 1:
            raise OptionError(f"--gpus {n}: give 1 or more")
    counts = parse_layer_split(layer_split) if layer_split is not None else None
    if counts is not None and len(counts) != n:
        raise OptionError(f"--layer-split '{layer_split}' has {len(counts)} ranges for --gpus {gpus} ({n} stages)")
    return SplitConfig(n, counts, devices)


def layer_bytes(model, resident=None) -> tuple[list[int], int, int]:
    """(bytes per layer, bytes of the first stage's extras, bytes of the last stage's extras). resident: a
    residency table [L, E] (>= 0: in VRAM) counting only the VRAM experts; None: every expert."""
    g = model.geometry
    per = [0] * g.n_layers
    first = last = 0
    for name in list(model.specs) + ([PLE_TABLE] if g.ple is not None else []):
        n = model.info(name).n_bytes
        m = _BLK.match(name)
        if m:
            layer = int(m.group(1))
            if resident is not None and name.endswith(EXPERT_SUFFIXES):
                n = n * int((resident[layer] >= 0).sum()) // g.n_expert
            per[layer] += n
        elif name == PLE_TABLE:
            per[g.ple.layer] += n   # gathered at the PLE layer: it lives with that layer's stage
        elif name.startswith("output"):
            last += n
        else:
            first += n              # token_embd
    return per, first, last


def balanced_ranges(per: list[int], n: int, first: int = 0, last: int = 0) -> list[tuple[int, int]]:
    """n contiguous non-empty ranges of len(per) layers minimising the largest stage's bytes (first and last:
    the fixed bytes of stage 0 and stage n - 1); ties go to the earliest cut."""
    L = len(per)
    if not 1 <= n <= L:
        raise OptionError(f"--gpus {n}: the model has {L} layers (each stage needs at least one)")
    prefix = [0]
    for b in per:
        prefix.append(prefix[-1] + b)

    def cost(i, a, b):  # stage i over layers [a, b)
        return prefix[b] - prefix[a] + (first if i == 0 else 0) + (last if i == n - 1 else 0)

    INF = float("inf")
    # best[i][b]: the smallest max-bytes of stages 0..i covering layers [0, b); cut[i][b] the start of stage i
    best = [[INF] * (L + 1) for _ in range(n)]
    cut = [[0] * (L + 1) for _ in range(n)]
    for b in range(1, L + 1):
        best[0][b] = cost(0, 0, b)
    for i in range(1, n):
        for b in range(i + 1, L + 1):
            for a in range(i, b):
                v = max(best[i - 1][a], cost(i, a, b))
                if v < best[i][b]:
                    best[i][b], cut[i][b] = v, a
    ranges, b = [], L
    for i in range(n - 1, 0, -1):
        a = cut[i][b]
        ranges.append((a, b))
        b = a
    ranges.append((0, b))
    return ranges[::-1]


def plan_split(cfg: SplitConfig, model, n_visible: int | None, resident=None) -> list[StagePlan]:
    """The stages of cfg for model. n_visible: CUDA devices visible (None: the numpy path, stages without a
    device). A device the host does not have is refused in one line saying how many it has."""
    L = model.geometry.n_layers
    devices = cfg.device_ids()
    if n_visible is not None and max(devices) >= n_visible:
        asked = f"--gpus {cfg.gpus}" if cfg.devices is None else f"--gpus {','.join(map(str, devices))}"
        raise OptionError(f"{asked}: {n_visible} CUDA device{'s' if n_visible != 1 else ''} visible "
                          f"(ids 0..{n_visible - 1}; --gpus 0,0 puts two stages on one GPU)")
    per, first, last = layer_bytes(model, resident)
    if cfg.counts is None:
        ranges = balanced_ranges(per, cfg.gpus, first, last)
    else:
        if sum(cfg.counts) != L:
            raise OptionError(f"--layer-split {','.join(map(str, cfg.counts))}: sums to {sum(cfg.counts)} layers, "
                              f"the model has {L}")
        ranges, a = [], 0
        for c in cfg.counts:
            ranges.append((a, a + c))
            a += c
    stages = []
    for i, (a, b) in enumerate(ranges):
        nbytes = sum(per[a:b]) + (first if i == 0 else 0) + (last if i == len(ranges) - 1 else 0)
        stages.append(StagePlan(i, None if n_visible is None else devices[i], (a, b), nbytes))
    return stages
