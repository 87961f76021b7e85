"""The profiling variant of the window: which stamps it records, in graph order (strata_cli/engine/stage_timing.py),
and what each stage reads (strata_cli/engine/stage_bytes.py)."""

from __future__ import annotations

from ...gpu.compile import observing
from ...gpu.launch_stamp import stamp
from ..stage_bytes import engine_ledger
from ..stage_timing import Plan


class Stamper:
    """Set as engine.stamper while a profiling window is recorded: each call launches one stamp into the arena's
    stamp buffer and appends its (layer, stage) to the plan; with a ledger (engine/stage_bytes.py, told of the
    launches by compile.observing) it closes the ledger's stage there too, so ledger stage i is plan stamp i's."""

    def __init__(self, slots, g, ledger=None):
        self.slots, self.ledger = slots, ledger
        self.plan = Plan(g.n_layers, tuple("QSA" if attn else "GDN" for attn in g.layer_is_attn))

    def __call__(self, layer: int, stage: str, stream) -> None:
        stamp(self.slots, self.plan.add(layer, stage), stream=stream)
        if self.ledger is not None:  # after the stamp's own launch (which reads no weight)
            self.ledger.close(layer, stage)


def record_profiled(e, T: int, stream, record) -> tuple[Plan, list]:
    """Record engine e's profiling window of T rows (record(e, T, stream): window.record_window) with a Stamper and
    the ledger of what each stage reads: (its stage_timing.Plan, the ledger's StageReads, one per stamp)."""
    ledger = engine_ledger(e.w, e.buf)
    e.stamper = Stamper(e.buf["stamps"], e.g, ledger)
    try:
        with observing(ledger.launch):
            record(e, T, stream)
        return e.stamper.plan, ledger.finish()
    finally:
        e.stamper = None
