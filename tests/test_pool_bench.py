"""bench/pool_bench.py end to end on a tiny geometry: every mode, page kind and an --ab build, each row checked
against numpy before timing, the coldness said, the summary printed, one JSON document last; bad options exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata_cli.tiers import native
from test_tiers_pool import needs_native

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), STRATA_POOL_THREADS="2")
    return subprocess.run([sys.executable, str(ROOT / "bench" / "pool_bench.py"), *args], capture_output=True,
                          text=True, env=env, timeout=600)


@needs_native
@pytest.mark.skipif("avx2" not in native.host_isas(), reason="the --ab build is the AVX2 one")
def test_sweep_writes_every_configuration(tmp_path):
    doc_path = tmp_path / "sweep.json"
    r = bench("--sweep", "--types", "Q4_0,Q2_K", "--gb", "0.002", "--layers", "2", "--hidden", "256", "--ff", "64",
              "--k", "2", "--ab", "avx2", "--pages", "4k,file", "--iters", "1", "--rounds", "1",
              "--file-dir", str(tmp_path), "--json", str(doc_path))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    doc = json.loads(lines[-1])
    assert json.loads(doc_path.read_text()) == doc
    assert "=== summary" in r.stdout and "a set comes back after" in r.stdout
    assert doc["threads"] == [1, 2] and set(doc["builds"]) == {"base", "avx2"}
    assert doc["builds"]["avx2"]["isa"] == "avx2" and doc["builds"]["avx2"]["perm"] == 0
    rows = doc["rows"]
    # per type and page kind: 2 thread counts x 4 modes of the base build and the --ab build's pool at 2 threads;
    # the --ab build at 1 thread on the first page kind only
    assert len(rows) == 2 * (2 * (2 * 4 + 1) + 1)
    assert {r["pages"] for r in rows if r["build"] != "base" and r["threads"] == 1} == {"4k"}
    assert {(r["type"], r["down_type"]) for r in rows} == {("Q4_0", "Q4_0"), ("Q2_K", "Q4_0")}
    for row in rows:
        assert row["rel_err"] <= 1e-4 and row["GB_s"] > 0 and row["T"] == 1
        assert ("prof_util" in row) == (row["mode"] != "read")
        if row["mode"] != "read":
            assert 0 < row["prof_util"] <= 1.0 + 1e-9 and row["prof_wake_us"] >= 0
        if doc["l3_bytes"]:  # the working set was raised until a cold set comes back after 3 x the L3
            assert row["reuse_MB"] * 1e6 >= 3 * doc["l3_bytes"]
    assert {r["pages"] for r in rows} == {"4k", "file"}
    assert not list(tmp_path.glob("pool_bench-*"))  # the file page kind's files are gone


@needs_native
def test_old_kernels_run_beside_the_base(tmp_path):
    """--old: another tree's kernels (here this tree's) built with the base's ISA, checked against numpy and timed in
    the same rounds as a build of its own"""
    doc_path = tmp_path / "old.json"
    r = bench("--types", "IQ2_XXS", "--gb", "0.002", "--layers", "2", "--hidden", "512", "--ff", "64", "--k", "2",
              "--threads", "2", "--tokens", "1", "--iters", "1", "--modes", "pool", "--old", str(ROOT / "kernels"),
              "--json", str(doc_path))
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(doc_path.read_text())
    assert set(doc["builds"]) == {"base", "old"} and doc["builds"]["old"]["isa"] == doc["builds"]["base"]["isa"]
    assert {row["build"] for row in doc["rows"]} == {"base", "old"}
    assert all(row["rel_err"] <= 1e-4 and row["GB_s"] > 0 for row in doc["rows"])


def test_bad_options_exit_2(tmp_path):
    for args in (["--pages", "bogus"], ["--modes", "pool,fast"], ["--threads", "0"], ["--types", "Q9_9"],
                 ["--ab", "not a define"], ["--old", str(tmp_path)]):
        r = bench(*args)
        assert r.returncode == 2, args
        assert r.stderr.strip().splitlines()[-1].startswith("pool_bench.py: error: ")
