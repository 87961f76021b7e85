"""What each stage of the profiling window reads: a ledger filled while the profiling graph is recorded (pure: it
looks at array addresses and sizes only, so the CPU listing of a window (tests/window_launches.py) fills it too).

Between two stamps every kernel launch's array arguments are looked up among the engine's allocations:

- a dense weight (any DeviceWeights upload but the routed experts and the gathered tables) counts the bytes of the
  argument the launch receives (its slice), once per launch;
- a routed expert tensor [E (+1 where the shared expert joins it), ...] is noted with one expert's bytes: which
  experts a window reads depends on its routing, so analysis/traffic.stage_bytes prices them at the expected
  distinct experts of T rows, as verify-bench's floor does (the shared one always);
- a gathered table (token and n-gram embeddings) counts nothing: T rows of it, left out of verify-bench's floor too;
- a state buffer of the arena (STATE_BUFFERS) is noted with its bytes and its row bytes: what a window reads of a
  K/V cache or the pooled indexer keys depends on the depth (traffic.stage_bytes), a GDN state is read whole.

Anything else a launch receives (activations, scratch, the stamp slots) is not counted. The ledger's stages line up
with the stamps of the window's stage_timing.Plan: stage i holds the launches between stamp i-1 and stamp i.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from ..gpu.launch_util import data_ptr
from ..model.names import EXPERT_TENSORS, GATHERED

WEIGHT, EXPERTS, TABLE, STATE = "weight", "experts", "gathered", "state"
# arena buffers (their name before ".<layer>") a window reads as state: the GDN recurrent state and conv tail, the
# PLE's history, a QSA layer's K/V cache cells and pooled indexer keys
STATE_BUFFERS = ("S", "conv", "ple_history", "kc", "vc", "pooled")


@dataclass(frozen=True)
class Region:
    """One allocation the ledger knows: its name (a weight's, or an arena buffer's), kind, address range and the
    bytes of one slice along its first axis (an expert, a cache cell, a pooled block)."""

    name: str
    kind: str
    start: int
    nbytes: int
    row_bytes: int


@dataclass
class StageReads:
    """The reads of one stamped stage: dense weight bytes, and the expert tensors and state buffers it received
    (each once per launch, with the region's row bytes and size: traffic.stage_bytes prices them)."""

    layer: int
    stage: str
    dense: int = 0
    weights: list[tuple[str, int]] = field(default_factory=list)         # (name, bytes) of each dense argument
    experts: list[tuple[str, int, int]] = field(default_factory=list)    # (name, bytes of one expert, experts held)
    state: list[tuple[str, int, int]] = field(default_factory=list)      # (name, bytes, bytes of one row)
    launches: int = 0


def region(name: str, kind: str, array) -> Region | None:
    """The Region of a device (or host) array; None for an empty one."""
    nbytes = int(array.nbytes)
    if nbytes == 0:
        return None
    rows = int(array.shape[0]) if array.ndim else 1
    return Region(name, kind, data_ptr(array), nbytes, nbytes // max(rows, 1))


def weight_kind(name: str) -> str:
    if name.endswith(EXPERT_TENSORS):
        return EXPERTS
    return TABLE if name in GATHERED else WEIGHT


def state_name(name: str) -> bool:
    """Whether arena buffer `name` ("S.3", "ple_history") holds state a window reads."""
    return name.split(".")[0] in STATE_BUFFERS


class Ledger:
    """Filled while a window is recorded: launch(function, args) at every kernel launch (compile.observing),
    close(layer, stage) at every stamp (engine/gpu/stamps.Stamper)."""

    def __init__(self, regions):
        self.regions = sorted((r for r in regions if r is not None), key=lambda r: r.start)
        for a, b in zip(self.regions, self.regions[1:]):
            if a.start + a.nbytes > b.start:
                raise ValueError(f"regions {a.name} and {b.name} overlap")
        self._starts = [r.start for r in self.regions]
        self.stages: list[StageReads] = []
        self._open = StageReads(-1, "")

    def find(self, array) -> Region | None:
        """The region holding `array`'s first byte, or None."""
        p = data_ptr(array)
        i = bisect_right(self._starts, p) - 1
        if i < 0:
            return None
        r = self.regions[i]
        return r if p < r.start + r.nbytes else None

    def launch(self, function: str, args) -> None:
        """One kernel launch: its array arguments (numpy or CuPy; scalars and None skipped) tallied into the
        open stage; the same argument given twice to one launch counts once."""
        reads = self._open
        reads.launches += 1
        seen = set()
        for a in args:
            if getattr(a, "ndim", 0) < 1 or not hasattr(a, "nbytes"):
                continue  # numpy scalars, ints, None (U.null_or's 0)
            r = self.find(a)
            key = (data_ptr(a), int(a.nbytes))
            if r is None or key in seen:
                continue
            seen.add(key)
            nbytes = min(int(a.nbytes), r.start + r.nbytes - key[0])
            if r.kind == WEIGHT:
                reads.dense += nbytes
                reads.weights.append((r.name, nbytes))
            elif r.kind == EXPERTS:
                reads.experts.append((r.name, r.row_bytes, r.nbytes // r.row_bytes))
            elif r.kind == STATE:
                reads.state.append((r.name, nbytes, r.row_bytes))

    def close(self, layer: int, stage: str) -> None:
        """A stamp: the launches since the last one are stage (layer, stage)'s."""
        self._open.layer, self._open.stage = layer, stage
        self.stages.append(self._open)
        self._open = StageReads(-1, "")

    def finish(self) -> list[StageReads]:
        """The stages, once the window is recorded; launches after the last stamp would be no stage's."""
        if self._open.launches:
            raise ValueError(f"{self._open.launches} launches after the window's last stamp")
        return self.stages


def engine_ledger(weights, buf: dict) -> Ledger:
    """The ledger of an engine's allocations: every DeviceWeights upload (weights.arrays()) and the arena's state
    buffers."""
    regions = [region(name, weight_kind(name), arr) for name, arr in weights.arrays()]
    regions += [region(name, STATE, arr) for name, arr in buf.items() if state_name(name)]
    return Ledger(regions)
