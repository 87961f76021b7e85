"""Verify engines: `ReferenceEngine` (numpy, CPU) and the GPU engine. `make_engine` picks one by device."""

from __future__ import annotations

from ..errors import DeviceUnavailable, InputError

DEVICES = ("cpu", "gpu", "auto")


def gpu_available() -> bool:
    """True when CuPy imports and sees a CUDA device (never raises)."""
    try:
        import cupy

        return bool(cupy.is_available())
    except Exception:
        return False


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise InputError(f"unknown device '{device}' (choose from {', '.join(DEVICES)})")
    if device == "auto":
        return "gpu" if gpu_available() and _gpu_engine_present() else "cpu"
    return device


def _gpu_engine_present() -> bool:
    try:
        from . import gpu  # noqa: F401
    except ImportError:
        return False
    return True


def make_engine(model, device: str = "cpu", n_ctx: int | None = None, max_t: int | None = None):
    device = resolve_device(device)
    if device == "gpu":
        if not _gpu_engine_present():
            raise DeviceUnavailable("the GPU verify engine is not part of this build yet: use --device cpu")
        if not gpu_available():
            raise DeviceUnavailable("no CUDA GPU visible to CuPy here: the GPU engine needs one "
                                    "(--device cpu runs the numpy engine)")
        from .gpu import GPUEngine

        return GPUEngine(model, n_ctx=n_ctx, max_t=max_t)
    from .reference import ReferenceEngine

    return ReferenceEngine(model, n_ctx=n_ctx, max_t=max_t)
