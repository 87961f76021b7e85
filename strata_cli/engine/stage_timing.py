"""Where a verify window's GPU time goes: the stage table of the stamps and its aggregation (pure numpy).

The profiling variant of the window graph (engine.graph(T, profile=True)) writes `%globaltimer` (ns) into one
uint64 slot per (layer, stage) at each stage boundary; row `n_layers` holds the window-level stages (embedding,
head). A slot's stamp is taken when everything before it on the stream has finished, so the time of the stage
that ends at a stamp is that stamp minus the previous valid stamp in graph order (the seed's rule).

Robustness (the seed once printed ~1e14 ms for slots nobody stamped): a zero slot is missing; a stamp earlier
than the previous valid one (out of order, or left over from an earlier window) or later than the window's end
stamp / the event-timed bound is invalid. Invalid stamps contribute nothing and do not move the reference, so
the time they would have ended goes to the next valid stamp, and the stage times of a window always sum to at
most its end stamp minus its begin stamp. Differences are taken modulo 2**64, so a wrap of the timer between
two stamps is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Stages of a layer, in the order the window records them; a GDN layer uses the GDN ones, a QSA layer the QSA
# ones. (seed n) names the seed's stamp whose work the stage holds; stages without one are strata's own.
LAYER_STAGES = (
    "hc0-norm",       # (seed 27) hyper-connection read before the block: RMS norm of the C streams (the first layer of
                      # the window or stage)
    "hc0-write+norm",  # the same after the previous layer's pending MoE write, in one kernel (with every expert in
                       # VRAM also the experts' weighted sum + shared expert, seed 24's combine); at the PLE layer
                       # the PLE's mix with it (gate, norms, conv step and residual add: ple.cu ple_mix_norm)
    "hc0-down",       # (seed 28) its down + inject GEMV (one matrix)
    "hc-read0",       # (seeds 29, 1) up GEMV, gates, mix and inject gates (hyper.cu hc_up_mix)
    "qkv",            # (seeds 2, 5) GDN: qkv projection (and the z (output gate) projection where they stack)
    "z",              # (seed 5) GDN: z projection, when its type is not qkv's
    "ab",             # (seed 4) GDN: alpha and beta projections, only for types gdn_mix does not decode
    "gdn-mix",        # (seeds 3, 4, 6, 14) GDN: conv + q/k/v split, gates, delta-rule recurrence, gated RMS norm
    "kvq",            # (seeds 7, 8, 10) QSA: the k, v, q(+gate) and indexer q / k projections (one GEMV where they
                      # stack)
    "qsa-mix",        # (seeds 7-11, 13) QSA: norms and ropes, the K/V cache append, the window's pooled indexer
                      # keys, block scores + cell selection and the attention over the selected cells (qsa.cu qsa_mix:
                      # one launch)
    "out-proj",       # (seed 16) output projection of the block
    "hc1-write+norm",  # hyper-connection read before the MoE: the block's residual write and the norm in one kernel
    "hc1-down",       # its down + inject GEMV
    "hc-read1",       # (seed 17) its up GEMV, gates, mix and inject gates
    "router",         # (seed 17) router GEMV + top-k
    "shared",         # (seed 18) shared expert, where it has launches of its own (else an entry of "experts")
    "waitA",          # (seed 19) expert tiers: wait for the plan (stamped by the tier code when it exists)
    "experts",        # (seeds 20, 18) expert grouping + routed expert GEMVs held in VRAM (with the shared expert
                      # where it joins their tensors)
    "waitB",          # (seed 21) expert tiers: wait for the host copies
    "pcie-group",     # (seed 22) expert tiers: experts read over PCIe
    "waitCPU",        # (seed 23) expert tiers: wait for the host-computed experts
    "moe-tiers",      # expert tiers: what of the tiered MoE (engine/gpu/tiers.py) no finer stamp took
    "gap",            # (seed 25) from the layer's last stamp to the next layer's first (node overhead)
)
# Stages of the window outside the layers (row n_layers). "begin" is the reference (first node of the graph),
# "argmax" ends the window (its stamp is the last node: greedy ids copied out). "ple": the per-layer embedding's
# n-gram rows and their key / value projection, which read the tokens only (the window's inputs, before the
# embedding; where the engine holds the PLE layer); its mix is the PLE layer's "hc0-write+norm".
HEAD_STAGES = ("begin", "ple", "embed", "hc-out", "lm-head", "argmax")
STAGES_PER_ROW = len(LAYER_STAGES)
_LAYER_INDEX = {name: i for i, name in enumerate(LAYER_STAGES)}
_HEAD_INDEX = {name: i for i, name in enumerate(HEAD_STAGES)}


def n_slots(n_layers: int) -> int:
    """uint64 slots of the stamp buffer: one row per layer plus the window row."""
    return (n_layers + 1) * STAGES_PER_ROW


def slot(n_layers: int, layer: int, stage: str) -> int:
    """Slot of (layer, stage); layer == n_layers addresses the window row (HEAD_STAGES)."""
    if not 0 <= layer <= n_layers:
        raise ValueError(f"layer {layer} outside 0..{n_layers}")
    table = _HEAD_INDEX if layer == n_layers else _LAYER_INDEX
    if stage not in table:
        raise ValueError(f"unknown {'window' if layer == n_layers else 'layer'} stage '{stage}'")
    return layer * STAGES_PER_ROW + table[stage]


@dataclass
class Plan:
    """The stamps of one captured window, in graph order: slot, layer and stage of each."""

    n_layers: int
    layer_kinds: tuple[str, ...]            # "GDN" or "QSA" per layer
    slots: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)

    def add(self, layer: int, stage: str) -> int:
        s = slot(self.n_layers, layer, stage)
        if s in self.slots:
            raise ValueError(f"stage '{stage}' of layer {layer} stamped twice in one window")
        self.slots.append(s)
        self.layers.append(layer)
        self.stages.append(stage)
        return s

    def group(self, i: int) -> str:
        """'GDN', 'QSA' or 'head' for the i-th stamp."""
        layer = self.layers[i]
        return "head" if layer == self.n_layers else self.layer_kinds[layer]


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def stage_durations(stamps, order, limit_ns=None) -> np.ndarray:
    """ns of each stamp's stage per window: stamps [W, n_slots] (or [n_slots]) uint64, order [K] slots in graph
    order (order[0] = the window's begin stamp, order[-1] its end stamp) -> int64 [W, K].

    limit_ns (scalar or [W]): an upper bound on a window's span (its CUDA-event time); stamps past it, or past
    the end stamp, are invalid. The first valid stamp is the reference and has duration 0."""
    raw = np.atleast_2d(np.asarray(stamps, dtype=np.uint64))
    t = raw[:, np.asarray(order, dtype=np.int64)]
    W, K = t.shape
    present = t != 0
    first = np.where(present.any(axis=1), present.argmax(axis=1), 0)
    anchor = t[np.arange(W), first]
    with np.errstate(over="ignore"):
        rel = ((t - anchor[:, None]) & _MASK64).view(np.int64)   # wrap-safe difference, signed
    big = np.iinfo(np.int64).max
    bound = np.full(W, big, dtype=np.int64)
    end_ok = present[:, -1] & (rel[:, -1] > 0)
    bound[end_ok] = rel[end_ok, -1]
    if limit_ns is not None:
        limit = np.broadcast_to(np.asarray(limit_ns, dtype=np.float64), (W,))
        limit = np.where(np.isfinite(limit) & (limit > 0), np.minimum(limit, 9e18), 9e18).astype(np.int64)
        bound = np.minimum(bound, limit)
    out = np.zeros((W, K), dtype=np.int64)
    prev = np.zeros(W, dtype=np.int64)
    for k in range(K):
        r = rel[:, k]
        ok = present[:, k] & (r >= prev) & (r <= bound)
        out[:, k] = np.where(ok, r - prev, 0)
        prev = np.where(ok, r, prev)
    return out


@dataclass
class StageReport:
    """Mean ms per window per stage, by group and per layer, against the event-timed windows."""

    windows: int
    window_size: int
    groups: list[dict]            # {"group", "stage", "ms", "layers", "bytes"} in first-seen graph order
    layers: list[dict]            # {"layer", "group", "stage", "ms", "bytes"} in graph order
    stamped_ms: float             # mean per window of all stage times
    event_ms: float | None        # mean CUDA-event time of the same windows
    read_bytes: float | None = None  # what the stamped stages read per window (None: not tallied)

    @property
    def unaccounted_ms(self) -> float | None:
        return None if self.event_ms is None else self.event_ms - self.stamped_ms

    @property
    def unaccounted_share(self) -> float | None:
        if self.event_ms is None or self.event_ms <= 0:
            return None
        return self.unaccounted_ms / self.event_ms


def aggregate(stamps, plan: Plan, event_ms=None, window_size: int = 0, stage_bytes=None) -> StageReport:
    """StageReport of W windows: stamps [W, n_slots] uint64, event_ms [W] (or None) from CUDA events; stage_bytes
    (or None): the bytes each stamp's stage reads per window, in plan order (analysis/traffic.stage_bytes)."""
    stamps = np.atleast_2d(np.asarray(stamps, dtype=np.uint64))
    if stage_bytes is not None and len(stage_bytes) != len(plan.slots):
        raise ValueError(f"stage_bytes: {len(stage_bytes)} stages for {len(plan.slots)} stamps")
    nbytes = [None] * len(plan.slots) if stage_bytes is None else [float(b) for b in stage_bytes]
    W = stamps.shape[0]
    limit = None if event_ms is None else np.asarray(event_ms, dtype=np.float64) * 1e6
    ns = stage_durations(stamps, plan.slots, limit)
    mean_ms = ns.sum(axis=0) / max(W, 1) / 1e6
    groups: dict[tuple[str, str], dict] = {}
    layers = []
    for i, stage in enumerate(plan.stages):
        if i == 0:
            continue  # the reference stamp: no stage ends there
        group = plan.group(i)
        key = (group, stage)
        if key not in groups:
            groups[key] = {"group": group, "stage": stage, "ms": 0.0, "layers": 0,
                           "bytes": None if stage_bytes is None else 0.0}
        groups[key]["ms"] += float(mean_ms[i])
        groups[key]["layers"] += 1
        if stage_bytes is not None:
            groups[key]["bytes"] += nbytes[i]
        layers.append({"layer": plan.layers[i], "group": group, "stage": stage, "ms": float(mean_ms[i]),
                       "bytes": nbytes[i]})
    return StageReport(windows=W, window_size=window_size, groups=list(groups.values()), layers=layers,
                       stamped_ms=float(ns.sum() / max(W, 1) / 1e6),
                       event_ms=None if event_ms is None else float(np.mean(event_ms)),
                       read_bytes=None if stage_bytes is None else float(sum(nbytes)))


def summary_line(report: StageReport) -> str:
    """The seed's one-line summary: GDN stages, QSA stages, total; the window stages (embedding,
    head) are listed with the GDN ones, where the seed puts its head."""
    parts = {"GDN": [], "QSA": [], "head": []}
    for row in report.groups:
        if row["ms"] > 0:
            parts[row["group"]].append(f" {row['stage']} {row['ms']:.2f}")
    return (" GDN layers:" + "".join(parts["GDN"] + parts["head"]) + " | QSA layers:" + "".join(parts["QSA"])
            + f" | total {report.stamped_ms:.2f} ms/window over {report.windows} windows")


class Accumulator:
    """Stamps of the windows an engine ran with STRATA_VERIFY_PROFILE set, per window size (one plan each)."""

    def __init__(self):
        self.rows: dict[int, list[np.ndarray]] = {}
        self.plans: dict[int, Plan] = {}
        self.event_ms: dict[int, list[float | None]] = {}

    def add(self, T: int, plan: Plan, stamps: np.ndarray, event_ms: float | None = None) -> None:
        self.plans[T] = plan
        self.rows.setdefault(T, []).append(np.array(stamps, dtype=np.uint64, copy=True))
        self.event_ms.setdefault(T, []).append(event_ms)

    def report_lines(self) -> list[str]:
        """One summary line per window size, then reset (the seed's counters reset on each report)."""
        lines = []
        for T in sorted(self.rows):
            events = self.event_ms[T]
            ev = None if any(e is None for e in events) else np.asarray(events)
            rep = aggregate(np.stack(self.rows[T]), self.plans[T], ev, T)
            lines.append(f"strata verify profile T={T}:" + summary_line(rep))
        self.rows.clear()
        self.event_ms.clear()
        return lines


# Accumulators of the engines made in this process with STRATA_VERIFY_PROFILE set; the CLI prints them after a
# command (strata_cli/cli.py).
ACTIVE: list[Accumulator] = []


def register(acc: Accumulator) -> Accumulator:
    ACTIVE.append(acc)
    return acc


def pending_lines() -> list[str]:
    lines = []
    for acc in ACTIVE:
        lines += acc.report_lines()
    return lines


BAR_WIDTH = 40  # characters of a 100 % bar
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(share: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of share (0..1) of `width` characters, in eighths of a character."""
    if not np.isfinite(share) or share <= 0:
        return ""
    eighths = int(round(min(share, 1.0) * width * 8))
    return "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")


def floor_us(nbytes: float | None, bytes_per_s: float | None) -> float | None:
    """µs reading nbytes takes at the measured copy rate (None: either unknown)."""
    if nbytes is None or not bytes_per_s:
        return None
    return nbytes / bytes_per_s * 1e6


def x_floor(ms: float | None, floor: float | None) -> float | None:
    """How many times its bandwidth floor (µs) a stage's time (ms) is; None without a floor (a stage reading
    nothing counted: the embedding's gather, the argmax)."""
    if ms is None or not floor:
        return None
    return ms * 1e3 / floor


def table_rows(report: StageReport, per_layer: bool = False, bytes_per_s: float | None = None) -> list[dict]:
    """Rows of `strata profile`: one per (group, stage) in graph order (GDN, QSA, head), per-layer rows when
    asked, then the totals: stamped time, the event-timed window and what the stamps leave unaccounted. Each row's
    bytes (what its stages read per window, None when the report has none), floor_us (those bytes at bytes_per_s,
    the measured copy rate) and x_floor (ms / floor)."""
    base = report.event_ms if report.event_ms and report.event_ms > 0 else report.stamped_ms
    order = {"head": 0, "GDN": 1, "QSA": 2}
    rows = []

    def row(layer, group, stage, ms, layers=None, nbytes=None):
        share = ms / base if base > 0 else float("nan")
        floor = floor_us(nbytes, bytes_per_s)
        return {"layer": layer, "group": group, "stage": stage, "layers": layers, "ms": ms, "share": share,
                "bytes": nbytes, "floor_us": floor, "x_floor": x_floor(ms, floor), "bar": bar(share)}

    def total(rows_of):
        return None if report.read_bytes is None else sum(r["bytes"] for r in rows_of)

    groups = sorted(report.groups, key=lambda r: order[r["group"]])  # stable: graph order within a group
    for r in groups:
        rows.append(row("all", r["group"], r["stage"], r["ms"], r["layers"], r["bytes"]))
    if per_layer:
        for r in report.layers:
            rows.append(row("head" if r["group"] == "head" else str(r["layer"]), r["group"], r["stage"], r["ms"],
                            nbytes=r["bytes"]))
    for g in ("GDN", "QSA", "head"):
        mine = [r for r in report.groups if r["group"] == g]
        if mine:
            rows.append(row("all", g, "(all stages)", sum(r["ms"] for r in mine), nbytes=total(mine)))
    rows.append(row("", "total", "stamped", report.stamped_ms, nbytes=report.read_bytes))
    if report.event_ms is not None:
        rows.append(row("", "total", "event-timed window", report.event_ms, nbytes=report.read_bytes))
        rows.append(row("", "total", "unaccounted", report.unaccounted_ms))
    return rows


def accounting_line(report: StageReport, tolerance: float = 0.05) -> str:
    """Whether the stamps account for the event-timed window within `tolerance`, in words and numbers."""
    if report.event_ms is None:
        return f"stamps: {report.stamped_ms:.4f} ms per window (no event time to compare)"
    miss, share = report.unaccounted_ms, report.unaccounted_share
    verdict = "within" if share is not None and abs(share) <= tolerance else "NOT within"
    return (f"stamps {report.stamped_ms:.4f} ms vs event-timed {report.event_ms:.4f} ms per window: "
            f"unaccounted {miss:.4f} ms ({share * 100:.1f} %), {verdict} {tolerance * 100:.0f} %")
