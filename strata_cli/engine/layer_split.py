"""The layer split (`--gpus N`, `--layer-split`): one engine of the contract (engine/contract.py) made of stage
engines, each over a contiguous layer range [a, b) of the plan (engine/layer_plan.py), run one after the other.

Stage 0 embeds the window's tokens, every stage runs its layers on the residual stack R [T, C, D] the one before
handed on, the last stage reads the head. Nothing else crosses a boundary: every stage stages the tokens and
positions itself (its QSA layers read the positions, the PLE layer the tokens), and its sequence state (KV, GDN,
indexer, PLE history) is that of its own layers. commit(n_keep) commits every stage.

SplitEngine holds what both engines share (the contract, the per-stage timings verify-bench reports);
ReferenceSplit runs numpy stages (ReferenceEngine with a layer range), the hand-off a copy of R; the GPU split
(engine/gpu/layer_split.py) runs GPUEngine stages, one per device, the hand-off a peer copy.
"""

from __future__ import annotations

import time

import numpy as np

from .contract import WindowResult, WindowTimer
from .layer_plan import StagePlan
from .state import check_n_keep, check_window


class SplitEngine:
    """The contract over self.stages (engines with a layer range, in layer order) and their plan."""

    # the contract's engine-wide tiers: none (each GPU stage has its own, stage.tiers); tier_note: the stages' lines
    tiers = tier_note = None

    def __init__(self, stages: list, plan: list[StagePlan]):
        self.stages, self.plan = stages, plan
        first = stages[0]
        self.model = first.model
        self.g, self.n_ctx, self.max_t = first.g, first.n_ctx, first.max_t
        self.capabilities = first.capabilities
        self.split_note = "layer split: " + "; ".join(p.describe() for p in plan)
        # per window size T: one (stage ms [S], hand-off ms [S - 1]) per window run, in order
        self.stage_times: dict[int, list[tuple[list[float], list[float]]]] = {}

    @property
    def capture_ms(self) -> dict[int, float]:
        """Capture ms of each T: the stages' graphs together."""
        sizes = set().union(*(s.capture_ms for s in self.stages))
        return {T: sum(s.capture_ms.get(T, 0.0) for s in self.stages) for T in sizes}

    @property
    def n_past(self) -> int:
        return self.stages[0].n_past

    def reset(self) -> None:
        for s in self.stages:
            s.reset()

    def close(self) -> None:
        for s in self.stages:
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self, tokens, pos0):
        return check_window(tokens, pos0, self.n_past, self.g.n_vocab, self.n_ctx, self.max_t)

    def _record_times(self, T: int, stage_ms: list[float], hand_ms: list[float]) -> None:
        self.stage_times.setdefault(T, []).append((stage_ms, hand_ms))

    def stage_report(self, T: int, n_windows: int) -> list[dict]:
        """One dict per stage: its device, layers, weight bytes, the median and mean of its window time and the
        median of its hand-off to the next stage (None for the last) over the last n_windows windows of T rows."""
        rows = self.stage_times.get(T, [])[-n_windows:]
        out = []
        for p in self.plan:
            i = p.index
            ms = [r[0][i] for r in rows]
            hand = [r[1][i] for r in rows] if i < len(self.plan) - 1 else []
            out.append({"stage": i, "device": p.device, "layers": f"{p.layers[0]}..{p.layers[1] - 1}",
                        "weight_bytes": p.bytes, "ms_median": float(np.median(ms)) if ms else None,
                        "ms_mean": float(np.mean(ms)) if ms else None,
                        "handoff_ms_median": float(np.median(hand)) if hand else None})
        return out


class ReferenceSplit(SplitEngine):
    """numpy stages: each a ReferenceEngine over its range; the hand-off is a copy of R [T, C, D] (what a device
    boundary moves), timed on the host clock like the stages."""

    device = "cpu"

    def __init__(self, model, plan: list[StagePlan], n_ctx: int | None = None, max_t: int | None = None):
        from .reference import ReferenceEngine

        super().__init__([ReferenceEngine(model, n_ctx=n_ctx, max_t=max_t, layers=p.layers) for p in plan], plan)

    def run(self, tokens, pos0: int | None = None) -> WindowResult:
        tokens = self._check(tokens, pos0)
        stage_ms, hand_ms, nonfinite = [], [], None
        h = None
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # reported by the stages' _watch
            for i, s in enumerate(self.stages):
                t0 = time.perf_counter()
                h = s.stage_run(tokens, h)
                stage_ms.append((time.perf_counter() - t0) * 1e3)
                nonfinite = nonfinite or s._nonfinite
                if i + 1 < len(self.stages):
                    t0 = time.perf_counter()
                    h = h.copy()
                    hand_ms.append((time.perf_counter() - t0) * 1e3)
        self._record_times(len(tokens), stage_ms, hand_ms)
        h.nonfinite = nonfinite
        return h

    def commit(self, n_keep: int) -> None:
        for s in self.stages:
            s.commit(n_keep)

    def sample(self, result: WindowResult, temperature: float, seed: int) -> np.ndarray:
        return self.stages[-1].sample(result, temperature, seed)

    def window_timer(self, eager: bool = False) -> WindowTimer:
        return self.stages[-1].window_timer(eager)


def check_split_rows(n_keep: int, T: int | None) -> None:
    """commit's check, shared by the split engines (None: no window run)."""
    from ..errors import InputError

    if T is None:
        raise InputError("commit without a window to commit (run a window first)")
    check_n_keep(n_keep, T)
