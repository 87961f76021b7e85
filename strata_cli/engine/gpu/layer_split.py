"""The GPU layer split: one GPUEngine stage per device (engine/layer_split.py has the shared part and the plan),
each over its layer range, with its own weights, arena, stream, graphs (one window graph per T, one commit graph)
and sequence state, and with expert tiers its own expert cache, residency and tier host over its layers (a
tiered stage's launch_window serves its steps and returns once its window finished, so the next stage's wait on
the hand-off event is already met). Two stages may share a device (`--gpus 0,0`): the one-GPU check of the split.

A window, stage by stage (i = 0..S-1), each on its own device's stream:

    wait(hand_end[i-1]) | start[i] | stage i's T graph | end[i] | peer copy R[:T] -> stage i+1's R | hand_end[i]

The hand-off moves the residual stack R [T, C, D] float32 only: the last layer's pending HC write is applied
before it (window.py), tokens and positions are staged by the host into every stage's mapped buffers. The copy is
cudaMemcpyPeerAsync: direct over NVLink/PCIe where peer access is on (enabled at build time when the devices can),
staged through the host by the driver where not; on one device it is a device-to-device copy. The head (logits,
greedy ids) is the last stage's. commit(n_keep) launches every stage's commit graph on its stream and returns
without waiting (GPUEngine's asynchronous commit, on every stage): each stage's next window is queued behind its own
commit on its own stream, and the hand-off into a stage writes only R, which no commit reads; wait_commit() waits
for every stage's.

Timing (window_timer): each stage's window between start[i] and end[i], its hand-off between end[i] and
hand_end[i] (CUDA events of one device each); the window + commit total on the last device, from a begin event
recorded there while it is idle to the end of the last commit every other device's commit event released.
"""

from __future__ import annotations

import time

import numpy as np

from ...gpu.runtime import check, cudart, cupy
from ..contract import WindowResult, WindowTimer
from ..layer_plan import StagePlan
from ..layer_split import SplitEngine, check_split_rows
from .engine import GPUEngine


def enable_peer_access(devices: list[int]) -> dict[tuple[int, int], bool]:
    """Peer access from each stage's device to the next's where the hardware allows (True), else False (the
    copies then go through the host); a device and itself: True."""
    rt, out = cudart(), {}
    for src, dst in zip(devices, devices[1:]):
        if src == dst:
            out[(src, dst)] = True
            continue
        can = bool(check(rt.cudaDeviceCanAccessPeer(src, dst), "cudaDeviceCanAccessPeer"))
        if can:
            with cupy().cuda.Device(src):
                err = rt.cudaDeviceEnablePeerAccess(dst, 0)[0]
                # already enabled (a second split engine in this process) is as good
                if int(err) not in (0, int(rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled)):
                    check((err,), "cudaDeviceEnablePeerAccess")
        out[(src, dst)] = can
    return out


def _load_kernels(stage) -> None:
    """An eager window of each launch path (launch_util.WINDOW_PATHS) and the largest T on the stage's device, then
    a reset: the kernel modules compile once per process, on the first stage's device, and CuPy loads them on
    another device at their first launch there, which must not fall inside a capture (GPUEngine's own warm-up runs
    T = 1 only, enough where the compile loaded every module)."""
    from ...gpu.launch_util import WINDOW_PATHS

    for T in sorted({first for first, _ in WINDOW_PATHS if first <= stage.max_t} | {stage.max_t}):
        stage.stage_window(np.zeros(T, dtype=np.int64))
        stage.launch_window(T, eager=True)
        stage.stream.synchronize()
    if stage.tiers is not None:  # these windows are not the user's either (the stall window, an adaptive cache)
        stage.tier_host.after_warm_up()
    stage.reset()


class GPUSplitEngine(SplitEngine):
    device = "gpu"

    def __init__(self, model, plan: list[StagePlan], n_ctx: int | None = None, max_t: int | None = None,
                 tiers=None):
        """tiers: a TierConfig for every stage: each chooses its residency over its own layers with the whole
        budget (--expert-cache is per GPU) and serves its own steps (its TierHost) while its window runs."""
        cp = cupy()
        self.devices = [p.device for p in plan]
        self.peer = enable_peer_access(self.devices)
        stages = []
        try:
            for p in plan:
                with cp.cuda.Device(p.device):
                    stages.append(GPUEngine(model, n_ctx=n_ctx, max_t=max_t, tiers=tiers, layers=p.layers))
                    _load_kernels(stages[-1])
        except BaseException:
            for p, s in zip(plan, stages):
                with cp.cuda.Device(p.device):
                    s.close()
            raise
        super().__init__(stages, plan)
        hand = ["same device" if a == b else ("peer copy" if self.peer[(a, b)] else "through the host")
                for a, b in zip(self.devices, self.devices[1:])]
        if hand:
            self.split_note += f"; hand-offs: {', '.join(hand)}"
        notes = [f"stage {i} (layers {s.layers[0]}..{s.layers[1] - 1}): {s.tier_note}"
                 for i, s in enumerate(stages) if s.tier_note]
        self.tier_note = "\n".join(notes) or None
        C, D = self.g.hc, self.g.n_embd
        self.row_bytes = C * D * 4  # one row of R
        self.events = []
        for p in plan:
            with cp.cuda.Device(p.device):
                self.events.append({k: cp.cuda.Event() for k in ("start", "end", "hand", "commit")})
        with cp.cuda.Device(self.devices[-1]):
            self.begin, self.finish = cp.cuda.Event(), cp.cuda.Event()
        self._pending: int | None = None
        self._pos0 = 0

    # ---- lifetime: each stage's buffers, streams and pool are its device's, so its calls run with it current
    def reset(self) -> None:
        for device, s in zip(self.devices, self.stages):
            with cupy().cuda.Device(device):
                s.reset()
        self._pending = None

    def close(self) -> None:
        for device, s in zip(self.devices, self.stages):
            with cupy().cuda.Device(device):
                s.close()

    def wait_commit(self) -> None:
        """Every stage's commit in flight has run (engine.py: GPUEngine.wait_commit)."""
        for device, s in zip(self.devices, self.stages):
            with cupy().cuda.Device(device):
                s.wait_commit()

    # ---- one window
    def _launch(self, tokens: np.ndarray, eager: bool) -> int:
        """Stage the tokens into every stage and launch the window through all stages (not synchronised)."""
        cp, rt = cupy(), cudart()
        last = len(self.stages) - 1
        T = 0
        for s in self.stages:
            T = s.stage_window(tokens)
        for i, (s, ev) in enumerate(zip(self.stages, self.events)):
            with cp.cuda.Device(self.devices[i]):
                if i:
                    s.stream.wait_event(self.events[i - 1]["hand"])
                ev["start"].record(s.stream)
                s.launch_window(T, eager)
                ev["end"].record(s.stream)
                if i < last:
                    nxt = self.stages[i + 1]
                    check(rt.cudaMemcpyPeerAsync(nxt.buf["R"].data.ptr, self.devices[i + 1], s.buf["R"].data.ptr,
                                                 self.devices[i], T * self.row_bytes, s.stream.ptr),
                          "cudaMemcpyPeerAsync (the layer split's hand-off)")
                    ev["hand"].record(s.stream)
        return T

    def _commit(self, n_keep: int, eager: bool) -> None:
        cp = cupy()
        for i, (s, ev) in enumerate(zip(self.stages, self.events)):
            with cp.cuda.Device(self.devices[i]):
                s.launch_commit(n_keep, eager)
                ev["commit"].record(s.stream)

    def _synchronize(self) -> None:
        for s in self.stages:
            s._synchronize()

    def _times(self, T: int) -> None:
        """Each stage's window ms and hand-off ms of the window just synchronised."""
        cp = cupy()
        stage_ms, hand_ms = [], []
        for i, ev in enumerate(self.events):
            with cp.cuda.Device(self.devices[i]):
                stage_ms.append(cp.cuda.get_elapsed_time(ev["start"], ev["end"]))
                if i + 1 < len(self.events):
                    hand_ms.append(cp.cuda.get_elapsed_time(ev["end"], ev["hand"]))
        self._record_times(T, stage_ms, hand_ms)

    def run(self, tokens, pos0: int | None = None, *, eager: bool = False, logits: bool = True) -> WindowResult:
        tokens = self._check(tokens, pos0)
        self._pending = None
        T = self._launch(tokens, eager)
        self._synchronize()
        self._times(T)
        self._pending, self._pos0 = T, self.n_past
        for s in self.stages:
            s._pending, s._pos0 = T, self.n_past
        head = self.stages[-1]
        ids = head.stage.out_ids.host[:T].copy()
        with cupy().cuda.Device(self.devices[-1]):
            host_logits = cupy().asnumpy(head.buf["logits"][:T]) if logits else None
        return WindowResult(self._pos0, tokens, host_logits, ids, nonfinite=head._nonfinite_rows(T))

    def commit(self, n_keep: int, *, eager: bool = False) -> None:
        check_split_rows(n_keep, self._pending)
        self._commit(n_keep, eager)  # not waited for: each stage's next window runs after it on its stream
        self._advance(n_keep)

    def _advance(self, n_keep: int) -> None:
        for s in self.stages:
            s.n_past += n_keep
            s._pending = None
        self._pending = None

    def sample(self, result: WindowResult, temperature: float, seed: int) -> np.ndarray:
        with cupy().cuda.Device(self.devices[-1]):
            return self.stages[-1].sample(result, temperature, seed)

    def window_timer(self, eager: bool = False) -> WindowTimer:
        """timer(engine, tokens, pos, n_keep) -> (GPU ms of the window through every stage + every commit, host
        ms of staging and launches); each window's per-stage and hand-off ms go to stage_times."""
        cp = cupy()
        if not eager:  # captured before the first timed window
            for i, s in enumerate(self.stages):
                with cp.cuda.Device(self.devices[i]):
                    s.graph(1)

        def timer(engine, tokens, pos, n_keep):
            engine._pending = None
            self.wait_commit()  # a commit() before is not this window's (the begin event needs idle streams)
            tokens = np.asarray(tokens, dtype=np.int64)
            last = len(self.stages) - 1
            t0 = time.perf_counter()
            with cp.cuda.Device(self.devices[-1]):
                self.begin.record(self.stages[-1].stream)  # every stream idle: this is the window's start
            T = self._launch(tokens, eager)
            self._commit(n_keep, eager)
            with cp.cuda.Device(self.devices[-1]):
                for ev in self.events[:last]:
                    self.stages[-1].stream.wait_event(ev["commit"])
                self.finish.record(self.stages[-1].stream)
            host_ms = (time.perf_counter() - t0) * 1e3
            self._synchronize()
            self._times(T)
            self._advance(n_keep)
            with cp.cuda.Device(self.devices[-1]):
                ms = cp.cuda.get_elapsed_time(self.begin, self.finish)
            return ms, host_ms

        return timer
