"""bench/cache_policy.sh's summary (bench/cache_policy_lib.py) from sample outputs of its runs: every row of the
table, the rows whose runs were cut, failed, skipped, stopped or never started saying so; and the script itself end
to end on the numpy engine with a few tokens (its table from the real commands' CSV)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import cache_policy_lib as lib  # noqa: E402

SIZES, POLICIES = ["12GiB", "24GiB"], ["static", "lru", "lfu"]
CACHE_LINE = ("expert cache: 24576 of 24576 (layer, expert) pairs in VRAM (45.70 GiB, 100.0%; --expert-cache auto, "
              "no profile: expert id order); 138.2 GiB free before loading -> zero-doorbell graph")


def _bench_csv(ms1, ms8, hit1, hit8, swaps=0.0, fill=0.0, late=0.0, gather_ms=0.0) -> str:
    head = ("window,repetitions,ms_median,ms_mean,vram_share,cpu_share,swaps,fill_mb,fill_late,fill_gather_ms,"
            "expert_policy")
    return (f"{head}\n1,8,{ms1},{ms1},{hit1},{1 - hit1},{swaps / 2},{fill / 2},{late},{gather_ms},x\n"
            f"8,8,{ms8},{ms8},{hit8},{1 - hit8},{swaps},{fill},{late / 2},{gather_ms * 2},x\n")


@pytest.fixture
def work(tmp_path):
    files = {
        "profile.err": f"load: dense weights uploaded in 3.1 s\n{CACHE_LINE}\nrouting 2048 tokens\n",
        "profile.rc": "0 60", "held.rc": "0 48", "held.err": CACHE_LINE + "\n",
        "slots.out": "size,slots\n12GiB,3412\n24GiB,6825\n", "slots.rc": "0 15",
        "sim.out": ("policy,slots,hit_rate,copied_bytes_per_window,swaps_per_window\n"
                    "static,3412,0.181,0,0\nstatic,6825,0.352,0,0\nlru,3412,0.402,1000000,12.5\n"
                    "lru,6825,0.611,900000,10\nlfu,3412,0.391,800000,9\nlfu,6825,0.6,700000,8\n"), "sim.rc": "0 15",
        "info.out": "slots,share,coverage,holdout_hit\n3412,0.14,0.5,0.181\n6825,0.28,0.7,0.352\n", "info.rc": "0 15",
        "bench-12GiB-static.out": _bench_csv(39.9, 129.0, 0.17, 0.19, late=0.5, gather_ms=8.25),
        "bench-12GiB-static.rc": "0 42",
        "bench-12GiB-lru.out": "window,ms_median\n", "bench-12GiB-lru.rc": "124 42",  # cut: a header only
        "bench-24GiB-static.out": "", "bench-24GiB-static.rc": "1 42",
        "bench-24GiB-static.err": "load: ...\nstrata: error: out of memory allocating 24 GiB\n",
        "bench-24GiB-lru.rc": "skipped", "bench-24GiB-lfu.rc": "stopped",
        "bench-24GiB-lfu.out": _bench_csv(30.0, 80.0, 0.5, 0.5),  # a stopped run's rows are not trusted either
    }  # bench-12GiB-lfu: never started (no .rc)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _row(lines, *cells):
    hits = [line for line in lines if line.startswith("| " + " | ".join(cells) + " |")]
    assert len(hits) == 1, (cells, lines)
    return [c.strip() for c in hits[0].strip("|").split("|")]


def test_table_from_sample_outputs(work):
    lines = lib.table(work, SIZES, POLICIES)
    assert lines[0] == f"make-profile (training tokens): ok; {CACHE_LINE}"
    assert "zero-doorbell graph" in lines[1] and lines[2] == "cache-sim: ok; profile-info --holdout: ok"
    assert _row(lines, "12GiB", "3412", "static") == ["12GiB", "3412", "static", "18.1%", "17.0%", "19.0%", "39.90",
                                                      "129.00", "0.00", "0.00", "0.50", "8.25", "ok"]
    assert _row(lines, "12GiB", "3412", "lru")[3:] == ["40.2%", "-", "-", "-", "-", "-", "-", "-", "-",
                                                       "cut at its 42 s limit"]
    assert _row(lines, "12GiB", "3412", "lfu")[-1] == "not run (an earlier run failed, or the step was stopped)"
    assert _row(lines, "24GiB", "6825", "static")[-1] == \
        "failed (rc 1): strata: error: out of memory allocating 24 GiB"
    assert _row(lines, "24GiB", "6825", "lru")[-1] == "skipped (no time left in the budget)"
    stopped = _row(lines, "24GiB", "6825", "lfu")
    assert stopped[-1] == "stopped while it ran (the step's limit or a signal)" and stopped[3] == "60.0%"
    assert _row(lines, "12GiB", "3412", "18.1%") == ["12GiB", "3412", "18.1%", "18.1%", "yes"]
    assert _row(lines, "24GiB", "6825", "35.2%") == ["24GiB", "6825", "35.2%", "35.2%", "yes"]


def test_table_says_what_is_missing(work):
    (work / "info.out").write_text("slots,share,coverage,holdout_hit\n3412,0.14,0.5,0.2\n")
    for name in ("slots.out", "slots.rc", "profile.err"):
        (work / name).unlink()
    lines = lib.table(work, SIZES, POLICIES)
    assert lines[0].startswith("make-profile (training tokens): ok; (no expert cache line")
    assert _row(lines, "12GiB", "-", "static")[3] == "-"  # without the slot counts nothing matches the sim rows
    (work / "slots.out").write_text("size,slots\n12GiB,3412\n24GiB,6825\n")
    lines = lib.table(work, SIZES, POLICIES)
    assert _row(lines, "12GiB", "3412", "18.1%")[-1] == "NO (-1.90e-02)"
    assert _row(lines, "24GiB", "6825", "35.2%")[-2:] == ["-", "-"]
    (work / "bench-12GiB-static.out").write_text(_bench_csv(1, 2, 0.1, 0.1).splitlines()[0] + "\n1,8,1,1,0,1,0,0,x\n")
    assert _row(lib.table(work, SIZES, POLICIES), "12GiB", "3412", "static")[-1] == \
        "no T = 1 / T = 8 rows in its output"


def test_main_refuses_bad_arguments(capsys):
    assert lib.main([]) == 2 and "usage" in capsys.readouterr().err
    assert lib.main(["table", "x"]) == 2 and "3 arguments, got 1" in capsys.readouterr().err


def test_the_script_end_to_end_on_the_numpy_engine(fixture_dir, tmp_path):
    """DEVICE=cpu, a few tokens: every run ends, the table has each size's numpy rows (no hit rates: no tiers) and
    cache-sim's static hit rate equals profile-info's; the script exits 0."""
    model = fixture_dir / "model-q8_0.gguf"
    env = dict(os.environ, FN=str(model), DEVICE="cpu", SIZES="300KB,1MB", POLICIES="static,lru", STEP_LIMIT_S="300",
               TRAIN_TOKENS="48", HELD_TOKENS="40", DEPTH="16", REPS="2", OUT=str(tmp_path), PYTHONPATH=str(ROOT))
    res = subprocess.run(["bash", str(ROOT / "bench" / "cache_policy.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    lines = res.stdout.splitlines()
    for size, slots in (("300KB", "11"), ("1MB", "38")):  # 26112 bytes an expert
        for policy in ("static", "lru"):
            row = _row(lines, size, slots, policy)
            assert row[-1] == "ok" and row[4] == "-" and float(row[6]) > 0 and float(row[7]) > 0, row
        sim_static = _row(lines, size, slots, "static")[3]
        assert _row(lines, size, slots, sim_static)[-1] == "yes"
    assert (tmp_path / "cache_policy.log").read_text().count("## summary") == 1
