"""Host side of the doorbell protocol: one server thread per engine answers the GPU's rings.

Words (uint32, mapped pinned memory on the GPU, plain numpy in tests; the host zeroes them when it stages a window):
    seq    GPU: "I reached the ring of step k" (k+1), after copying the step's x / ids / w rows to the host
    flagA  host: "step k's plan is in its plan block"
    flagB  host (or the copy stream's host function): "step k's PCIe copies have landed" (only rises)
    flag   host: "step k's CPU rows are in ymiss"

Per step k (layer l, group g, want = k+1): wait seq >= want (bounded: spin slices of 2 ms in C without the GIL,
between them ask `stream_done` whether the GPU stream ended without ringing, give up after `step_timeout_s`),
plan the layer (tiers/plan.py) into plan slot g, raise flagA, hand the PCIe share to `copy_pcie` (which raises flagB
when the copies land; no share: flagB now), compute the CPU share with the pool into ymiss, raise flag. With
STRATA_TEST_VERIFY_STALL=N the last step's flag of window N is withheld.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError, StrataError
from . import native
from .plan import LayerPlan, PlanLayout, build_plan, write_plan

RELEASED = 0xFFFFFFFF
STALL_ENV = "STRATA_TEST_VERIFY_STALL"
SLICE_S = 0.002  # the spin slice: between slices the server looks at the stream and the release flag


class VerifierReleased(StrataError):
    """An engine whose GPU waits were released refuses every later window."""


class DoorbellError(StrataError):
    """A window's doorbell protocol failed (the GPU never rang, a timeout, a pool error)."""


def stall_window(env=os.environ) -> int:
    """STRATA_TEST_VERIFY_STALL: the 1-based window whose last flag the host withholds; 0 = never."""
    text = env.get(STALL_ENV, "").strip()
    if text in ("", "0"):
        return 0
    if not text.isdigit():
        raise InputError(f"{STALL_ENV}={text!r}: expected a window number (1-based) or 0")
    return int(text)


# ---- one 32-bit word: C (no GIL) when the host kernels are built, numpy otherwise
def _addr(word: np.ndarray) -> int:
    return word.ctypes.data


def load_word(word: np.ndarray) -> int:
    return int(word[0])


def store_word(word: np.ndarray, value: int) -> None:
    lib = native.load()
    if lib is not None:
        lib.strata_store(_addr(word), value & RELEASED)
    else:
        word[0] = value & RELEASED


def raise_word(word: np.ndarray, value: int) -> None:
    """word = max(word, value), atomically (flagB is raised from the copy stream's thread too)."""
    lib = native.load()
    if lib is not None:
        lib.strata_raise(_addr(word), value & RELEASED)
    else:
        word[0] = max(int(word[0]), value & RELEASED)


def wait_word(word: np.ndarray, want: int, max_s: float) -> int:
    """Spin until word >= want or max_s passed; returns the last value seen."""
    lib = native.load()
    if lib is not None:
        return int(lib.strata_wait_geq(_addr(word), want, int(max_s * 1e9)))
    deadline = time.perf_counter() + max_s
    while True:
        value = int(word[0])
        if value >= want or time.perf_counter() >= deadline:
            return value
        time.sleep(20e-6)


@dataclass
class DoorbellStaging:
    """Numpy views of the window's mapped staging: x [max_t, H] f32, ids [max_t, k] i32,
    ymiss [max_t·k, H] f32, plans [G, layout.words] i32 (one block per group slot), the four words (shape (1,))."""

    x: np.ndarray
    ids: np.ndarray
    ymiss: np.ndarray
    plans: np.ndarray
    seq: np.ndarray
    flag_a: np.ndarray
    flag_b: np.ndarray
    flag: np.ndarray

    @classmethod
    def allocate(cls, max_t: int, k: int, n_embd: int, layout: PlanLayout, groups: int = 2) -> "DoorbellStaging":
        """Plain host arrays (tests, or a GPU side that copies them to its mapped memory)."""
        words = np.zeros(4, dtype=np.uint32)
        return cls(x=np.zeros((max_t, n_embd), np.float32), ids=np.zeros((max_t, k), np.int32),
                   ymiss=np.zeros((max_t * k, n_embd), np.float32), plans=np.zeros((groups, layout.words), np.int32),
                   seq=words[0:1], flag_a=words[1:2], flag_b=words[2:3], flag=words[3:4])

    def flags(self):
        return (self.flag_a, self.flag_b, self.flag)

    def reset_words(self) -> None:
        for word in (self.seq, *self.flags()):
            store_word(word, 0)


@dataclass(frozen=True)
class Step:
    layer: int
    group: int
    row0: int
    n_rows: int


def window_steps(n_rows: int, layers, split: bool = False) -> list[Step]:
    """The rings of one window in order: per layer, group A then B (ring = index + 1). With split on
    and T >= 2: A = rows [0, ceil(T/2)), B = the rest; otherwise one group of all rows."""
    groups = [(0, n_rows)] if not split or n_rows < 2 else [(0, (n_rows + 1) // 2), ((n_rows + 1) // 2, n_rows // 2)]
    return [Step(int(layer), g, row0, n) for layer in layers for g, (row0, n) in enumerate(groups)]


@dataclass
class WindowTierStats:
    """What one window's misses cost on the host: entries per tier, and where the server's time went."""

    window: int = 0
    steps: int = 0
    vram_entries: int = 0
    pcie_entries: int = 0
    cpu_entries: int = 0
    pcie_experts: int = 0
    cpu_experts: int = 0
    wait_s: float = 0.0   # waiting for the GPU's rings
    plan_s: float = 0.0   # planning and publishing
    pool_s: float = 0.0   # the CPU pool
    stalled: bool = False


@dataclass
class _Job:
    window: int
    steps: list[Step]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    stats: WindowTierStats = field(default_factory=WindowTierStats)


CopyPcie = Callable[[Step, LayerPlan, int, Callable[[], None]], None]


class DoorbellServer:
    """Answers one engine's rings. The engine: begin_window(steps) -> launch the graph -> finish_window() ->
    wait for its stream -> end_window(). A watchdog (tiers/watchdog.py) may release() it at any time."""

    def __init__(self, pool, residency, staging: DoorbellStaging, layout: PlanLayout, *, pcie_frac: float = 0.0,
                 pcie_slots: int | None = None, copy_pcie: CopyPcie | None = None, slot_ptrs=None, staging_ptrs=None,
                 stream_done: Callable[[], bool] | None = None, fence_and_wait: Callable[[int], bool] | None = None,
                 step_timeout_s: float = 20.0, stall: int | None = None, name: str = "verifier"):
        if pcie_frac > 0 and copy_pcie is None:
            raise ValueError("a PCIe share needs a copy_pcie callback")
        self.pool, self.residency, self.staging, self.layout = pool, residency, staging, layout
        self.pcie_frac, self.pcie_slots, self.copy_pcie = float(pcie_frac), pcie_slots, copy_pcie
        self.slot_ptrs, self.staging_ptrs = slot_ptrs, staging_ptrs
        self.stream_done, self.fence_and_wait = stream_done, fence_and_wait
        self.step_timeout_s = float(step_timeout_s)
        self.stall = stall_window() if stall is None else int(stall)
        self.name = name
        self.windows = 0
        self.busy = False
        self.last_progress = time.monotonic()
        self.where = (0, None)          # (window, layer) the host is at / the GPU waits on
        self.released = False
        self.release_reason = ""
        self._jobs: queue.Queue = queue.Queue()
        self._job: _Job | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name=f"strata-doorbell-{name}", daemon=True)
        self._thread.start()
        from .watchdog import register

        register(self)

    # ---- the engine's side
    def begin_window(self, steps: list[Step]) -> int:
        """Zero the words and queue the window's steps; returns the window's 1-based number."""
        if self.released:
            raise VerifierReleased(f"{self.name}: this engine's GPU waits were released ({self.release_reason}); an "
                                   "earlier window never finished on the GPU, so it runs no more windows: start a new "
                                   "engine")
        if self._job is not None and not self._job.done.is_set():
            raise DoorbellError(f"{self.name}: window {self._job.window} is still being served")
        self.windows += 1
        self.staging.reset_words()
        job = _Job(self.windows, list(steps))
        job.stats.window = job.window
        self._job = job
        self.busy = True
        self._progress(job.window, steps[0].layer if steps else None)
        self._jobs.put(job)
        return job.window

    def finish_window(self, timeout_s: float | None = None) -> WindowTierStats:
        """Wait (bounded) until the server answered every step; raise what went wrong."""
        job = self._job
        if job is None:
            raise DoorbellError(f"{self.name}: no window in flight")
        limit = timeout_s if timeout_s is not None else self.step_timeout_s * (len(job.steps) + 1)
        if not job.done.wait(limit):
            self.release(reason=f"window {job.window} not served within {limit:.0f} s")
            job.done.wait(1.0)
            raise DoorbellError(f"{self.name}: window {job.window} was not served within {limit:.0f} s; GPU waits "
                                "released")
        if job.error is not None:
            raise job.error
        return job.stats

    def end_window(self) -> None:
        """The GPU finished the window: the watchdog stops watching this engine."""
        self.busy = False
        self._progress(self.where[0], None)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=1.0)
        from .watchdog import unregister

        unregister(self)

    # ---- the watchdog's side
    def describe_stall(self) -> str:
        window, layer = self.where
        return f"window {window} stalled at layer {layer}" if layer is not None else f"window {window} stalled"

    def release(self, timeout_ms: int = 5000, reason: str = "released") -> float | None:
        """Every GPU wait passes: flags to 0xFFFFFFFF, fence, bounded wait for the streams. Marks the engine
        released (later windows refused). Returns ms until the streams were idle, None when they were not."""
        with self._lock:
            if not self.released:
                self.released, self.release_reason = True, reason
        t0 = time.perf_counter()
        for word in self.staging.flags():
            store_word(word, RELEASED)
        idle = True if self.fence_and_wait is None else bool(self.fence_and_wait(int(timeout_ms)))
        self.busy = False
        return (time.perf_counter() - t0) * 1e3 if idle else None

    # ---- the server thread
    def _progress(self, window: int, layer) -> None:
        self.where = (window, layer)
        self.last_progress = time.monotonic()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._run(job)
            except BaseException as exc:  # noqa: BLE001 - reported to the engine by finish_window
                job.error = exc if isinstance(exc, StrataError) else DoorbellError(
                    f"{self.name}: window {job.window}: {type(exc).__name__}: {exc}")
                if not isinstance(exc, VerifierReleased):
                    self.release(reason=f"window {job.window} failed on the host")
            finally:
                job.done.set()

    def _run(self, job: _Job) -> None:
        st, stats = self.staging, job.stats
        last = len(job.steps) - 1
        for k, step in enumerate(job.steps):
            want = k + 1
            self._progress(job.window, step.layer)
            t0 = time.perf_counter()
            self._wait_ring(job, step, want)
            t1 = time.perf_counter()
            plan = build_plan(step.layer, st.ids[step.row0:step.row0 + step.n_rows], self.residency.row(step.layer),
                              self.pcie_frac, row0=step.row0, pcie_slots=self.pcie_slots)
            write_plan(st.plans[step.group], self.layout, plan, self.slot_ptrs, self.staging_ptrs)
            raise_word(st.flag_a, want)
            if plan.pcie.n_groups:
                self.copy_pcie(step, plan, want, lambda v=want: raise_word(st.flag_b, v))
            else:
                raise_word(st.flag_b, want)
            t2 = time.perf_counter()
            self.pool.compute(step.layer, st.x, plan.cpu, out=st.ymiss)
            t3 = time.perf_counter()
            if self.released:
                raise VerifierReleased(f"{self.name}: released during window {job.window}")
            if self.stall == job.window and k == last:
                stats.stalled = True  # the test hook: the GPU waits on a flag nobody raises
            else:
                raise_word(st.flag, want)
            stats.steps += 1
            stats.vram_entries += plan.vram.n_entries
            stats.pcie_entries += plan.pcie.n_entries
            stats.cpu_entries += plan.cpu.n_entries
            stats.pcie_experts += plan.pcie.n_groups
            stats.cpu_experts += plan.cpu.n_groups
            stats.wait_s += t1 - t0
            stats.plan_s += t2 - t1
            stats.pool_s += t3 - t2
        self._progress(job.window, job.steps[-1].layer if stats.stalled else None)

    def _wait_ring(self, job: _Job, step: Step, want: int) -> None:
        deadline = time.monotonic() + self.step_timeout_s
        while True:
            if wait_word(self.staging.seq, want, SLICE_S) >= want:
                return
            if self.released:
                raise VerifierReleased(f"{self.name}: released while window {job.window} waited for layer "
                                       f"{step.layer}")
            if self.stream_done is not None and self.stream_done():
                if load_word(self.staging.seq) >= want:
                    return
                raise DoorbellError(f"{self.name}: window {job.window}: layer {step.layer} never rang (the GPU "
                                    f"stream ended at ring {load_word(self.staging.seq)} of {len(job.steps)})")
            if time.monotonic() > deadline:
                self.release(reason=f"window {job.window}: layer {step.layer} did not ring")
                raise DoorbellError(f"{self.name}: window {job.window}: layer {step.layer} did not ring within "
                                    f"{self.step_timeout_s:g} s; GPU waits released")
