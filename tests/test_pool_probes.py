"""bench/pool_rows_bench.py and bench/core_probe.py end to end on this machine's CPUs: the builds checked against
float64 before they are timed, one line a type, another tree's kernels built
beside this one's; the core probe's JSON names every CPU it ran on; bad input one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_tiers_pool import needs_native

ROOT = Path(__file__).resolve().parent.parent


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          env=env, timeout=600)


@needs_native
def test_rows_bench_checks_and_times_each_build():
    r = run("pool_rows_bench.py", "IQ2_XXS,Q4_0", "--rows", "24", "--n", "768", "--m", "2", "--reps", "2",
            "--old", str(ROOT / "kernels"))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["IQ2_XXS", "Q4_0"]
    for line in lines:
        assert "m=2" in line and " base " in line and " old " in line and "GB/s" in line
        errs = [float(part.split("err ")[1].split()[0]) for part in line.split("|")]
        assert len(errs) == 2 and all(0 <= e <= 1e-4 for e in errs)


def test_rows_bench_refuses_an_unknown_type():
    r = run("pool_rows_bench.py", "Q9_9")
    assert r.returncode != 0 and r.stderr.strip().splitlines() == ["pool_rows_bench: no pool kernel for Q9_9"]


@needs_native
def test_core_probe_runs_on_every_cpu():
    r = run("core_probe.py", "--type", "Q4_0", "--seconds", "0.05")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    cpus = sorted(os.sched_getaffinity(0))
    assert doc["cpus"] == cpus and len(doc["every_GB_s"]) == len(cpus)
    assert set(doc["beside_GB_s"]) == {str(c) for c in cpus[1:]}
    assert doc["alone_GB_s"] > 0 and all(v > 0 for v in doc["every_GB_s"])


def test_core_probe_refuses_bad_input():
    r = run("core_probe.py", "--type", "Q9_9")
    assert r.returncode != 0 and r.stderr.strip().splitlines() == ["core_probe: no pool kernel for Q9_9"]
    r = run("core_probe.py", "--seconds", "0")
    assert r.returncode != 0 and r.stderr.strip().splitlines() == ["core_probe: --seconds must be positive, not 0.0"]
