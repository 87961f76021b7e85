"""bench/soak.py on the GPU, on the tiny fixture with its experts tiered (a VRAM cache of 3 slots, half the misses over
PCIe): the soak with refills (memory sampled on the device, the PCIe share on, the last window equal to a fresh
engine's replay), and SIGINT / SIGTERM into a tiered verify-bench's windows (exit 128 + signal, nothing left of the
child on the host or among the GPU's compute apps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("--expert-cache", "3", "--pcie-frac", "0.5")


def run_soak(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), *args], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.stdout.strip(), f"bench/soak.py printed nothing (rc {r.returncode}): {r.stderr[-2000:]}"
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == (0 if doc["ok"] else 1), r.stderr[-2000:]
    return doc


def test_soak_of_a_tiered_engine(fixture_dir):
    doc = run_soak(str(fixture_dir / "model-q8_0.gguf"), *TIERS, "--windows", "300", "--window", "4", "--depth",
                   "8", "--ctx", "96", "--warmup", "20", "--sample-every", "40")
    # cudaMemGetInfo counts the whole device: the suite's other workers allocate beside this soak
    assert set(doc["failed"]) <= {"gpu_used_flat"}, doc
    assert doc["device"] == "gpu" and doc["windows"] == 300 and doc["refills"] >= 3 and doc["pcie_frac"] == 0.5
    assert doc["pcie_share_mean"] > 0 and doc["cpu_share_mean"] > 0 and doc["watchdog_releases"] == 0
    assert doc["pool_used_flat"] and doc["rss_flat"] and doc["gpu_used_mb"]["first"] > 0
    assert doc["last_window_rel_err"] <= 1e-4 and doc["same_ids"] is True


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_a_signal_in_tiered_windows_leaves_nothing(fixture_dir, sig):
    doc = run_soak(str(fixture_dir / "model-q8_0.gguf"), *TIERS, "--window", "4", "--signal", sig, "--after", "3")
    assert doc["ok"] is True, doc
    assert doc["rc"] == 128 + getattr(signal, f"SIG{sig}") and doc["built_s"] is not None
    assert doc["group_left"] == [] and doc["gpu_pid_left"] in (False, None) and not doc["traceback"]
