"""How many bytes a verify window must read: the bandwidth floor a window's time is held against.

Every dense weight is read once per window; the head's full matrix too; of the routed experts only the distinct
ones the window's T rows pick. With uniform routing of k of E experts per row, a layer touches
E * (1 - (1 - k/E)^T) distinct experts on average. Embedding and n-gram rows are gathered (T rows each), and the
KV cache reads are small next to the weights at the contexts benchmarked, so both are left out.
"""

from __future__ import annotations

from ..model.gguf_file import GGUFModel
from ..model.names import GATHERED

EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


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
