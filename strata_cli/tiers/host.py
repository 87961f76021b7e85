"""The host side of the expert tiers: per step (layer, token group) of a launched window,
wait for the ring, plan the step, start the PCIe share's copies, compute the CPU share, raise the flags.

A window with the native plan and pool (and, with a PCIe share, the page-locked store, once the window is a graph's)
is served by one C loop, tiers/serve_loop.py (kernels/expert_pool_serve.h): the same steps, copies, flags and stats,
with this module's checks between its ring-wait slices; _step below is its reference and serves the rest (the
eager warm-up window of a PCIe share, the numpy pool).

Step k (ring k+1) covers the rows of one token group of one layer of the engine's layers (all, or a stage's [lo, hi):
tiers/doorbell.StepRange numbers them). The plan and its slot words: tiers/step_plan.py.
VRAM groups are not in the plan: the device groups them from its residency table right after the ring.
The PCIe share is the last floor(n_miss * pcie_frac) distinct misses in routing order; the copy stream
writes flagB = ring after their copies (cuStreamWriteValue32), so flagB never runs ahead of a copy. The copies come
straight from the experts' page-locked store (engine/gpu/expert_store.py): the DMAs overlap the pool, and no host
core copies an expert (tiers/share.py models exactly that). The native loop issues them from the pool's thread 0;
_step hands them to one copy thread (in step order) while this thread runs the pool (the pool's team then leaves
that thread a core, ExpertSource.leave_core). An adaptive --expert-policy's batch of slot fills
(tiers/cache_policy.SlotFiller) is gathered on the same team after the window's last step, while the GPU runs the
window's tail, and its DMAs issued on their own stream; begin() only updates the table (issue 20: the fills' copy
before the launch cost ~110 ms a window).

An eager window (the engine's warm-up) is launched by a second thread while this one serves it, and the launcher
may sit in a driver call that waits for the GPU (a module load, a launch into a full queue: the GPU is stopped at
layer l's wait while the launcher is tens of layers ahead). If the GPU then waits for flagB, whose copies still need
driver calls on the copy thread, those calls queue behind the launcher's: nothing moves until the spin's 20 s bound
(#17: "copies were not issued within 20 s" at layer 0 in the warm-up, and 20 s per layer at full size). So the
launcher passes a gate before each step's flagB wait (wait_issued): it launches the wait only once the copy thread
has issued that step's copies, and then nothing the GPU waits for needs a driver call that has not returned.

Release: every flag to 0xFFFFFFFF (each GPU wait passes), then wait, bounded, until the streams are
idle; the engine refuses every later window. Any exception while a window is served releases it: host errors,
Ctrl-C, and SIGTERM / SIGHUP, which the CLI turns into KeyboardInterrupt (sysio/signals.signal_handlers), so no spin
kernel outlives the process.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import StrataError
from ..gpu.runtime import check, cudart
from .doorbell import ERR, FLAG, FLAG_A, FLAG_B, RELEASED, SEQ
from .step_plan import StepPlan, StepPlanner
from .stats import WindowHistory

POLL_S = 0.002  # how often a waiting host asks the driver whether the stream failed or finished
LAUNCH_NOTE_S = 10.0  # a ring awaited this long while an eager window is still launched: one line on stderr


class EngineReleased(StrataError):
    """A window never finished and its GPU waits were released: this engine runs no more windows (#267)."""


class ExpertSource:
    """The CPU share on the threaded pool of strata_cli/tiers (pool.py: compiled kernels over the memory-mapped
    GGUF blocks, the GIL released; float32 on the exactly dequantized weights), written straight into the
    group's rows of mapped `ymiss`."""

    def __init__(self, model, max_entries: int = 0):
        from .pool import ExpertPool

        self.pool = ExpertPool(model)
        # the pool's gate/up scratch at its largest (every entry of a window), its pages written now: no window
        # pays their first-touch faults
        self.pool.reserve(max_entries)

    def leave_core(self, leave: bool = True) -> None:
        """A PCIe share's copy thread issues each step's DMAs while the pool computes: the team leaves it a core (a
        17th busy thread on 16 cores stalls the team's barriers: bench/pinned_probe.py measured the pool beside a
        spinning copy thread at 0.7 GB/s against 38 alone). leave False: every core again (the share dropped)."""
        from .pool import default_threads

        cores = default_threads()
        self.pool.set_threads(cores - 1 if leave and cores > 1 else cores)

    def compute_into(self, layer: int, x: np.ndarray, plan: StepPlan, out: np.ndarray) -> None:
        """x [n, D] the group's rows, out [n*K, D] the group's ymiss rows: out[j] for every CPU entry j."""
        self.pool.compute_step(layer, x, plan.cpu, out)


class TierHost:
    """Serves the steps of the windows of one engine (the main thread, between launch and sync). Registered with
    strata_cli/tiers/watchdog.py as a live verifier (busy, last_progress, released, describe_stall, release), so
    its Watchdog and signal release cover the GPU engine too."""

    def __init__(self, tiers, engine, stall: int = 0):
        self.t, self.e = tiers, engine
        self.src = ExpertSource(tiers.model, getattr(tiers, "JM", 0))
        # each step's plan in C on the pool's library (tiers/step_plan.py), numpy's reference without it
        self.planner = StepPlanner(self.src.pool.lib, tiers.model.geometry.n_expert, getattr(tiers, "JM", 0))
        from .serve_loop import NativeServe

        if getattr(tiers, "pcie", False) and not NativeServe.usable(self):
            self.src.leave_core()  # the copy thread issues the copies of every window: the team leaves it a core
        self.stall = stall
        self.warmed = False        # after_warm_up ran: windows count from here, and only they may stall
        self.windows = 0
        self.released: str | None = None
        self.step_layer = -1       # the layer of the step in progress (for the stall line)
        self.progress = time.monotonic()
        self.active = False
        self.stats: dict = {}
        self._lock = threading.Lock()
        self.launching = False
        self.history = WindowHistory()  # window_stats() of the windows served (the last few thousand of each T)
        self.route_hook = None  # (layer, ids [n, K]) of every step served (engine/routing.py counts them)
        self._tuner = None      # --pcie-frac auto's share between windows (tiers/share.ShareTuner), made on first use
        self.frac = 0.0         # the share of the window being served (begin)
        # The Python steps' PCIe copies run on one copy thread (in step order) while this thread runs the pool
        self._copier = None
        self._loop = None  # the native loop (tiers/serve_loop.py), made on first use
        self._events: list = []        # per step (start, end) cudaEvents around its DMAs
        self._timed_copies: list = []  # the pairs recorded in this window
        # the eager launcher's gate (wait_issued): the ring of the last step whose copies were issued this window
        self._issued = 0
        self._failing = False          # the window is failing: the gate opens (the launcher finishes, waits pass)
        self._issued_cv = threading.Condition()
        self._copy_phase = ("idle", time.monotonic())  # what the copy thread is doing, since when (the timeout line)
        if getattr(tiers, "pcie", False):
            self._copier = self._make_copier()
        from .watchdog import register

        register(self)

    @staticmethod
    def _make_copier():
        """One worker thread, the engine's device current on it (its driver calls need the context)."""
        from concurrent.futures import ThreadPoolExecutor

        device = check(cudart().cudaGetDevice(), "cudaGetDevice")
        return ThreadPoolExecutor(1, thread_name_prefix="strata-pcie-copy",
                                  initializer=lambda: check(cudart().cudaSetDevice(device), "cudaSetDevice"))

    def drop_copier(self) -> None:
        """Stop the copy thread (idempotent): the engine's close(), or no PCIe share after all
        (engine/gpu/tiers.rebalance_share)."""
        if self._copier is not None:
            self._copier.shutdown(wait=True)
            self._copier = None
            self.src.leave_core(False)

    def close(self) -> None:
        """Stop the copy thread, destroy the copy events, leave the watchdog's list (the engine's close())."""
        from .watchdog import unregister

        self.drop_copier()
        rt = cudart() if self._events else None  # no events without a PCIe share: no driver call then
        while self._events:
            for event in self._events.pop():
                check(rt.cudaEventDestroy(event), "cudaEventDestroy")
        unregister(self)

    # ---- the watchdog's view (tiers/watchdog.py)
    @property
    def busy(self) -> bool:
        """Serving a launched window. Not while an eager window's launcher thread still launches (it compiles and
        loads kernels, which may take longer than the watchdog's bound; every GPU wait is bounded meanwhile) and
        not before the window is launched (a graph being captured)."""
        return self.active and not self.launching

    @property
    def last_progress(self) -> float:
        return self.progress

    def describe_stall(self) -> str:
        return f"window {self.windows} stalled at layer {max(self.step_layer, 0)}"

    def after_warm_up(self) -> None:
        """The engine's warm-up window is not one of the user's (STRATA_TEST_VERIFY_STALL counts those)."""
        self.windows = 0
        self.warmed = True
        self.history.clear()
        self._tuner = None  # the eager warm-up's pool and copy times are not a graph window's
        if self.t.fill is not None:
            self.t.fill.reset()

    # ---- one window
    def begin(self, T: int) -> None:
        if self.released is not None:
            raise EngineReleased(self.released)
        t = self.t
        # an adaptive cache: the last batch's admissions enter the table (its copies done), the next batch is
        # planned, its evictions leave the table; nothing is copied here, before the launch: serve() copies it after
        # the window's last step (before the window counts as served: a failure here leaves the host idle)
        filled = t.fill.boundary() if t.fill is not None else {}
        t.words.host[:] = 0
        t.wait_ns.host[:] = 0
        self.windows += 1
        self.T = T
        self.step_layer = -1  # the stall line names this window's layer, not the last one served
        tuner = self.share_tuner()
        self.frac = tuner.frac(T) if tuner is not None else float(t.cfg.pcie_frac)
        self.active = True
        self.progress = time.monotonic()
        self.stats = {"T": T, "vram": 0, "pcie": 0, "cpu": 0, "plan_ms": 0.0, "pool_ms": 0.0, "pool_kernel_ms": 0.0,
                      "pool_wake_ms": 0.0, "host_wait_ms": 0.0, "pcie_bytes": 0, "cpu_bytes": 0, "issue_ms": 0.0,
                      "copy_ms": 0.0, "pcie_frac": self.frac, **filled}
        self._timed_copies.clear()
        with self._issued_cv:
            self._issued, self._failing = 0, False

    def launched(self, T: int, launch) -> None:
        """begin(T), launch() (the window's graph launch, or the start of the eager launcher), serve(T). A launch
        that raises an error put no window on the GPU: the host is idle again (never busy for the watchdog) and not
        released. A signal's exception (Ctrl-C, and SIGTERM / SIGHUP as KeyboardInterrupt) is raised by Python after
        the C call that was running returned: the graph launch may have put the window on the GPU, or it came
        between the launch and serve()'s own handler, so it releases the window as serve() does (no spin kernel
        waits for a host that has gone)."""
        self.begin(T)
        try:
            launch()
            self.serve(T)
        except Exception:
            self.active = False  # a failed launch; a failed serve() released what it served
            raise
        except BaseException as exc:
            if self.released is None:
                self._fail(exc)
            self.active = False
            raise

    def launch_done(self) -> None:
        """The eager launcher thread finished: the watchdog's clock restarts from now (busy again)."""
        self.progress = time.monotonic()
        self.launching = False

    def serve(self, T: int) -> None:
        """All steps of the launched T-row window; then wait (bounded) for the stream. Releases on any error."""
        try:
            groups = self.t.groups(T)
            G = len(groups)
            # an eager window's launcher waits at the copy thread's gate (wait_issued): its PCIe share is the Python
            # steps'; a graph window's the loop's
            loop = None if self.launching and self.t.pcie else self._native_loop()
            if loop is not None:
                self._serve_native(loop, T)
            else:
                for k in range(self.t.steps.count(G)):
                    layer, grp = self.t.steps.at(k, G)
                    self._step(k, layer, grp, *groups[grp], G)
            if self.t.fill is not None:  # the host's work is done, the GPU ends the window: the boundary's batch
                self.stats.update(self.t.fill.copy())  # gathered on the pool's team (this thread), its DMAs issued
            self._await_idle()
            self._check_err(G)
            self.stats["copy_ms"] = self._copy_ms()
            self.history.append(self.window_stats())
            if self._tuner is not None:
                self._tuner.observe(T, self.stats)
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self.active = False

    def share_tuner(self):
        """--pcie-frac auto with a PCIe share: the ShareTuner that moves each window size's share between windows
        (tiers/share.py), made from the share and rates the engine was built with; None for a given share."""
        t = self.t
        cfg = t.cfg
        if not getattr(t, "pcie", False) or not cfg.share_auto:  # share_auto: resolved_config kept auto's rates
            return None
        if self._tuner is None or self._tuner.seed_rates is not cfg.rates:  # rebalance_share replaced them
            from .share import ShareTuner

            self._tuner = ShareTuner(float(cfg.pcie_frac), cfg.rates)
        return self._tuner

    def _fail(self, exc: BaseException) -> None:
        """A window that may be on the GPU fails (an error, or a signal's exception): every wait released."""
        self._open_gate()     # an eager launcher at the gate finishes its launches (they pass on the release)
        self._drain_copies()  # no copy job may write flagB after the release below
        if self.released is None:
            self.release(5000, reason=str(exc) if isinstance(exc, StrataError) else
                         f"{type(exc).__name__}: {exc}".rstrip(": "))

    def _native_loop(self):
        """The native loop (tiers/serve_loop.py) where it serves this engine's windows (the native plan and pool,
        a PCIe share's store), made on first use and again when the share was dropped; else None (each step in
        Python, _step)."""
        from .serve_loop import NativeServe

        if not NativeServe.usable(self):
            return None
        if self._loop is None or self._loop.pcie != bool(self.t.pcie):
            self._loop = NativeServe(self)
        return self._loop

    def _withholds_last(self) -> bool:
        """This window's last flag is withheld (the stall test: --stall-window; the warm-up never stalls)."""
        return bool(self.stall and self.warmed and self.windows == self.stall)

    def _serve_native(self, loop, T: int) -> None:
        """Every step of the window in the native loop, between its calls the checks of _await_ring; then the
        step stats, and the route hook and an adaptive cache's observe() replayed from the loop's picks."""
        from . import serve_loop

        t = self.t
        n = t.steps.count(1)
        loop.window(T, self._withholds_last(), self.frac)
        k, slice_ns = 0, int(POLL_S * 1e9)
        start = said = time.monotonic()
        self.step_layer = t.steps.lo
        with self.src.pool._lock:
            while k < n:
                got = loop.run(k, slice_ns)
                if got < 0:
                    self._native_failed(got, t.steps.lo + int(loop.stats[serve_loop.STATS.index("step")]))
                if got > k:
                    k = got
                    self.progress = start = time.monotonic()
                if k < n:
                    self.step_layer = t.steps.lo + k
                    said = self._not_rung(k + 1, self.step_layer, start, said)
        self.step_layer = t.steps.lo + n - 1
        got = loop.totals()
        s = self.stats
        s["vram"] += got["vram"]
        s["pcie"] += got["pcie"]
        s["cpu"] += got["cpu"]
        s["pcie_bytes"] += got["pcie_bytes"]
        s["cpu_bytes"] += got["cpu_bytes"]
        s["issue_ms"] += got["issue_ns"] / 1e6  # the PCIe share's driver calls (no expert is copied on the host)
        s["host_wait_ms"] += got["wait_ns"] / 1e6
        s["plan_ms"] += got["plan_ns"] / 1e6
        s["pool_ms"] += got["pool_ns"] / 1e6
        s["pool_kernel_ms"] += got["kernel_ns"] / 1e6
        s["pool_wake_ms"] += got["wake_ns"] / 1e6
        pool = self.src.pool
        pool.kernel_ns += got["kernel_ns"]
        pool.wake_ns += got["wake_ns"]
        self._timed_copies.extend(self._events[k] for k in loop.copied_steps())
        if self.route_hook is not None or t.fill is not None:
            for step in range(n):
                layer, ids = t.steps.lo + step, loop.picks(step, T, t.K)
                if self.route_hook is not None:
                    self.route_hook(layer, ids.copy())
                if t.fill is not None:
                    t.fill.observe(layer, ids)

    def _native_failed(self, code: int, layer: int) -> None:
        """A code below 0 of the native loop, raised as the Python steps raise it."""
        from . import serve_loop

        if code == serve_loop.RELEASED or self.released is not None:
            raise EngineReleased(self.released or "released while the window was served")
        if code == serve_loop.BAD_ID:
            raise ValueError(f"layer {layer}: a routed expert id outside 0..{self.t.E - 1}")
        if code == serve_loop.PLAN_SIZE:
            raise ValueError(f"layer {layer}: the plan does not fit {self.t.JM} entries")
        if code == serve_loop.POOL_FAILED:
            raise RuntimeError(f"expert pool kernel failed on layer {layer}")
        if code == serve_loop.COPY_FAILED:
            rc = int(self._loop.stats[serve_loop.STATS.index("copy_rc")])
            raise StrataError(f"layer {layer}: a driver call of the PCIe share's copies failed (CUresult {rc})")
        if code == serve_loop.UNSTORED:
            raise ValueError(f"layer {layer}: a PCIe expert is not in the page-locked store (only non-resident "
                             "experts are)")
        raise RuntimeError(f"the native tier loop refused the window (code {code})")

    def _step(self, k: int, layer: int, grp: int, r0: int, n: int, G: int) -> None:
        t = self.t
        want = k + 1
        self.step_layer = layer
        t0 = time.perf_counter()
        self._await_ring(want, layer)
        t1 = time.perf_counter()
        K = t.K
        ids = t.pub_ids.host[r0:r0 + n].copy()
        if self.route_hook is not None:
            self.route_hook(layer, ids)
        if t.fill is not None:
            t.fill.observe(layer, ids)
        plan = self.planner.plan(ids, t.table_host[layer], self.frac, t.plan.host[grp], r0 * K)
        self._raise_flag(FLAG_A, want)
        copying = None
        t_plan = time.perf_counter()
        if t.pcie:  # the pool computes while the copy thread issues the copies from the page-locked store
            copying = self._copier.submit(self._issue_copies, layer, grp, plan.pcie.experts.copy(), want)
        else:
            self._raise_flag(FLAG_B, want)
        t_pool = time.perf_counter()
        pool = self.src.pool
        kernel0, wake0 = pool.kernel_ns, pool.wake_ns
        if plan.cpu.n_groups:
            self.src.compute_into(layer, t.pub_x.host[r0:r0 + n], plan, t.ymiss.host[r0 * K:(r0 + n) * K])
        t2 = time.perf_counter()
        if copying is not None:
            self._copied(copying, layer)
        last = k == t.steps.count(G) - 1
        if not (last and self._withholds_last()):
            self._raise_flag(FLAG, want)
        s = self.stats
        n_vram, n_pcie, n_cpu = self.planner.counts
        s["vram"] += n_vram
        s["pcie"] += n_pcie
        s["cpu"] += n_cpu
        s["plan_ms"] += (t_plan - t1) * 1e3  # routing ids to the plan, its words, flagA
        s["issue_ms"] += (t_pool - t_plan) * 1e3  # the copy job handed to the copy thread
        s["pool_ms"] += (t2 - t_pool) * 1e3  # the CPU pool's call, Python and kernel
        s["pool_kernel_ms"] += (pool.kernel_ns - kernel0) / 1e6
        s["pool_wake_ms"] += (pool.wake_ns - wake0) / 1e6
        s["host_wait_ms"] += (t1 - t0) * 1e3
        eb = sum(t.expert_bytes[layer])
        s["pcie_bytes"] += eb * plan.pcie.n_groups
        s["cpu_bytes"] += eb * plan.cpu.n_groups
        self.progress = time.monotonic()

    def _issue_copies(self, layer: int, grp: int, experts: np.ndarray, want: int) -> None:
        """The copy thread's job of one step: its copies issued, then the eager launcher's gate opened up to it."""
        try:
            self._copy_pcie(layer, grp, experts, want)
        finally:
            self._copy_phase = ("idle", time.monotonic())
        with self._issued_cv:
            self._issued = max(self._issued, want)
            self._issued_cv.notify_all()

    def wait_issued(self, ring: int) -> None:
        """The eager launcher, before it launches the flagB wait of step `ring`: wait until the copy thread issued
        that step's copies (the module docstring says why). Returns at once when the window fails or is released;
        bounded like every wait."""
        bound = self.t.cfg.timeout_s
        deadline = time.monotonic() + bound
        with self._issued_cv:
            while self._issued < ring and not self._failing and self.released is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StrataError(f"layer {max(self.step_layer, 0)}: the eager launcher waited {bound:g} s for "
                                      f"step {ring}'s PCIe copies to be issued ({self._copy_doing()})")
                self._issued_cv.wait(min(left, 0.1))

    def _open_gate(self) -> None:
        with self._issued_cv:
            self._failing = True
            self._issued_cv.notify_all()

    def _phase(self, text: str) -> None:
        self._copy_phase = (text, time.monotonic())

    def _copy_doing(self) -> str:
        """What the copy thread is doing and for how long (the line of a copy or gate timeout)."""
        text, since = self._copy_phase
        return f"the copy thread: {text} for {time.monotonic() - since:.1f} s"

    def _copy_pcie(self, layer: int, grp: int, experts: np.ndarray, want: int) -> None:
        """The step's PCIe experts DMA'd from the page-locked store into group grp's device staging slots (copy
        engine, ExpertTiers.issue_copies: one copy an expert and projection), then flagB = want on the copy stream
        (after the copies land). The DMAs sit between two events (copy GB/s)."""
        from ..gpu.launch_tiers import write_word

        t, rt = self.t, cudart()
        stream = t.copy_stream
        start, end = self._copy_events(t.steps.ring(layer, grp, t.G) - 1)
        self._phase(f"cudaEventRecord before layer {layer}'s copies")
        check(rt.cudaEventRecord(start, stream.ptr), "cudaEventRecord")
        t.issue_copies(layer, grp, experts, self._phase)
        self._phase(f"cudaEventRecord after layer {layer}'s copies")
        check(rt.cudaEventRecord(end, stream.ptr), "cudaEventRecord")
        self._timed_copies.append((start, end))
        self._phase(f"cuStreamWriteValue32 of flagB = {want} (layer {layer})")
        write_word(t.words.device[FLAG_B:FLAG_B + 1], want, stream)

    def _copy_events(self, step: int):
        """The (start, end) event pair of one step's DMAs, made on first use and reused by every window."""
        while len(self._events) <= step:
            rt = cudart()
            self._events.append((check(rt.cudaEventCreate(), "cudaEventCreate"),
                                 check(rt.cudaEventCreate(), "cudaEventCreate")))
        return self._events[step]

    def _copy_ms(self) -> float:
        """The DMA time of the window's PCIe share (the streams are idle: every event has completed). No copies: 0
        without a driver call (a host without cuda-bindings serves numpy-backed windows: test_tier_engine_host.py)."""
        if not self._timed_copies:
            return 0.0
        rt = cudart()
        total = sum(check(rt.cudaEventElapsedTime(a, b), "cudaEventElapsedTime") for a, b in self._timed_copies)
        self._timed_copies.clear()
        return float(total)

    def _drain_copies(self) -> None:
        """Wait (bounded) until the copy thread has issued every queued step; its errors are the step's to raise."""
        if self._copier is not None:
            try:
                self._copier.submit(lambda: None).result(timeout=5.0)
            except Exception:  # noqa: BLE001 - the window is failing already; the release below still runs
                pass

    def _copied(self, copying, layer: int) -> None:
        """The copy thread issued the step's copies (raises what it raised); bounded like every wait."""
        from concurrent.futures import TimeoutError as FutureTimeout

        try:
            copying.result(timeout=self.t.cfg.timeout_s)
        except FutureTimeout:
            raise StrataError(f"layer {layer}: the PCIe share's copies were not issued within "
                              f"{self.t.cfg.timeout_s:g} s ({self._copy_doing()}"
                              f"{'; an eager window still launching' if self.launching else ''})") from None

    def _await_ring(self, want: int, layer: int) -> None:
        """seq >= want. The wait itself is tiers/doorbell.wait_word (a pause-spin in C with the GIL released, so an
        eager launching thread and the watchdog run); every POLL_S: released? stream finished without ringing?"""
        from .doorbell import wait_word

        seq = self.t.words.host[SEQ:SEQ + 1]
        start = said = time.monotonic()
        while wait_word(seq, want, POLL_S) < want:
            said = self._not_rung(want, layer, start, said)

    def _not_rung(self, want: int, layer: int, start: float, said: float) -> float:
        """A wait slice for ring `want` (layer's) passed without it, waiting since `start`: released? the stream
        finished without ringing? past the bound? (an eager window's launch is unbounded, so it says what it waits
        for every LAUNCH_NOTE_S: `said` is when it last did; returned, updated)."""
        seq = self.t.words.host[SEQ:SEQ + 1]
        if self.released is not None:
            raise EngineReleased(self.released)
        if not self.launching and self._stream_idle() and seq[0] < want:
            raise StrataError(f"layer {layer} never rang (the window's stream ended first"
                              f"{self._err_text()})")
        now = time.monotonic()
        if not self.launching and now - start > self.t.cfg.timeout_s:  # eager launches compile
            raise StrataError(f"layer {layer} never rang within {self.t.cfg.timeout_s:g} s")
        if self.launching and now - said >= LAUNCH_NOTE_S:  # unbounded (a cold kernel cache compiles for
            said = now                                       # minutes), so it says what it waits for
            from ..report.present import err_console

            copier = f"; {self._copy_doing()}" if self._copier is not None else ""
            err_console().print(f"tiers: waiting {now - start:.0f} s for layer {layer}'s ring: the eager window "
                                f"is still being launched (kernels compiling or loading{copier})",
                                style="dim", highlight=False, soft_wrap=True)
        return said

    def _await_idle(self) -> None:
        """Wait for the window's stream; a withheld flag ends only through a GPU wait's bound or a release."""
        while self.launching or not self._stream_idle():
            time.sleep(0 if not self.stall else 0.001)
            if self.released is not None:
                raise EngineReleased(self.released)

    def _stream_idle(self) -> bool:
        return self._idle(self.e.stream, strict=True)

    @staticmethod
    def _idle(stream, strict: bool = False) -> bool:
        """Has the stream run out of work? strict: a failed stream raises (its error, in one line)."""
        rt = cudart()
        ret = rt.cudaStreamQuery(stream.ptr)[0]
        if ret == rt.cudaError_t.cudaErrorNotReady:
            return False
        if strict:
            check((ret,), "the window's stream")
        return True

    def _err_text(self) -> str:
        code = int(self.t.words.host[ERR])
        if not code:
            return ""
        step, kind = divmod(code - 1, 2)
        return f"; the GPU gave up waiting for {'flagB' if kind == 0 else 'flag'} of step {step}"

    def _check_err(self, G: int) -> None:
        code = int(self.t.words.host[ERR])
        if code:
            step, kind = divmod(code - 1, 2)
            layer, _ = self.t.steps.at(step, G)
            word = "flagB (the PCIe share)" if kind == 0 else "flag (the CPU share)"
            raise StrataError(f"window {self.windows} stalled at layer {layer}: the GPU waited "
                              f"{self.t.cfg.timeout_s:g} s for {word} and gave up")

    # ---- release
    def release(self, timeout_ms: float = 5000, reason: str = "released") -> float | None:
        """Refuse every later window, every flag to 0xFFFFFFFF (each GPU wait passes), then poll the streams until
        idle. Returns the ms until idle, None when they were still busy after timeout_ms."""
        t = self.t
        with self._lock:  # after this block no host flag write can lower a flag again (_raise_flag)
            if self.released is None:
                self.released = (f"an earlier window never finished on the GPU (#267): {self.describe_stall()}; "
                                 f"{reason}")
            self._store_released()
        self._open_gate()
        t0 = time.monotonic()
        streams = [self.e.stream] + ([t.copy_stream] if t.copy_stream is not None else [])
        while True:
            busy = [s for s in streams if not self._idle(s)]
            elapsed = (time.monotonic() - t0) * 1e3
            if not busy:
                return elapsed
            if elapsed >= timeout_ms:
                return None
            self._store_released()  # again: a copy-stream flagB write queued before the release may land late
            time.sleep(0.0002)

    def _store_released(self) -> None:
        for word in (FLAG_A, FLAG_B, FLAG):
            self.t.words.host[word] = RELEASED

    def _raise_flag(self, word: int, value: int) -> None:
        """A host flag write; refused once released (it would lower a released flag under a waiting GPU)."""
        with self._lock:
            if self.released is not None:
                raise EngineReleased(self.released)
            self.t.words.host[word] = value

    def window_stats(self) -> dict:
        """The last window's shares of routed entries, host times and GPU wait times (spin waits only)."""
        s = dict(self.stats)
        total = max(s["vram"] + s["pcie"] + s["cpu"], 1)
        waits = self.t.wait_ns.host.astype(np.float64) / 1e6
        s.update(vram_share=s["vram"] / total, pcie_share=s["pcie"] / total, cpu_share=s["cpu"] / total,
                 wait_b_ms=float(waits[:, 0].sum()), wait_flag_ms=float(waits[:, 1].sum()))
        return s
