"""bench/soak.py on the CPU (issue 17's load test): the soak on the numpy engine over the tiny fixture (windows with
commits, refills, samples, the last window against a fresh engine's replay, one JSON document last), its flat rule,
that the replay comparison can fail, the signals check against a `strata verify-bench --device cpu` child (exit
status 128 + signal, nothing left of its process group), the process-group scan, and the no-GPU exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOAK = ROOT / "bench" / "soak.py"


@pytest.fixture
def soak_mod(monkeypatch):
    monkeypatch.syspath_prepend(str(SOAK.parent))
    sys.modules.pop("soak", None)
    import soak

    return soak


def run_soak(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    return subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_soak_on_the_numpy_engine(fixture_dir, tmp_path):
    out = tmp_path / "soak.json"
    r = run_soak(str(fixture_dir / "model-q8_0.gguf"), "--device", "cpu", "--windows", "40", "--window", "4",
                 "--depth", "6", "--ctx", "40", "--warmup", "4", "--sample-every", "10", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip(), f"bench/soak.py printed nothing (rc {r.returncode}): {r.stderr[-2000:]}"
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    full = json.loads(out.read_text())
    assert {k: v for k, v in full.items() if k != "samples"} == doc
    assert doc["ok"] is True and doc["failed"] == [] and doc["error"] is None
    assert doc["windows"] == doc["windows_asked"] == 40
    assert doc["watchdog_releases"] == 0 and doc["released"] is None
    assert doc["refills"] >= 2  # the context of 40 cells refilled as time_window does
    assert doc["last_window_rel_err"] <= 1e-4 and doc["same_ids"] is True
    assert doc["replayed_windows"] >= 2 and 6 <= doc["replayed_tokens"] <= 40
    assert set(doc["rss_mb"]) == {"first", "last", "max"} and doc["rss_flat"] is True
    assert doc["gpu_used_mb"] is None and doc["ms_median_first100"] > 0 and doc["ms_median_last100"] > 0
    windows = [s["window"] for s in full["samples"]]
    assert windows == [4, 14, 24, 34, 40]  # the baseline after the warm-up, every 10, the last
    assert all(s["rss_mb"] > 0 and s["watchdog_releases"] == 0 for s in full["samples"])
    assert sum(line.startswith("soak: window ") for line in r.stderr.splitlines()) == len(windows)


def test_the_flat_rule(soak_mod):
    assert soak_mod.flat([100.0, 150.0, 164.0]) == (True, 64.0)
    assert soak_mod.flat([100.0, 165.0, 120.0])[0] is False  # the largest sample counts, not the last
    assert soak_mod.flat([10000.0, 10100.0]) == (True, 100.0)  # 1 % of the first above 64 MB
    assert soak_mod.flat([10000.0, 10101.0])[0] is False


def test_the_replay_tells_a_different_history(soak_mod, fixture_dir):
    """The fresh engine's check can fail: a replay that misses one committed window gives another last window."""
    from strata_cli.analysis.window_timing import TokenStream, prefill
    from strata_cli.engine import make_engine
    from strata_cli.model.gguf_file import open_model

    model = open_model(fixture_dir / "model-q8_0.gguf")
    rng = np.random.default_rng(3)
    stream = TokenStream(rng, model.geometry.n_vocab)
    with make_engine(model, "cpu", n_ctx=64) as engine:
        rec = soak_mod.Recorder(engine)
        prefill(rec, 5, stream, 4)
        timer = engine.window_timer()
        for n_keep in (2, 1, 3):
            tokens = stream.take(3)
            rec.log(tokens, n_keep)
            timer(engine, tokens, engine.n_past, n_keep)
        last_tokens = stream.take(3)
        last = engine.run(last_tokens, engine.n_past)
    assert [k for _, k in rec.segment] == [4, 1, 2, 1, 3]  # the prefill's windows of 4 and 1, then the timed ones
    with make_engine(model, "cpu", n_ctx=64) as fresh:
        same = soak_mod.replay(fresh, rec.segment, last_tokens)
        assert soak_mod.rel_err(last.logits, same.logits) <= 1e-6 and np.array_equal(last.ids, same.ids)
        missing = soak_mod.replay(fresh, rec.segment[:2] + rec.segment[3:], last_tokens)
    assert soak_mod.rel_err(last.logits, missing.logits) > 1e-4


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_signals_check_against_a_cpu_verify_bench(fixture_dir, sig):
    r = run_soak(str(fixture_dir / "model-q8_0.gguf"), "--device", "cpu", "--window", "2", "--signal", sig,
                 "--after", "1.5")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    want = 128 + getattr(signal, f"SIG{sig}")
    assert doc["ok"] is True and doc["running_at_signal"] is True
    assert doc["rc"] == doc["rc_expected"] == want and doc["exit_s"] < 30 and not doc["traceback"]
    assert doc["group_left"] == [] and "verify-bench" in doc["command"] and "-r 1000000" in doc["command"]


def test_group_members_finds_a_session_and_its_children(soak_mod):
    child = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(soak_mod.group_members(child.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = soak_mod.group_members(child.pid)
        assert child.pid in members and len(members) >= 3  # sh and both sleeps
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 10
    while soak_mod.group_members(child.pid) and time.monotonic() < deadline:  # the sleeps are reaped by init
        time.sleep(0.05)
    assert soak_mod.group_members(child.pid) == []


def test_without_a_gpu_the_soak_exits_2_in_one_line(fixture_dir):
    from strata_cli.engine import gpu_probe

    if gpu_probe()[1] is None:
        pytest.skip("a GPU is usable here")
    r = run_soak(str(fixture_dir / "model-q8_0.gguf"), "--windows", "3")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("soak: no GPU here")


def test_a_window_that_fails_ends_the_soak_with_ok_false(soak_mod, fixture_dir, monkeypatch):
    """A released engine (or any failed window) stops the loop: the document says where and why, and ok is false."""
    from strata_cli.tiers.host import EngineReleased

    real_build = soak_mod.build

    def build(args, pcie_frac=None):
        model, tiers, engine = real_build(args, pcie_frac)
        timer, calls = engine.window_timer(), []

        def failing(*a):
            calls.append(1)
            if len(calls) == 5:
                raise EngineReleased("window 5 stalled at layer 0; released")
            return timer(*a)

        monkeypatch.setattr(engine, "window_timer", lambda eager=False: failing)
        return model, tiers, engine

    monkeypatch.setattr(soak_mod, "build", build)
    args = soak_mod.parse([str(fixture_dir / "model-q8_0.gguf"), "--device", "cpu", "--windows", "10", "--window",
                           "2", "--depth", "4", "--warmup", "2", "--sample-every", "2"])
    doc = soak_mod.soak(args)
    assert doc["ok"] is False and doc["windows"] == 4 and "EngineReleased: window 5 stalled" in doc["error"]
    assert "error" in doc["failed"] and "windows" in doc["failed"] and doc["last_window_rel_err"] is None
    assert doc["samples"][-1]["window"] == 4
