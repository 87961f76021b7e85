"""Verify engines behind one contract (engine/contract.py): `ReferenceEngine` (numpy, CPU, engine/reference.py)
and `GPUEngine` (CuPy, engine/gpu/). `make_engine` picks one by device."""

from __future__ import annotations

import importlib.util

from ..errors import DeviceUnavailable, OptionError
from .contract import Capabilities, Engine, WindowResult

__all__ = ["DEVICES", "Capabilities", "Engine", "WindowResult", "gpu_probe", "make_engine", "resolve_device"]

DEVICES = ("cpu", "gpu", "auto")
INSTALL_HINT = 'pip install -e ".[gpu]"'


def gpu_probe() -> tuple[bool, str | None]:
    """(installed, why not usable): installed is False when CuPy is not installed at all; why is None when the GPU
    engine can run here, else one line saying what is wrong (never raises)."""
    if importlib.util.find_spec("cupy") is None:
        return False, f"CuPy is not installed ({INSTALL_HINT})"
    try:
        from ..gpu import runtime  # noqa: F401  (CUDA_MODULE_LOADING before the driver starts)
        import cupy

        n_devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # a broken CUDA stack raises anything from ImportError to CUDARuntimeError
        return True, f"CuPy is installed but unusable: {type(exc).__name__}: {_first_line(exc)}"
    if n_devices < 1:
        return True, "CuPy is installed but sees no CUDA device"
    try:
        from .gpu import GPUEngine  # noqa: F401  (cuda-bindings and the engine's own imports)
    except Exception as exc:
        return True, f"the GPU engine does not import: {type(exc).__name__}: {_first_line(exc)} ({INSTALL_HINT})"
    return True, None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def resolve_device(device: str) -> str:
    """cpu or gpu. auto is the GPU when usable; when the GPU stack is installed but broken, auto says why in one
    warning line on stderr before it runs the numpy engine."""
    if device not in DEVICES:
        raise OptionError(f"unknown device '{device}' (choose from {', '.join(DEVICES)})")
    if device != "auto":
        return device
    installed, why = gpu_probe()
    if why is None:
        return "gpu"
    if installed:
        from ..report.present import warn

        warn(f"--device auto: {why}; running the numpy engine (--device cpu)")
    return "cpu"


def make_engine(model, device: str = "cpu", n_ctx: int | None = None, max_t: int | None = None,
                tiers=None, split=None) -> Engine:
    """tiers: a TierConfig (tiers/config.py) for the GPU engine's expert tiers; the numpy engine ignores it.
    split: a layer_plan.SplitConfig (--gpus, --layer-split): the engine made of stage engines over layer ranges
    (engine/layer_split.py), on the GPUs, or on the numpy path numpy stages one after the other."""
    device = resolve_device(device)
    if device == "gpu":
        _, why = gpu_probe()
        if why is not None:
            raise DeviceUnavailable(f"the GPU engine cannot run here: {why} (--device cpu runs the numpy engine)")
        if split is not None:
            return _split_engine(model, split, n_ctx, max_t, tiers, gpu=True)
        from .gpu import GPUEngine

        engine = GPUEngine(model, n_ctx=n_ctx, max_t=max_t, tiers=tiers)
        if engine.tier_note:
            from ..report.present import err_console

            err_console().print(engine.tier_note, style="dim", highlight=False, soft_wrap=True)
        return engine
    if tiers is not None:
        from ..report.present import warn

        warn("--expert-cache/--expert-profile/--pcie-frac apply to the GPU engine only: the numpy engine "
             "keeps every expert in memory")
    if split is not None:
        return _split_engine(model, split, n_ctx, max_t, None, gpu=False)
    from .reference import ReferenceEngine

    return ReferenceEngine(model, n_ctx=n_ctx, max_t=max_t)


def _split_engine(model, split, n_ctx, max_t, tiers, gpu: bool):
    """The layer split's engine: the plan checked against the model and the visible devices first (one line)."""
    from .layer_plan import plan_split

    if gpu:
        from ..gpu.runtime import cupy

        plan = plan_split(split, model, cupy().cuda.runtime.getDeviceCount())
        from .gpu.layer_split import GPUSplitEngine

        engine = GPUSplitEngine(model, plan, n_ctx=n_ctx, max_t=max_t, tiers=tiers)
    else:
        plan = plan_split(split, model, None)
        from .layer_split import ReferenceSplit

        engine = ReferenceSplit(model, plan, n_ctx=n_ctx, max_t=max_t)
    from ..report.present import err_console

    err_console().print(engine.split_note, style="dim", highlight=False)
    if engine.tier_note:  # each stage's residency
        err_console().print(engine.tier_note, style="dim", highlight=False, soft_wrap=True)
    return engine
