"""Shared fixtures: the qwen4exp-tiny fixture directory, a private strata cache, and the GPU auto-skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURES = REPO.parent / "shared" / "fixtures" / "qwen4exp-tiny"


def _gpu_missing() -> str | None:
    """Why GPU tests cannot run here, or None when they can. CuPy is imported only if a gpu test was collected."""
    try:
        import cupy

        if not cupy.is_available():
            return "cupy.is_available() is False (no usable CUDA device)"
    except Exception as exc:  # ImportError, missing libcuda/NVRTC, driver errors: all mean no GPU here
        return f"cupy not usable: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _gpu_missing()
    if reason is not None:
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """The shared qwen4exp-tiny fixture (GGUFs + transformers reference): $STRATA_FIXTURES or ../shared/..."""
    path = Path(os.environ.get("STRATA_FIXTURES") or DEFAULT_FIXTURES)
    if not path.is_dir():
        pytest.skip(f"qwen4exp-tiny fixture not found at {path} (set STRATA_FIXTURES)")
    return path


@pytest.fixture(scope="session")
def fixture_c_dir() -> Path:
    """The shared qwen4exp-tiny-c fixture (llama-quantize K-quant / i-quant files): beside the tiny fixture."""
    path = Path(os.environ.get("STRATA_FIXTURES") or DEFAULT_FIXTURES).parent / "qwen4exp-tiny-c"
    if not path.is_dir():
        pytest.skip(f"qwen4exp-tiny-c fixture not found at {path} (set STRATA_FIXTURES to its sibling)")
    return path


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty $STRATA_CACHE for one test."""
    cache = tmp_path / "strata-cache"
    cache.mkdir()
    monkeypatch.setenv("STRATA_CACHE", str(cache))
    return cache
