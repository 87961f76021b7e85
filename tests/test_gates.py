"""The skip/error gates of conftest.py: a missing GPU skips, a broken GPU stack or a required one errors."""

from __future__ import annotations

import os

import conftest
import pytest


@pytest.mark.parametrize("problem, hardware, required, want", [
    (None, True, False, None),
    (None, False, True, None),
    ("ImportError: no cupy", False, False, "skip"),
    ("ImportError: no cupy", False, True, "error"),
    ("CUDARuntimeError: cudaErrorInsufficientDriver", True, False, "error"),
    ("CUDARuntimeError: cudaErrorInsufficientDriver", True, True, "error"),
])
def test_gpu_gate(monkeypatch, problem, hardware, required, want):
    monkeypatch.setattr(conftest, "cupy_problem", lambda: problem)
    monkeypatch.setattr(conftest, "gpu_hardware_present", lambda: hardware)
    monkeypatch.setenv("STRATA_REQUIRE_GPU", "1" if required else "0")
    gate = conftest.gpu_gate()
    assert (gate and gate[0]) == want
    if gate:
        assert problem in gate[1]


@pytest.mark.parametrize("env, required", [({}, False), ({"CI": "true"}, True),
                                           ({"STRATA_REQUIRE_FIXTURES": "1"}, True), ({"CI": "false"}, False)])
def test_missing_fixture_skips_or_fails(monkeypatch, tmp_path, env, required):
    for key in ("CI", "STRATA_REQUIRE_FIXTURES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="fixture not found: a fixture at"):
        conftest.require_fixture(tmp_path / "absent", "a fixture")
    assert conftest.require_fixture(tmp_path, "a fixture") == tmp_path


def test_missing_fixture_skips_are_counted_once_with_the_way_to_get_them(tmp_path):
    """A fresh clone (no ../shared): the run ends with one line counting the fixture skips and one saying how to
    get the fixtures, whatever the number of skipped tests."""
    import subprocess
    import sys

    env = dict(os.environ, STRATA_FIXTURES=str(tmp_path / "absent"))
    for key in ("CI", "STRATA_REQUIRE_FIXTURES"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_quantize.py::test_quantize_reproduces_the_converter", "tests/test_quantize.py::"
                           "test_quantize_from_bf16_is_readable"], cwd=conftest.REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("3 tests skipped: a fixture is missing") == 1, proc.stdout
    assert proc.stdout.count("set STRATA_FIXTURES to the qwen4exp-tiny directory") == 1, proc.stdout
