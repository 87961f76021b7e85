"""Shared fixtures: the qwen4exp-tiny fixture directory, a private strata cache, and the GPU gate.

Skips that must not happen where the thing exists are errors:
- `fixture_dir` skips without the shared fixture, but fails when it is required: CI=true (CI checks out
  ../shared) or STRATA_REQUIRE_FIXTURES=1.
- Tests marked `gpu` skip on a machine without an NVIDIA GPU (no /dev/nvidia* device, no nvidia-smi listing),
  and fail when a GPU is there but CuPy cannot use it (a broken CUDA stack must not pass as "no GPU"), or when
  STRATA_REQUIRE_GPU=1 (the device run) and there is no usable GPU at all.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# before any CUDA driver call of the test process (cupy_problem below initialises the driver): see
# strata_cli/gpu/runtime.eager_module_loading
os.environ["CUDA_MODULE_LOADING"] = "EAGER"

# Under pytest-xdist every worker's CPU pool (an OpenMP team, spinning at its barriers) would take every core: 12
# workers on the device's 16 cores made 192 spinning threads, and tiered tests and model writes there ran past
# their 150 s limit (2026-12-02). Each worker gets its share of the cores and teams that sleep at barriers, unless
# the run sets them itself.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("STRATA_POOL_THREADS", str(max(2, _share)))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parent.parent
collect_ignore = ["mutation"]  # tests/mutation/run.py drives the suite itself; CI does not run it
DEFAULT_FIXTURES = REPO.parent / "shared" / "fixtures" / "qwen4exp-tiny"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def fixtures_required() -> bool:
    return _flag("CI") or _flag("STRATA_REQUIRE_FIXTURES")


def gpu_required() -> bool:
    return _flag("STRATA_REQUIRE_GPU")


def gpu_hardware_present() -> bool:
    """An NVIDIA device node, or nvidia-smi listing a GPU: the machine has one, whatever CuPy says."""
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU" in listing


def cupy_problem() -> str | None:
    """Why CuPy cannot run a kernel here, or None when it can (imported only if a gpu test was collected)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
        probe = cupy.arange(4, dtype=cupy.float32) * 2  # allocates and launches a kernel
        if float(probe.sum()) != 12.0:
            return "CuPy computed a wrong sum on the device"
    except Exception as exc:  # ImportError, missing libcuda/NVRTC, driver errors
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def gpu_gate() -> tuple[str, str] | None:
    """None when GPU tests can run; else ("skip" | "error", reason)."""
    problem = cupy_problem()
    if problem is None:
        return None
    if gpu_hardware_present():
        return "error", f"a GPU is present but CuPy cannot use it: {problem}"
    if gpu_required():
        return "error", f"STRATA_REQUIRE_GPU=1 but there is no usable GPU: {problem}"
    return "skip", f"needs a CUDA GPU (none on this machine: {problem})"


_GPU_ERROR = pytest.StashKey[str]()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    gate = gpu_gate()
    if gate is None:
        return
    kind, reason = gate
    if kind == "skip":
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
    else:
        config.stash[_GPU_ERROR] = reason


def pytest_runtest_setup(item):
    reason = item.config.stash.get(_GPU_ERROR, None)
    if reason is not None and item.get_closest_marker("gpu") is not None:
        pytest.fail(reason, pytrace=False)


FIXTURE_SKIP = "fixture not found: "  # the prefix of every missing-fixture skip, counted at the end of the run
FIXTURE_HOWTO = ("the fixtures live in the project's shared checkout: put it beside this clone as ../shared "
                 f"(expected at {DEFAULT_FIXTURES}), or set STRATA_FIXTURES to the qwen4exp-tiny directory; "
                 "the fixture directory's README.md says how its files were made")


def require_fixture(path: Path, what: str) -> Path:
    """path, or a skip naming it; a failure instead where the fixture must exist (fixtures_required())."""
    if path.exists():
        return path
    message = f"{FIXTURE_SKIP}{what} at {path} (set STRATA_FIXTURES)"
    if fixtures_required():
        pytest.fail(f"{message}; required here (CI=true or STRATA_REQUIRE_FIXTURES=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(autouse=True)
def _no_traceback_env(monkeypatch):
    """Every test sees the one-line error policy, whatever STRATA_TRACEBACK the calling shell has."""
    monkeypatch.delenv("STRATA_TRACEBACK", raising=False)


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """The shared qwen4exp-tiny fixture (GGUFs + transformers reference): $STRATA_FIXTURES or ../shared/..."""
    return require_fixture(Path(os.environ.get("STRATA_FIXTURES") or DEFAULT_FIXTURES), "qwen4exp-tiny fixture")


@pytest.fixture(scope="session")
def fixture_c_dir() -> Path:
    """The shared qwen4exp-tiny-c fixture (llama-quantize K-quant / i-quant files): beside the tiny fixture."""
    path = Path(os.environ.get("STRATA_FIXTURES") or DEFAULT_FIXTURES).parent / "qwen4exp-tiny-c"
    return require_fixture(path, "qwen4exp-tiny-c fixture (beside $STRATA_FIXTURES)")


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty $STRATA_CACHE for one test."""
    cache = tmp_path / "strata-cache"
    cache.mkdir()
    monkeypatch.setenv("STRATA_CACHE", str(cache))
    return cache


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Once per run: how many tests skipped for a missing fixture, and how to get it (a fresh clone has none)."""
    skipped = terminalreporter.stats.get("skipped", [])
    missing = [report for report in skipped if FIXTURE_SKIP in str(report.longrepr)]
    if missing:
        terminalreporter.write_sep("-", f"{len(missing)} tests skipped: a fixture is missing")
        terminalreporter.write_line(FIXTURE_HOWTO)
