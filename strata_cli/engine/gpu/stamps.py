"""The profiling variant of the window: which stamps it records, in graph order (strata_cli/engine/stage_timing.py)."""

from __future__ import annotations

from ...gpu.launch_stamp import stamp
from ..stage_timing import Plan


class Stamper:
    """Set as engine.stamper while a profiling window is recorded: each call launches one stamp into the arena's
    stamp buffer and appends its (layer, stage) to the plan."""

    def __init__(self, slots, g):
        self.slots = slots
        self.plan = Plan(g.n_layers, tuple("QSA" if attn else "GDN" for attn in g.layer_is_attn))

    def __call__(self, layer: int, stage: str, stream) -> None:
        stamp(self.slots, self.plan.add(layer, stage), stream=stream)
