"""Lazy access to CuPy and cuda-bindings, with one error helper for cuda-bindings' tuple returns."""

from __future__ import annotations

import ctypes
import gc
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
        # portable + mapped: with UVA the same pointer on every device; the view belongs to the current one (a stage
        # of the layer split on device 1 launches its kernels there, engine/gpu/layer_split.py)
        mem = cp.cuda.UnownedMemory(self.dev_ptr, max(self.nbytes, 1), owner=self,
                                    device_id=cp.cuda.runtime.getDevice())
        self.device = cp.ndarray(shape, self.dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
        # freed when the last view goes (the device view keeps this object alive through its owner), or by free()
        self._finalizer = weakref.finalize(self, free_later_if_capturing, rt.cudaFreeHost, self.host_ptr)

    def free(self) -> None:
        """Free the pinned memory now (an engine's close(); idempotent). No view may be used afterwards."""
        self._finalizer()


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
