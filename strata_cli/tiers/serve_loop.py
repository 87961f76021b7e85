"""The tier host's native loop: every step of a window in one C call per ring wait (kernels/expert_pool_serve.h
strata_serve_steps: wait for the ring, plan, flagA, the PCIe share's DMAs and flagB on the copy stream, the CPU
pool, flag).

tiers/host.py TierHost serves a window through this loop whenever it can: one token group, the native plan and the
native pool on every layer, and with a PCIe share a graph window (an eager window's launcher needs the copy thread's
gate, TierHost.wait_issued) from the page-locked store. Otherwise, and as the reference the CPU tests hold it to,
TierHost._step serves each step in Python. On the H200 host that Python cost ~40-80 us a step on the window's
critical path (3.7 ms of a 28.4 ms cache-0 T = 1 window at 25b71aa). With a PCIe share the loop issues a step's
copies from the pool's thread 0 while the rest of the team computes (the driver calls by address, driver_calls()):
no copy thread, so the team keeps every core.

The C call returns when the window's host work is done, when a ring has not come within the wait slice (the host
then looks at the release, the stream and its bounds, and calls again from that step), or with an error code. The
picks of every step land in ids_log, from which the host replays its route hook and an adaptive cache's observe()
after the loop (neither changes what a step of the same window plans).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..gpu.launch_util import GEMV_MAXT
from .doorbell import FLAG, FLAG_A, FLAG_B, SEQ

_I64_FIELDS = ("n_steps", "lo", "T", "K", "E", "H", "F", "JM", "M", "n_threads", "withhold_last", "w_seq", "w_flag_a",
               "w_flag_b", "w_flag")
_PTR_FIELDS = ("words", "ids", "x", "ymiss", "slot", "table", "base", "estride", "row_stride", "types", "expert_bytes",
               "h", "ids_log", "cpu_experts", "cpu_start", "cpu_tok", "cpu_dst", "pcie_experts", "pcie_start",
               "pcie_dst", "counts", "group", "prof")
# the PCIe share's: the driver calls, the copy stream, flagB's device address, the store's and the staging's addresses
_PCIE_FIELDS = (("copy", ctypes.c_void_p), ("write_value", ctypes.c_void_p), ("record", ctypes.c_void_p),
                ("copy_stream", ctypes.c_void_p), ("flag_b_dev", ctypes.c_uint64), ("store_at", ctypes.c_void_p),
                ("store_slot", ctypes.c_void_p), ("proj_bytes", ctypes.c_void_p), ("stage_dev", ctypes.c_void_p),
                ("events", ctypes.c_void_p), ("copied", ctypes.c_void_p))
# stats[] of strata_serve_steps, in this order (kernels/expert_pool_serve.h SERVE_*)
STATS = ("vram", "cpu", "cpu_bytes", "wait_ns", "plan_ns", "pool_ns", "kernel_ns", "wake_ns", "step", "pcie",
         "pcie_bytes", "issue_ns", "copy_rc")
RELEASED, BAD_ID, PLAN_SIZE, POOL_FAILED, BAD_ARGS, COPY_FAILED, UNSTORED = -1, -2, -3, -4, -5, -6, -7
# the driver entry points the loop calls (their C types: kernels/expert_pool_serve.h copy_fn, write_fn, event_fn)
DRIVER_CALLS = {"copy": "cuMemcpyHtoDAsync_v2", "write_value": "cuStreamWriteValue32_v2", "record": "cuEventRecord"}


class ServeArgs(ctypes.Structure):
    """strata_serve_args (kernels/expert_pool_serve.h), field for field."""

    _fields_ = ([(name, ctypes.c_int64) for name in _I64_FIELDS] + [("pcie_frac", ctypes.c_double)]
                + [(name, ctypes.c_void_p) for name in _PTR_FIELDS] + list(_PCIE_FIELDS))


def driver_calls() -> dict[str, int]:
    """The addresses of the CUDA driver calls of the PCIe share (libcuda, which CuPy has loaded already); the CPU
    tests replace this with stand-ins."""
    lib = ctypes.CDLL("libcuda.so.1")
    return {field: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for field, name in DRIVER_CALLS.items()}


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


class NativeServe:
    """The loop's arguments for one TierHost, made once; window() sets what changes per window."""

    @staticmethod
    def usable(host) -> bool:
        t, pool, planner = host.t, host.src.pool, host.planner
        return (t.G == 1 and pool.lib is not None and planner.lib is not None and all(pool.native_layers)
                and hasattr(pool.lib, "strata_serve_steps")
                and (not t.pcie or getattr(t, "store", None) is not None))  # the copies come from the store

    def __init__(self, host):
        t, pool, planner = host.t, host.src.pool, host.planner
        self.lib, self.pool, self.tiers = pool.lib, pool, t
        L = t.L
        self.base = np.zeros((L, 3), np.uint64)
        self.estride = np.zeros((L, 3), np.uint64)
        self.row_stride = np.zeros((L, 3), np.int64)
        self.types = np.zeros((L, 3), np.int32)
        for layer, lt in enumerate(pool.layers):
            self.base[layer], self.estride[layer] = lt.base, lt.expert_stride
            self.row_stride[layer], self.types[layer] = lt.row_stride, lt.types
        self.expert_bytes = np.array([sum(t.expert_bytes[layer]) for layer in range(L)], np.int64)
        self.n_steps = t.steps.count(1)
        self.ids_log = np.zeros((self.n_steps, t.JM), np.int32)  # step k's picks at [k * T * K, (k + 1) * T * K)
        self.stats = np.zeros(len(STATS), np.int64)
        pool.reserve(t.JM)  # every entry of a window fits the gate/up scratch: no call reallocates it
        (ce, cs, ct, cd), (pe, ps, pd) = planner._cpu, planner._pcie
        a = self.args = ServeArgs()
        fixed = dict(n_steps=self.n_steps, lo=t.steps.lo, K=t.K, E=t.E, H=pool.n_embd, F=pool.n_ff, JM=t.JM,
                     M=GEMV_MAXT, n_threads=pool.n_threads, w_seq=SEQ, w_flag_a=FLAG_A, w_flag_b=FLAG_B, w_flag=FLAG,
                     words=_addr(t.words.host), ids=_addr(t.pub_ids.host), x=_addr(t.pub_x.host),
                     ymiss=_addr(t.ymiss.host), slot=_addr(t.plan.host[0]), base=_addr(self.base),
                     estride=_addr(self.estride), row_stride=_addr(self.row_stride), types=_addr(self.types),
                     expert_bytes=_addr(self.expert_bytes), ids_log=_addr(self.ids_log), cpu_experts=_addr(ce),
                     cpu_start=_addr(cs), cpu_tok=_addr(ct), cpu_dst=_addr(cd), pcie_experts=_addr(pe),
                     pcie_start=_addr(ps), pcie_dst=_addr(pd), counts=_addr(planner._counts),
                     group=_addr(planner._group), prof=_addr(pool._prof))
        for name, value in fixed.items():
            setattr(a, name, value)
        self.pcie = bool(t.pcie)
        self.copied = np.zeros(self.n_steps, np.int32)
        if self.pcie:
            self._bind_pcie(host)
        self._args_ref = ctypes.byref(a)
        self._stats_ptr = _addr(self.stats)
        self._table = None

    def _bind_pcie(self, host) -> None:
        """The PCIe share's fields: each layer's store blocks and slots, one expert's bytes per projection, group 0's
        device staging slots, flagB's device address, the step events (host._copy_events, made now: the loop
        records them), the driver calls and the copy stream."""
        t, a, L = self.tiers, self.args, self.tiers.L
        store = t.store
        self.store_at = np.zeros((L, 3), np.uint64)
        self.store_slot = np.full((L, t.E), -1, np.int64)
        self.proj_bytes = np.zeros((L, 3), np.int64)
        for layer in range(L):
            if layer in store.slot:
                self.store_at[layer] = [store.base + at for at in store.at[layer]]
                self.store_slot[layer] = store.slot[layer]
            self.proj_bytes[layer] = t.expert_bytes[layer]
        self.stage_dev = np.array([t.buf[f"tier_stage.0.{p}"].data.ptr for p in range(3)], np.uint64)
        host._copy_events(self.n_steps - 1)
        self.events = np.array([[int(ev) for ev in host._events[k]] for k in range(self.n_steps)], np.uint64)
        calls = driver_calls()
        fields = dict(calls, pcie_frac=float(t.cfg.pcie_frac), copy_stream=int(t.copy_stream.ptr),
                      flag_b_dev=int(t.words.device[FLAG_B:FLAG_B + 1].data.ptr), store_at=_addr(self.store_at),
                      store_slot=_addr(self.store_slot), proj_bytes=_addr(self.proj_bytes),
                      stage_dev=_addr(self.stage_dev), events=_addr(self.events), copied=_addr(self.copied))
        for name, value in fields.items():
            setattr(a, name, value)

    def window(self, T: int, withhold_last: bool, pcie_frac: float | None = None) -> None:
        """A new window of T rows: its residency table (an adaptive cache changes it between windows), the pool's
        scratch (as reserved), the stats zeroed; with a PCIe share its share of each step's misses (pcie_frac:
        --pcie-frac auto moves it between windows, tiers/share.ShareTuner; None: the one the loop was made with)."""
        t, a = self.tiers, self.args
        self._table = np.ascontiguousarray(t.table_host, dtype=np.int32)  # a view when it is one already
        if self.pool._h.size < t.JM * self.pool.n_ff:
            self.pool.reserve(t.JM)
        a.T, a.withhold_last = int(T), int(bool(withhold_last))
        if self.pcie and pcie_frac is not None:
            a.pcie_frac = float(pcie_frac)
        a.table, a.h = _addr(self._table), _addr(self.pool._h)
        self.stats[:] = 0
        self.copied[:] = 0

    def run(self, k: int, max_wait_ns: int) -> int:
        """Steps from k on; the next step to serve (n_steps: done), or one of the codes below 0."""
        return int(self.lib.strata_serve_steps(self._args_ref, int(k), int(max_wait_ns), self._stats_ptr))

    def picks(self, k: int, T: int, K: int) -> np.ndarray:
        """Step k's routed experts [T, K] as the loop read them."""
        return self.ids_log.reshape(-1)[k * T * K:(k + 1) * T * K].reshape(T, K)

    def copied_steps(self) -> np.ndarray:
        """The steps whose DMAs the loop issued between their events this window."""
        return np.flatnonzero(self.copied)

    def totals(self) -> dict[str, int]:
        return dict(zip(STATS, (int(v) for v in self.stats)))
