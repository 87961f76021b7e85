"""How many bytes a verify window must read: the bandwidth floor a window's time is held against.

Every dense weight is read once per window; the head's full matrix too; of the routed experts only the distinct
ones the window's T rows pick. With uniform routing of k of E experts per row, a layer touches
E * (1 - (1 - k/E)^T) distinct experts on average. Embedding and n-gram rows are gathered (T rows each), and the
KV cache reads are small next to the weights at the contexts benchmarked, so both are left out.

stage_bytes splits a window's reads over the stages of `strata profile` from what the profiling graph's launches
received (engine/stage_bytes.py's ledger), the experts priced the same way, the state (GDN state, K/V cells, pooled
keys) at the profiled depth counted apart.
"""

from __future__ import annotations

from ..model.gguf_file import GGUFModel
from ..model.names import EXPERT_TENSORS, GATHERED


def expected_distinct_experts(n_expert: int, n_used: int, rows: int) -> float:
    return n_expert * (1.0 - (1.0 - n_used / n_expert) ** rows)


def window_bytes(model: GGUFModel, rows: int, layers: tuple[int, int] | None = None) -> dict:
    """{'dense': bytes, 'experts': expected bytes, 'total': ...} for a window of `rows` tokens; layers [a, b): what
    a stage of the layer split over those layers reads (the head's tensors belong to the stage ending at the last
    layer)."""
    g = model.geometry
    lo, hi = layers if layers is not None else (0, g.n_layers)
    dense = expert_bytes = 0
    for info in model.tensors.values():
        layer = int(info.name.split(".")[1]) if info.name.startswith("blk.") else None
        if layer is None and hi < g.n_layers or layer is not None and not lo <= layer < hi:
            continue
        if info.name.endswith(EXPERT_TENSORS):
            expert_bytes += info.n_bytes
        elif info.name not in GATHERED:
            dense += info.n_bytes
    per_expert = expert_bytes / max(hi - lo, 1) / g.n_expert  # mean bytes of one expert of these layers
    experts = (hi - lo) * expected_distinct_experts(g.n_expert, g.n_expert_used, rows) * per_expert
    return {"dense": dense, "experts": experts, "total": dense + experts}


def cells_read(n_cells: int, ratio: int, budget: int) -> int:
    """K/V cells a query row over n_cells visible cells attends to (ops.qsa.select_cells' count): every cell without
    the indexer (ratio 0) or while the blocks fit the budget, else the kept blocks' cells and the incomplete tail."""
    n_blocks = n_cells // ratio if ratio else 0
    keep = budget // ratio if ratio else 0
    if not ratio or n_blocks <= keep:
        return n_cells
    return keep * ratio + n_cells - n_blocks * ratio


def state_read(g, layer: int, stage: str, name: str, nbytes: int, row_bytes: int, n_cells: int) -> int:
    """Bytes a stage reads of a state buffer (engine/stage_bytes.STATE_BUFFERS) its launch received, the window's
    last row seeing n_cells cells (the most of any row: the floor of the rows' union). A QSA layer's mixer
    (qsa_mix) reads cells_read cells of its K/V cache and, where that row is above the budget, its complete pooled
    indexer keys (below it no block is scored); the cache rows it writes are not reads. A GDN state and conv tail
    and the PLE history are read whole."""
    kind = name.split(".")[0]
    if kind in ("kc", "vc"):
        ratio = g.compress_ratios[layer]
        return cells_read(n_cells, ratio, g.idx_budget) * row_bytes if stage == "qsa-mix" else 0
    if kind == "pooled":
        n_blocks = n_cells // g.compress_ratios[layer]
        return n_blocks * row_bytes if stage == "qsa-mix" and n_blocks > g.idx_budget // g.compress_ratios[layer] else 0
    return nbytes


def stage_bytes(reads, g, rows: int, depth: int) -> list[dict]:
    """Bytes each stamped stage of a T = rows window after `depth` committed tokens reads (engine/stage_bytes'
    StageReads, in stamp order): {'layer', 'stage', 'weights', 'experts', 'state', 'bytes'}. 'weights': the dense
    weights its launches received; 'experts': each routed expert tensor at the expected distinct experts of `rows`
    rows (expected_distinct_experts, as window_bytes prices them) plus the shared expert where it is one more expert
    of the tensor; 'state': state_read of each state buffer. Summed over the stages, weights + experts is
    window_bytes' total plus what the device's copies of the dense tensors hold beyond the file's bytes
    (floor_summary's upload_growth_bytes; tests/test_stage_bytes.py holds the two equal)."""
    distinct = expected_distinct_experts(g.n_expert, g.n_expert_used, rows)
    out = []
    for r in reads:
        experts = sum(per * (distinct + held - g.n_expert) for _, per, held in r.experts)
        state = sum(state_read(g, r.layer, r.stage, name, nbytes, row, depth + rows) for name, nbytes, row in r.state)
        out.append({"layer": r.layer, "stage": r.stage, "weights": r.dense, "experts": experts, "state": state,
                    "bytes": r.dense + experts + state})
    return out


def floor_summary(reads: list[dict], window_read_bytes: float, bytes_per_s: float, event_ms: float | None) -> dict:
    """`strata profile`'s floor: the stages' bytes (stage_bytes rows) summed by kind and in all (read_bytes), their
    time at bytes_per_s (floor_ms), the event-timed window against it (x_floor), verify-bench's read_bytes of the
    same window (window_bytes' total) and what the stages' weights + experts hold beyond it (upload_growth_bytes:
    the device's copies of the dense tensors against the file's: each HC read's down + inject rows padded to 32,
    small tensors a file holds as F16 / BF16 / a block type uploaded as f32)."""
    weights = float(sum(r["weights"] for r in reads))
    experts = float(sum(r["experts"] for r in reads))
    state = float(sum(r["state"] for r in reads))
    total = weights + experts + state
    floor_ms = total / bytes_per_s * 1e3 if bytes_per_s else None
    return {"copy_bytes_per_s": bytes_per_s, "read_bytes": total, "weight_bytes": weights, "expert_bytes": experts,
            "state_bytes": state, "floor_ms": floor_ms,
            "x_floor": event_ms / floor_ms if event_ms and floor_ms else None,
            "window_read_bytes": float(window_read_bytes), "upload_growth_bytes": weights + experts - window_read_bytes}


def floor_line(f: dict, depth: int) -> str:
    """floor_summary in words (a header line of `strata profile`)."""
    mb = {k: f[k] / 1e6 for k in ("read_bytes", "weight_bytes", "expert_bytes", "state_bytes", "window_read_bytes",
                                  "upload_growth_bytes")}
    floor = "no copy rate" if f["floor_ms"] is None else f"{f['floor_ms'] * 1e3:.2f} µs"
    vs = "" if f["x_floor"] is None else f", the event-timed window {f['x_floor']:.1f}x it"
    return (f"floor: {mb['read_bytes']:.3f} MB per window (weights {mb['weight_bytes']:.3f} + experts "
            f"{mb['expert_bytes']:.3f} + state at depth {depth} {mb['state_bytes']:.3f}) at "
            f"{f['copy_bytes_per_s'] / 1e9:.0f} GB/s (device copy) = {floor}{vs}; verify-bench's read_bytes "
            f"{mb['window_read_bytes']:.3f} MB (the device's copies of the weights {mb['upload_growth_bytes']:+.3f} MB)")
