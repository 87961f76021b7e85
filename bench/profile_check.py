"""Device check of the stage profile (issue 11), in one process so the kernels compile once.

    python3 bench/profile_check.py OUT_DIR [MAIN_ROOT]

1. `strata profile` (JSON) on the fixture q8_0 for T = 1 and 8; 2. node counts of the normal and profiling window
graphs, and of the normal graph built from MAIN_ROOT's code (unchanged?); 3. the gpu tests of the profile;
4. `strata profile --per-layer` on a Flash-Next-width 2-layer Q8_0 model made in /tmp (64 experts); then a short
table: stamps against the event-timed windows, what the stamps cost, the window's bandwidth floor and x floor, and
the least and most x floor of the stages reading over 1 MB.
Env: STRATA_FIXTURES (the qwen4exp-tiny fixture), FN2 (where to write the 2-layer model, default /tmp/fn2.gguf).
On a bare machine the first `strata profile` also compiles every kernel (over 100 s on the H200, once: CuPy
caches the cubins); allow ~4 minutes for the whole script there, ~1.5 once the cache is warm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from strata_cli.cli import main

OUT = Path(sys.argv[1])
MAIN_ROOT = sys.argv[2] if len(sys.argv) > 2 else None
FIXTURE = Path(os.environ["STRATA_FIXTURES"]) / "model-q8_0.gguf"
FN2 = Path(os.environ.get("FN2", "/tmp/fn2.gguf"))
T0 = time.time()
OUT.mkdir(parents=True, exist_ok=True)
results: list[tuple[str, int, dict]] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f} s] {msg}", flush=True)


def strata(*args: str) -> str:
    res = CliRunner().invoke(main, [str(a) for a in args])
    if res.exit_code:
        import traceback

        traceback.print_exception(res.exc_info[1]) if res.exc_info else None
        raise RuntimeError(f"strata {' '.join(map(str, args))} failed ({res.exit_code}): {res.stderr}")
    return res.stdout


def step(fn, *args, **kwargs) -> None:
    """One check; a failure is logged and the next check still runs (one device call)."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported, then the next step
        log(f"FAILED {fn.__name__}{args}: {type(exc).__name__}: {exc}")


def profile(name: str, model: Path, T: int, per_layer: bool) -> None:
    args = ["profile", model, "--window", T, "--windows", 100, "--context", 64, "--format", "json"]
    text = strata(*args, *(["--per-layer"] if per_layer else []))
    (OUT / f"profile-{name}-t{T}.json").write_text(text)
    doc = json.loads(text)
    meta = doc["meta"]
    # the stage farthest below its floor among those reading > 1 MB (under 0.9x: bytes overcounted, or the copy
    # rate is off) and the one farthest above it (where the window wastes the most time per byte)
    big = [r for r in doc["rows"] if r["layer"] == "all" and r["bytes"] and r["bytes"] > 1e6]
    meta["min_x_floor"] = min((r["x_floor"], r["stage"]) for r in big) if big else None
    meta["max_x_floor"] = max((r["x_floor"], r["stage"]) for r in big) if big else None
    results.append((name, T, meta))
    log(f"profile {name} T={T} done")


for T in (1, 8):
    step(profile, "fixture", FIXTURE, T, per_layer=True)

nodes = {}


def count_nodes() -> None:
    from strata_cli.engine.gpu import GPUEngine
    from strata_cli.model.gguf_file import open_model

    eng = GPUEngine(open_model(FIXTURE))
    for T in (1, 8):
        nodes[f"normal T={T}"] = eng.graph(T).summary().nodes
        nodes[f"profile T={T}"] = eng.graph(T, profile=True).summary().nodes
        nodes[f"stamps T={T}"] = len(eng.profile_plans[T].slots)
        if MAIN_ROOT:
            env = dict(os.environ, PYTHONPATH=f"{MAIN_ROOT}:/tmp/site")
            done = subprocess.run([sys.executable, "-m", "strata_cli", "graph-nodes", str(FIXTURE), "--window",
                                   str(T), "--format", "json"], cwd=MAIN_ROOT, env=env, capture_output=True, text=True)
            nodes[f"main normal T={T}"] = (json.loads(done.stdout)["meta"]["nodes"] if done.returncode == 0
                                           else done.stderr[-300:])
    log(f"nodes {nodes}")


step(count_nodes)

import pytest  # noqa: E402

rc = pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_gpu_profile.py", "tests/test_stage_timing.py",
                  "tests/test_stage_bytes.py",
                  "tests/test_gpu_engine.py::test_graph_replay_equals_eager",
                  "tests/test_gpu_engine.py::test_graph_summaries"])
log(f"pytest exit {rc}")

if not FN2.exists():
    step(strata, "make-model", FN2, "--preset", "flash-next", "--layers", 2, "--experts", 64, "--ngram-vocab", 1000,
         "--type", "Q8_0", "--seed", 0)
    log("fn2 written")
for T in (1, 8):
    step(profile, "fn2", FN2, T, per_layer=True)

print("model   T  event ms  stamped ms  unaccounted  normal ms  stamps  stamp cost  floor ms  x floor  "
      "min / max x floor of the stages > 1 MB")
for name, T, m in results:
    print(f"{name:7s} {T:2d} {m['event_ms']:9.4f} {m['stamped_ms']:11.4f} {m['unaccounted_share'] * 100:10.2f} % "
          f"{m['normal_ms_median']:9.4f} {m['stamps']:7d} {m['profile_ms_median'] / m['normal_ms_median'] - 1:+9.1%}  "
          f"{m['floor_ms']:8.4f} {m['x_floor']:8.1f}  {m['min_x_floor']} / {m['max_x_floor']}")
print("nodes", nodes, "pytest", rc)
