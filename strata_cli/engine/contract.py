"""The verify-engine contract that ReferenceEngine (numpy) and GPUEngine (CuPy) both implement, and that commands
call: they ask `capabilities`, never probe for attributes.

A window: run(tokens, pos0) feeds T tokens at positions n_past..n_past+T-1 and returns a WindowResult (T rows of
logits and greedy ids); commit(n_keep) advances the sequence to exactly the first n_keep of those rows. A second
run() without a commit drops the first window. An engine may return from commit() before its device has run it
(GPUEngine's asynchronous commit): n_past advances at once, and every later call (run, reset, sample, close, the
timers) sees the committed state, whatever the device has still to do. sample() draws ids from the last window's
logits (temperature, Philox keyed by absolute position: ops/sampling.py); window_timer() times run + commit for
benchmarks (on the device clock where the engine has one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..model.geometry import Geometry


@dataclass
class WindowResult:
    pos0: int
    tokens: np.ndarray       # [T] fed tokens
    logits: np.ndarray       # [T, V] float32: row t = distribution after tokens[t] (None when not read back)
    ids: np.ndarray          # [T] greedy ids (argmax of each row)
    nonfinite: str | None = None  # the first layer/stage whose output held NaN/Inf, when the engine checks


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond the contract's common part."""

    graphs: bool  # windows replay captured CUDA graphs; capture_ms holds each window size's capture time
    eager: bool   # run/commit/window_timer take eager=True: kernels launched one by one, no graph


# timer(engine, tokens, pos, n_keep) -> (ms of run + commit, host ms): one timed window, committed
WindowTimer = Callable[[object, np.ndarray, int, int], tuple[float, float]]


@runtime_checkable
class Engine(Protocol):
    device: str                     # "cpu" or "gpu"
    capabilities: Capabilities
    g: Geometry
    n_ctx: int                      # context cells allocated
    max_t: int | None               # largest window (None: any)
    capture_ms: Mapping[int, float]  # window size -> graph capture ms (empty without graphs)
    tiers: object | None            # the expert tiers in use (engine/gpu/tiers.py), None: every expert in memory
    tier_note: str | None           # one line on why tiers are on or off, when the engine had to choose

    @property
    def n_past(self) -> int: ...

    def reset(self) -> None: ...

    def run(self, tokens, pos0: int | None = None) -> WindowResult: ...

    def commit(self, n_keep: int) -> None: ...

    def sample(self, result: WindowResult, temperature: float, seed: int) -> np.ndarray: ...

    def window_timer(self, eager: bool = False) -> WindowTimer: ...

    def close(self) -> None: ...  # release threads, pinned and device memory now (idempotent); also `with engine:`


def window_nonfinite(result) -> str | None:
    """Where a window first went non-finite: the engine's own finding (the reference engine checks every layer
    and stage), else "the logits" when only the logits show it (the GPU engine's host copy); None if finite."""
    if result.nonfinite:
        return result.nonfinite
    if result.logits is not None and not np.isfinite(result.logits).all():
        return "the logits"
    return None
