"""Provenance of a run: versions, commit, host, CPU and (for --device gpu) the GPU, driver and CUDA runtime."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .. import __version__, settings

_REPO = Path(__file__).resolve().parents[2]
_CUPY_DISTS = ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy")


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> str | None:
    """Short hash of the checkout strata runs from, + "-dirty" with uncommitted changes, or None outside one.
    $STRATA_GIT_COMMIT, when set, wins and is marked "(declared)": a copy of the tree on a remote GPU machine may
    carry no .git, or a stale one whose HEAD is not the commit being measured."""
    declared = settings.GIT_COMMIT.value()
    if declared:
        return f"{declared} (declared)"
    top = _git("rev-parse", "--show-toplevel")
    # an installed copy may sit inside some other repository (a venv in a project): that commit is not ours
    if top is None or Path(top).resolve() != _REPO:
        return None
    commit = _git("rev-parse", "--short", "HEAD")
    if commit is None:
        return None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit + "-dirty" if status else commit


def cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    # on Linux platform.processor() is often just the architecture, hence /proc/cpuinfo first
    return platform.processor() or platform.machine() or None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _nvidia_driver() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as fh:
            words = fh.readline().split()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <date>"
    return next((w for w in words if w[:1].isdigit() and w.count(".") >= 1), None)


def gpu_record() -> dict:
    """gpu_name, driver, cuda_runtime of the current CuPy device; each None where it cannot be read."""
    rec: dict = {"gpu_name": None, "driver": None, "cuda_runtime": None}
    try:
        from ..gpu import runtime as _strata_runtime  # noqa: F401  (CUDA_MODULE_LOADING before the driver starts)
        import cupy

        runtime = cupy.cuda.runtime
    except Exception:
        return rec
    try:
        name = runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        rec["gpu_name"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    try:
        cuda = _cuda_version(runtime.driverGetVersion())
        driver = _nvidia_driver()
        rec["driver"] = f"{driver} (CUDA {cuda})" if driver else f"CUDA {cuda}"
    except Exception:
        pass
    try:
        rec["cuda_runtime"] = _cuda_version(runtime.runtimeGetVersion())
    except Exception:
        pass
    return rec


def environment_record(device: str) -> dict:
    """Everything a benchmark record needs to say where it came from. Never raises; unknowns are None."""
    rec = {
        "strata": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "numpy": _dist_version("numpy"),
        "gguf": _dist_version("gguf"),
        "cupy": _dist_version(*_CUPY_DISTS),
        "cuda_bindings": _dist_version("cuda-bindings"),
        "host": platform.node() or None,
        "cpu": cpu_name(),
        "device": device,
    }
    if device == "gpu":
        rec.update(gpu_record())
    return rec


def header_line(rec: dict) -> str:
    """One line for above a table: `strata 0.1.0 @ abc1234 | device cpu (...) | numpy 2.4.6 gguf 0.19.0 | python 3.11.7`."""
    head = f"strata {rec.get('strata')}"
    if rec.get("git_commit"):
        head += f" @ {rec['git_commit']}"
    device = rec.get("device")
    if device == "gpu":
        details = [rec.get("gpu_name") or "unknown GPU"]
        if rec.get("driver"):
            details.append(f"driver {rec['driver']}")
        if rec.get("cuda_runtime"):
            details.append(f"runtime {rec['cuda_runtime']}")
    else:
        details = [rec.get("cpu") or "unknown CPU"]
    libs = [f"{name} {rec[key]}" for key, name in
            (("numpy", "numpy"), ("gguf", "gguf"), ("cupy", "cupy"), ("cuda_bindings", "cuda-bindings"))
            if rec.get(key) and (key in ("numpy", "gguf") or device == "gpu")]
    return f"{head} | device {device} ({', '.join(details)}) | {' '.join(libs)} | python {rec.get('python')}"
