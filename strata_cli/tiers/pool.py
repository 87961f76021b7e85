"""The CPU expert pool: the missed routed experts of one layer, each computed once for all rows routed to it,
straight from the memory-mapped GGUF blocks.

y = down · (silu(gate · x) ⊙ (up · x)), unweighted (the GPU applies the router weights when it combines).
The native path (kernels/expert_pool.c, built on first use, see tiers/native.py) runs the whole layer in one
ctypes call (the GIL is released) over an OpenMP team: float32 arithmetic on the exactly dequantized weights,
decoded into registers and FMA'd with every row routed to the expert in one pass (AVX-512 or AVX2, chosen at run
time; STRATA_POOL_THREADS sets the team size). The numpy path, used when no C compiler is found or a type has no kernel, computes exactly
what the numpy reference engine computes (float64 weights, ops.moe.swiglu).
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .. import settings
from ..model import quants
from ..ops import moe
from . import native
from .plan import ExpertEntries
from .residency import EXPERT_ROLES

_ptr = ctypes.c_void_p
PROF_HEAD, PROF_PER = 4, 8  # strata_pool_diag's profile layout (kernels/expert_pool.c)


def default_threads() -> int:
    """STRATA_POOL_THREADS (a positive integer) where set, else every core this process may run on."""
    threads = settings.POOL_THREADS.value()
    if threads is not None:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def gather_team() -> tuple[object, int]:
    """(the native library, its team size) an ExpertPool made with the defaults computes on: the host gathers (the
    PCIe share's page-locked store at load, engine/gpu/expert_store.py; an adaptive cache's slot fills) run on the
    same team, one call after the other with the pool's."""
    return native.load(), default_threads()


class _LayerTensors:
    """gate / up / down of one layer: raw memmap views [E, rows, row bytes|elems] and their byte strides."""

    def __init__(self, model, layer: int):
        infos = [model.info(f"blk.{layer}.{role}.weight") for role in EXPERT_ROLES]
        self.raw = [np.asarray(i.raw) if not isinstance(i.raw, np.memmap) else i.raw for i in infos]
        self.types = [i.ggml_type for i in infos]
        self.base = np.array([r.ctypes.data for r in self.raw], dtype=np.uint64)
        self.expert_stride = np.array([r.strides[0] for r in self.raw], dtype=np.uint64)
        self.row_stride = [int(r.strides[1]) for r in self.raw]
        self.expert_bytes = sum(int(i.n_bytes) // i.shape[-1] for i in infos)
        self.base_ptr, self.stride_ptr = self.base.ctypes.data, self.expert_stride.ctypes.data  # compute_step's

    def pointers(self, experts: np.ndarray) -> list[np.ndarray]:
        e = experts.astype(np.uint64)
        return [np.ascontiguousarray(self.base[m] + e * self.expert_stride[m]) for m in range(3)]


class ExpertPool:
    def __init__(self, model, n_threads: int | None = None, use_native: bool = True, lib=None):
        self.model = model
        g = model.geometry
        self.n_embd, self.n_ff, self.k = g.n_embd, g.n_ff_exp, g.n_expert_used
        self.n_threads = int(n_threads or default_threads())
        self.layers = [_LayerTensors(model, layer) for layer in range(g.n_layers)]
        self.lib = (lib or native.load()) if use_native else None
        supported = native.native_types() if self.lib is not None else frozenset()
        # per layer: native kernels for all three tensors, or the numpy path
        self.native_layers = [all(t in supported for t in lt.types) for lt in self.layers]
        self._h = np.zeros(0, dtype=np.float32)  # gate/up products [entries, F], reused; guarded by _lock
        self._lock = threading.Lock()  # one layer at a time: a second caller would only oversubscribe the cores
        # the native calls' own time (strata_pool_diag's profile, CLOCK_MONOTONIC ns, summed over calls): the
        # kernel's wall time and, of it, the team's wake-up (the call to the last thread entering its region);
        # tiers/host.py reports them beside the step's pool time, whose rest is Python (verify-bench)
        self.kernel_ns = 0
        self.wake_ns = 0
        self._prof = np.zeros(PROF_HEAD + PROF_PER * self.n_threads, dtype=np.int64)
        self._prof_ptr = self._prof.ctypes.data
        self._f64: dict[tuple[int, int], tuple] = {}

    def set_threads(self, n_threads: int) -> None:
        """The team's size from the next call on (its profile buffer sized to it)."""
        self.n_threads = max(1, int(n_threads))
        self._prof = np.zeros(PROF_HEAD + PROF_PER * self.n_threads, dtype=np.int64)
        self._prof_ptr = self._prof.ctypes.data

    @property
    def backend(self) -> str:
        n = sum(self.native_layers)
        if n == len(self.layers):
            return f"native {self.lib.isa} ({self.n_threads} threads)"
        return "numpy" if n == 0 else f"native on {n} of {len(self.layers)} layers, numpy on the rest"

    def reserve(self, n_entries: int) -> None:
        """The gate/up scratch sized for n_entries (layer entries of one call) and written once, so that no later
        call allocates it or faults its pages in."""
        need = int(n_entries) * self.n_ff
        if self._h.size < need:
            h = np.empty(need, dtype=np.float32)
            h.fill(0.0)
            self._h = h

    def expert_bytes(self, layer: int) -> int:
        return self.layers[layer].expert_bytes

    def compute(self, layer: int, x: np.ndarray, cpu: ExpertEntries, out: np.ndarray | None = None) -> np.ndarray:
        """x [rows, H] f32 (indexed by the entries' tok); writes out[dst] = expert(x[tok]) for every entry of
        `cpu`; out [rows·k, H] f32 (allocated zeroed when None). Returns out."""
        if out is None:
            out = np.zeros((x.shape[0] * self.k, self.n_embd), dtype=np.float32)
        if cpu.n_groups == 0:
            return out
        # the C kernel indexes x and out by the plan's rows: check them here, once per layer
        if x.shape[-1] != self.n_embd or out.shape[-1] != self.n_embd:
            raise ValueError(f"x {x.shape} / out {out.shape}: rows of {self.n_embd} expected")
        if int(cpu.tok.max()) >= x.shape[0] or int(cpu.dst.max()) >= out.shape[0] or min(cpu.tok.min(),
                                                                                          cpu.dst.min()) < 0:
            raise ValueError(f"plan rows out of range: tok <= {int(cpu.tok.max())} of {x.shape[0]}, dst <= "
                             f"{int(cpu.dst.max())} of {out.shape[0]}")
        if self.native_layers[layer] and out.dtype == np.float32 and out.flags.c_contiguous:
            with self._lock:
                self._native(layer, np.ascontiguousarray(x, dtype=np.float32), cpu, out)
        else:
            for i, expert in enumerate(cpu.experts):
                tok, dst = cpu.entries(i)
                out[dst] = moe.swiglu(x[tok], *self._expert_f64(layer, int(expert)))
        return out

    def compute_step(self, layer: int, x: np.ndarray, cpu: ExpertEntries, out: np.ndarray) -> None:
        """compute() for a tier host's step: cpu planned by tiers/step_plan (int32 arrays, tok < x's rows and dst <
        out's rows by construction, so unchecked here), x float32 [rows, H] and out float32 [rows·k, H] both
        C-contiguous. One C call builds the experts' pointers and runs the layer (strata_pool_experts): the checks,
        pointer arrays and conversions of compute() cost ~100 us a layer on the H200 host, on the window's path."""
        if cpu.n_groups == 0:
            return
        if not (self.native_layers[layer] and x.dtype == out.dtype == np.float32 and x.flags.c_contiguous
                and out.flags.c_contiguous and x.shape[-1] == out.shape[-1] == self.n_embd):
            self.compute(layer, x, cpu, out)
            return
        lt = self.layers[layer]
        need = cpu.n_entries * self.n_ff
        with self._lock:
            if self._h.size < need:
                self._h = np.empty(need, dtype=np.float32)
            prof = self._prof
            rc = self.lib.strata_pool_experts(
                self.n_threads, self.n_embd, self.n_ff, cpu.n_groups, cpu.experts.ctypes.data, lt.base_ptr,
                lt.stride_ptr, lt.row_stride[0], lt.row_stride[1], lt.row_stride[2], lt.types[0], lt.types[1],
                lt.types[2], cpu.start.ctypes.data, cpu.tok.ctypes.data, cpu.dst.ctypes.data, x.ctypes.data,
                out.ctypes.data, self._h.ctypes.data, self._prof_ptr)
            if rc != 0:
                raise RuntimeError(f"expert pool kernel failed on layer {layer} (code {rc})")
            self._account(prof)

    def _account(self, prof: np.ndarray) -> None:
        """The last native call's kernel and wake-up time (its profile) into kernel_ns / wake_ns."""
        entered = prof[PROF_HEAD:PROF_HEAD + PROF_PER * int(prof[2]):PROF_PER]
        entered = entered[entered > 0]  # the threads the team had (OpenMP may give fewer than asked)
        self.kernel_ns += int(prof[1] - prof[0])
        self.wake_ns += int(entered.max() - prof[0]) if entered.size else 0

    def _native(self, layer: int, x: np.ndarray, cpu: ExpertEntries, out: np.ndarray) -> None:
        args, keep = self.native_args(layer, x, cpu, out)
        prof = self._prof
        rc = self.lib.strata_pool_diag(*args, 0, _ptr(prof.ctypes.data))
        del keep
        if rc != 0:
            raise RuntimeError(f"expert pool kernel failed on layer {layer} (code {rc})")
        self._account(prof)

    def native_args(self, layer: int, x: np.ndarray, cpu: ExpertEntries, out: np.ndarray) -> tuple[tuple, list]:
        """strata_pool_swiglu's arguments for one layer (x f32 contiguous, out as compute() checks it), and the
        arrays they point into (keep them alive for the call). bench/pool_bench.py calls strata_pool_diag with
        these."""
        lt = self.layers[layer]
        gate, up, down = lt.pointers(cpu.experts)
        need = cpu.n_entries * self.n_ff
        if self._h.size < need:
            self._h = np.empty(need, dtype=np.float32)
        start = np.ascontiguousarray(cpu.start, dtype=np.int32)
        tok = np.ascontiguousarray(cpu.tok, dtype=np.int32)
        dst = np.ascontiguousarray(cpu.dst, dtype=np.int32)
        args = (self.n_threads, self.n_embd, self.n_ff, cpu.n_groups,
                _ptr(gate.ctypes.data), _ptr(up.ctypes.data), _ptr(down.ctypes.data),
                lt.row_stride[0], lt.row_stride[1], lt.row_stride[2], lt.types[0], lt.types[1], lt.types[2],
                _ptr(start.ctypes.data), _ptr(tok.ctypes.data), _ptr(dst.ctypes.data),
                _ptr(x.ctypes.data), _ptr(out.ctypes.data), _ptr(self._h.ctypes.data))
        return args, [gate, up, down, start, tok, dst, x, out, self._h]

    def _expert_f64(self, layer: int, expert: int):
        key = (layer, expert)
        w = self._f64.get(key)
        if w is None:
            lt = self.layers[layer]
            w = tuple(_dequantize(np.asarray(lt.raw[m][expert]), lt.types[m]).astype(np.float64) for m in range(3))
            if len(self._f64) > 64:  # the fallback is for small models and tests: keep a few experts, not all
                self._f64.clear()
            self._f64[key] = w
        return w


def _dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """strata's dequantizer where it has the type, else gguf's (the format reference strata's matches bit for bit)."""
    if ggml_type in quants.SUPPORTED:
        return quants.dequantize(raw, ggml_type)
    from gguf import GGMLQuantizationType, quants as gguf_quants

    return gguf_quants.dequantize(raw, GGMLQuantizationType(ggml_type))
