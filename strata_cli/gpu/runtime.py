"""Lazy access to CuPy and cuda-bindings, with one error helper for cuda-bindings' tuple returns."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import weakref
from contextlib import contextmanager
from functools import lru_cache

import numpy as np

MODULE_LOADING_ENV = "CUDA_MODULE_LOADING"


def eager_module_loading(env=os.environ) -> None:
    """Kernels load with their module, never at first launch. A lazily loaded kernel may need a context
    synchronisation; while a tier spin-wait kernel runs (an eager tiered window: the launcher thread still loads
    kernels while the GPU waits for the host) that synchronisation waits for the spin, and the host's PCIe copy and
    flagB write wait behind it, so the spin only ends at its 20 s bound. Read by the driver at its first call, so
    this runs on import, before CuPy or cuda-bindings touch the driver; an explicit LAZY is overridden."""
    if env.get(MODULE_LOADING_ENV, "").upper() != "EAGER":
        env[MODULE_LOADING_ENV] = "EAGER"


eager_module_loading()


@lru_cache(maxsize=None)
def cupy():
    import cupy as cp

    return cp


def empty(shape, dtype):
    """An uninitialised CuPy array (the launchers' outputs and scratch when the caller gives none)."""
    return cupy().empty(shape, dtype=dtype)


@lru_cache(maxsize=None)
def cudart():
    from cuda.bindings import runtime

    return runtime


@lru_cache(maxsize=None)
def cudrv():
    from cuda.bindings import driver

    return driver


def check(ret, what: str = "cuda call"):
    """cuda-bindings returns (err, *outputs); raise on err, return the outputs (one value unwrapped)."""
    err = ret[0]
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)}")
    return None if len(ret) == 1 else ret[1] if len(ret) == 2 else ret[1:]


# Open stream captures in this process, and the device frees that arrived meanwhile. A finalizer (weakref.finalize
# of a MappedBuffer, CapturedGraph.__del__) that runs inside a capture, e.g. from a cyclic garbage collection
# triggered by the recorder's own allocations, would call cudaFreeHost/cudaGraphExecDestroy there: CUDA refuses the
# call, the finalizer's error is lost, and the capture is silently invalidated (the next launch then fails with
# CUDA_ERROR_STREAM_CAPTURE_INVALIDATED far from the cause). So frees wait until the last capture ends.
_open_captures = 0
_deferred_frees: list = []


def free_later_if_capturing(free, *args) -> None:
    """Call free(*args) now, or once no capture is open (the finalizers' one way to release device resources)."""
    if _open_captures:
        _deferred_frees.append((free, args))
    else:
        free(*args)


@contextmanager
def capture_guard():
    """Around a stream capture: cyclic garbage collection paused and device frees deferred until it ends."""
    global _open_captures
    gc_was_enabled = gc.isenabled()
    gc.disable()
    _open_captures += 1
    try:
        yield
    finally:
        _open_captures -= 1
        if gc_was_enabled:
            gc.enable()
        if not _open_captures:
            while _deferred_frees:
                free, args = _deferred_frees.pop()
                free(*args)


@lru_cache(maxsize=None)
def device_arch() -> str:
    """'sm_90' on an H200: kernels are compiled for the device found."""
    cp = cupy()
    major, minor = cp.cuda.Device().compute_capability[:2] if isinstance(
        cp.cuda.Device().compute_capability, tuple) else tuple(cp.cuda.Device().compute_capability)
    return f"sm_{major}{minor}"


class MappedBuffer:
    """Pinned, mapped host memory seen as a numpy array on the host and a CuPy array on the device."""

    def __init__(self, shape, dtype):
        rt, cp = cudart(), cupy()
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.host_ptr = check(rt.cudaHostAlloc(max(self.nbytes, 1), rt.cudaHostAllocMapped
                                               | rt.cudaHostAllocPortable), "cudaHostAlloc")
        self.dev_ptr = check(rt.cudaHostGetDevicePointer(self.host_ptr, 0), "cudaHostGetDevicePointer")
        raw = (ctypes.c_char * max(self.nbytes, 1)).from_address(self.host_ptr)
        self.host = np.frombuffer(raw, dtype=self.dtype, count=int(np.prod(shape))).reshape(shape)
        mem = cp.cuda.UnownedMemory(self.dev_ptr, max(self.nbytes, 1), owner=self, device_id=0)
        self.device = cp.ndarray(shape, self.dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
        # freed when the last view goes (the device view keeps this object alive through its owner)
        weakref.finalize(self, free_later_if_capturing, rt.cudaFreeHost, self.host_ptr)


def page_spans(ranges, page: int = mmap.PAGESIZE) -> list[tuple[int, int]]:
    """(address, nbytes) host ranges -> the fewest page-aligned (start, nbytes) spans covering them: ranges that
    share or touch a page merge (cudaHostRegister takes whole pages, and a page registered twice is refused)."""
    spans: list[list[int]] = []
    for addr, nbytes in sorted((int(a), int(n)) for a, n in ranges if n > 0):
        lo, hi = addr // page * page, -(-(addr + nbytes) // page) * page
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in spans]


_pinned_refs: dict[tuple[int, int], int] = {}  # (start, nbytes) -> engines holding that registration


class PinnedHostSpans:
    """Host ranges (e.g. a memory-mapped GGUF's expert tensors) page-locked in place for the copy engine.

    Why: a cudaMemcpyAsync from pageable memory is staged by the driver, and a large staged copy waits for the
    device: while a window's graph spins on a mapped word that only this copy's completion raises (the PCIe share's
    flagB), the copy and the wait hold each other until the spin's time bound. From page-locked memory the copy is a
    plain DMA on its own stream. Read-only registration: the file is mapped read-only. Spans are counted per
    process, so several engines over one mapped model (a --expert-cache sweep) share one registration; the last
    holder's free (or its finalizer) unregisters."""

    def __init__(self, ranges):
        self.spans: list[tuple[int, int]] = []
        try:
            for span in page_spans(ranges):
                _pin(span)
                self.spans.append(span)
        except BaseException:
            self.free()
            raise
        weakref.finalize(self, _unpin_all, self.spans)

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.spans)

    def free(self) -> None:
        _unpin_all(self.spans)


def _pin(span: tuple[int, int]) -> None:
    if not _pinned_refs.get(span):
        rt = cudart()
        start, nbytes = span
        check(rt.cudaHostRegister(start, nbytes, rt.cudaHostRegisterReadOnly | rt.cudaHostRegisterPortable),
              f"cudaHostRegister of {nbytes} bytes of the model file")
    _pinned_refs[span] = _pinned_refs.get(span, 0) + 1


def _unpin_all(spans: list[tuple[int, int]]) -> None:
    """Drop these holds (the list empties, so a second call does nothing); unregister the spans nobody holds."""
    while spans:
        span = spans.pop()
        _pinned_refs[span] -= 1
        if not _pinned_refs[span]:
            del _pinned_refs[span]
            free_later_if_capturing(cudart().cudaHostUnregister, span[0])


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written (the usual STREAM copy
    convention); the ceiling a weight-streaming window is held against."""
    cp = cupy()
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    dst[...] = src
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        dst[...] = src
    end.record()
    end.synchronize()
    seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
    del src, dst
    return 2 * nbytes * repeats / seconds
