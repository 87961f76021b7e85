"""Routing traces: every routed pick of a run, in the order the engine served them (`make-profile --trace`), the
input of `strata cache-sim`.

A NumPy archive (.npz) of int32 arrays `window`, `row`, `layer`, `expert`, one element per pick (window = the
index of the counting run's window, row = the token's index in the sequence, i.e. its position counted across
context restarts), plus the scalars `n_layers`, `n_expert` and int64 `expert_bytes` [n_layers] (the bytes of one
routed expert of each layer as stored, gate + up + down: what a cache copies per admitted pair). Picks of one
window come layer by layer, each layer's rows in order, each row's top-k slots in order.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

PICK_ARRAYS = ("window", "row", "layer", "expert")


@dataclass
class RoutingTrace:
    n_layers: int
    n_expert: int
    expert_bytes: np.ndarray                       # int64 [n_layers]
    window: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    layer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    expert: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def n_windows(self) -> int:
        return int(self.window.max()) + 1 if len(self.window) else 0

    def counts(self) -> np.ndarray:
        """int64 [L, E]: picks per pair (what count_routing returns for the same run)."""
        flat = self.layer.astype(np.int64) * self.n_expert + self.expert
        return np.bincount(flat, minlength=self.n_layers * self.n_expert).reshape(self.n_layers, self.n_expert)

    def window_bounds(self) -> np.ndarray:
        """[n_windows + 1] offsets: picks of window w are [bounds[w], bounds[w + 1])."""
        return np.searchsorted(self.window, np.arange(self.n_windows + 1), side="left")


class TraceRecorder:
    """Collects the picks of a counting run: window(w, row0) before each window, then pick(layer, ids [n, K])."""

    def __init__(self, n_layers: int, n_expert: int, expert_bytes):
        self.n_layers, self.n_expert = n_layers, n_expert
        self.expert_bytes = np.asarray(expert_bytes, dtype=np.int64)
        self.parts: list[tuple[int, int, int, np.ndarray]] = []
        self.w, self.row0 = 0, 0

    def window(self, w: int, row0: int) -> None:
        self.w, self.row0 = w, row0

    def pick(self, layer: int, ids: np.ndarray) -> None:
        self.parts.append((self.w, self.row0, layer, np.asarray(ids, dtype=np.int32).copy()))

    def trace(self) -> RoutingTrace:
        cols = {k: [] for k in PICK_ARRAYS}
        for w, row0, layer, ids in self.parts:
            n, k = ids.shape
            cols["window"].append(np.full(n * k, w, np.int32))
            cols["row"].append(np.repeat(np.arange(row0, row0 + n, dtype=np.int32), k))
            cols["layer"].append(np.full(n * k, layer, np.int32))
            cols["expert"].append(ids.reshape(-1))
        arrays = {k: np.concatenate(v) if v else np.zeros(0, np.int32) for k, v in cols.items()}
        return RoutingTrace(self.n_layers, self.n_expert, self.expert_bytes, **arrays)


def save_trace(trace: RoutingTrace, path) -> None:
    """Write the archive atomically (fileio: temp file + rename)."""
    from ..sysio.files import output_stream

    buf = io.BytesIO()
    np.savez(buf, **{k: getattr(trace, k).astype(np.int32) for k in PICK_ARRAYS},
             n_layers=np.int32(trace.n_layers), n_expert=np.int32(trace.n_expert),
             expert_bytes=trace.expert_bytes.astype(np.int64))
    with output_stream(path, what="routing trace", binary=True) as fh:
        fh.write(buf.getvalue())


def check_trace_path(path) -> None:
    from ..sysio.files import check_output_path

    if not str(path).lower().endswith(".npz"):
        raise InputError(f"{path}: a routing trace is a NumPy archive: name it .npz")
    check_output_path(path, what="routing trace")


def load_trace(path) -> RoutingTrace:
    """The archive at path; anything malformed is one InputError naming the file and the problem."""
    import zipfile

    from ..sysio.files import read_bytes

    data = read_bytes(path, what="routing trace")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError):
        raise InputError(f"{path}: not a routing trace (not a NumPy .npz archive)") from None
    missing = [k for k in PICK_ARRAYS + ("n_layers", "n_expert", "expert_bytes") if k not in arrays]
    if missing:
        raise InputError(f"{path}: routing trace without {', '.join(missing)}")
    n_layers, n_expert = int(arrays["n_layers"]), int(arrays["n_expert"])
    if n_layers < 1 or n_expert < 1:
        raise InputError(f"{path}: routing trace of {n_layers} layers x {n_expert} experts")
    picks = {k: np.asarray(arrays[k]) for k in PICK_ARRAYS}
    lengths = {len(v.reshape(-1)) for v in picks.values()}
    if len(lengths) != 1 or any(v.ndim != 1 for v in picks.values()):
        raise InputError(f"{path}: window, row, layer and expert must be 1-d arrays of equal length")
    for k, v in picks.items():
        if not np.issubdtype(v.dtype, np.integer):
            raise InputError(f"{path}: {k} holds {v.dtype}, not integers")
    for k, hi in (("layer", n_layers), ("expert", n_expert)):
        bad = np.flatnonzero((picks[k] < 0) | (picks[k] >= hi))
        if bad.size:
            raise InputError(f"{path}: pick {int(bad[0])} has {k} {int(picks[k][bad[0]])} out of range 0..{hi - 1}")
    w = picks["window"]
    if len(w) and (w[0] < 0 or (np.diff(w) < 0).any()):
        raise InputError(f"{path}: window indices must start >= 0 and never decrease (picks in the order served)")
    nbytes = np.asarray(arrays["expert_bytes"], dtype=np.int64).reshape(-1)
    if len(nbytes) != n_layers or (nbytes < 0).any():
        raise InputError(f"{path}: expert_bytes must hold {n_layers} sizes >= 0")
    return RoutingTrace(n_layers, n_expert, nbytes, **{k: v.astype(np.int32) for k, v in picks.items()})
