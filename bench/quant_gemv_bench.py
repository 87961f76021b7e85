"""GB/s of the routed-expert GEMVs per GGML block type on Flash-Next's expert shapes (512 experts of gate / up
[640 x 2560] and down [2560 x 640], top-10), T = 1, 2, 4, 8 window rows, against a measured device-to-device copy.

    python3 bench/quant_gemv_bench.py [--types Q4_K,IQ2_XS,...] [--window T ...] [--launches N] [--jobs J]
                                      [--paths tc,cuda] [--dense-windows T ...]

Per type, first the check: routed_experts (moe_group, gate + up in one launch, down, combine) on valid random
blocks of a few experts of the real shapes against ops/moe.routed_experts_raw (numpy over gguf.quants), as the max
error relative to the reference's largest value. Then the timing, on random bytes of all 512 experts (values do not
change the time: no data-dependent control flow; i-quant grid lookups stay random as in real files), each of the N
launches of one CUDA graph with its own routing (T rows of 10 distinct experts drawn at random, grouped by
moe_group before the capture), so the experts a launch reads are rarely still in the 50 MB L2:
  gateup   launch_moe.launch_gateup_experts: bytes = gate + up rows of the window's distinct experts
  down     the down projection (the type itself when 640 holds whole blocks, else Q4_0, as llama-quantize's
           files have it: the row names its down type); bytes = the distinct experts' down rows
  moe      launch_moe.routed_experts whole (group, gateup, down, combine); bytes = both
GB/s = bytes / time per launch; %copy = GB/s / the copy rate, where the copy rate is what cupy's device-to-device
copy of 2 GB reaches counting the bytes read and written (the bandwidth a streaming read can get).
--paths: the grouped expert kernel families timed (and checked) one after the other, each for every T whatever
launch_util.WINDOW_PATHS picks: tc = the tensor-core qtc_* kernels, cuda = qgemv_expert_* / qgemv_gateup_* (the
row's "path"); the pair per type and T is what WINDOW_PATHS' expert_tc is set from.
--dense-windows adds the dense GEMV (one ~512 MB matrix, 5120-wide rows) at those T.

Last line: one JSON document {"copy_gbs": ..., "rows": [{"type", "down_type", "T", "rel_err", "gateup_gbs",
"gateup_pct", "down_gbs", "down_pct", "moe_gbs", "moe_pct", "moe_us", "path"}, ...], "dense": [...], "seconds": ...}.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from gemv_bench import graph_ms
from warm_kernels import _compile

from strata_cli.gpu import launch_gemv, launch_moe
from strata_cli.gpu import launch_util as U
from strata_cli.gpu.graphs import new_stream
from strata_cli.gpu.quant_source import BASE, variant
from strata_cli.gpu.runtime import cupy
from strata_cli.model import quants as Q
from strata_cli.ops import moe as ref_moe
from strata_cli.synth.blocks import random_tensor

E, F, D, K = 512, 640, 2560, 10
CHECK_E, CHECK_T, CHECK_K = 6, 3, 2  # the reference check: a few experts of the real shapes
DEFAULT_TYPES = "Q8_0,Q4_0,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ2_XS,IQ3_XXS,IQ4_XS,MXFP4"
DENSE_N_IN, DENSE_MB = 5120, 512
PATHS = {"tc": U.WindowPath(fused_hc=False, gemv_tc=False, expert_tc=True),
         "cuda": U.WindowPath(fused_hc=False, gemv_tc=False, expert_tc=False)}


def copy_gbs() -> float:
    """Device-to-device copy rate of a 2 GB buffer, bytes read + written per second (GB/s)."""
    cp = cupy()
    n = 2 * 10**9
    src, dst = cp.ones(n, cp.uint8), cp.empty(n, cp.uint8)
    dst[...] = src
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(5):
        dst[...] = src
    end.record()
    end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end) / 5
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * n / ms / 1e6


def down_type(ggml_type: int) -> int:
    return ggml_type if F % Q.BLOCK[ggml_type][0] == 0 else Q.Q4_0


def check_rel_err(ggml_type: int, rng) -> float:
    """max |gpu - numpy| / max |numpy| of routed_experts on CHECK_E valid random experts of the real shapes."""
    types = (ggml_type, ggml_type, down_type(ggml_type))
    gate = random_tensor(rng, types[0], (CHECK_E, F, D), 0.05)
    up = random_tensor(rng, types[1], (CHECK_E, F, D), 0.05)
    down = random_tensor(rng, types[2], (CHECK_E, D, F), 0.05)
    x = rng.standard_normal((CHECK_T, D)).astype(np.float32)
    ids, w = ref_moe.router_topk(rng.standard_normal((CHECK_T, CHECK_E)).astype(np.float32), CHECK_K)
    want = ref_moe.routed_experts_raw(x, ids, w, gate, up, down, types)
    out = cupy().full((CHECK_T, D), np.nan, np.float32)
    got = launch_moe.routed_experts(*(cupy().asarray(a) for a in (x, ids, w, gate, up, down)), types, out=out).get()
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def _random_bytes(n: int):
    cp = cupy()
    return cp.random.randint(0, 256, size=n, dtype=cp.uint8)


def expert_times(ggml_type: int, windows, launches: int, stream, rng) -> list[dict]:
    """Per T: ms per launch of gateup, down and the whole routed_experts, and the bytes each reads."""
    cp = cupy()
    gt, dt = ggml_type, down_type(ggml_type)
    rb_gate, rb_down = Q.row_bytes(gt, D), Q.row_bytes(dt, F)
    gate = _random_bytes(E * F * rb_gate).reshape(E, F, rb_gate)
    up = _random_bytes(E * F * rb_gate).reshape(E, F, rb_gate)
    down = _random_bytes(E * D * rb_down).reshape(E, D, rb_down)
    gs, ds = F * rb_gate, D * rb_down
    rows = []
    for T in windows:
        J = T * K
        sets = []
        for _ in range(launches):
            ids_host = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
            ids = cp.asarray(ids_host)
            groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
            launch_moe.group_entries(ids, J, groups)
            sets.append((ids, groups, len(np.unique(ids_host))))
        n_distinct = sum(s[2] for s in sets) / launches
        x = cp.ones((T, D), cp.float32)
        wts = cp.full((T, K), 0.1, cp.float32)
        y = cp.empty((T, D), cp.float32)
        scratch = launch_moe.MoeScratch.empty(J, F, D)
        h, parts = scratch.h, scratch.parts
        turn = [0]

        def next_set():
            turn[0] += 1
            return sets[turn[0] % launches]

        def gateup(s):
            with U.on_stream(s):
                launch_moe.launch_gateup_experts((gate, gt, gs), (up, gt, gs), E, next_set()[1], J, T, x, K, h)

        def down_only(s):
            with U.on_stream(s):
                launch_moe.launch_expert_gemv(down, dt, ds, E, next_set()[1], J, T, h, 1, F, parts)

        def whole(s):
            launch_moe.routed_experts(x, next_set()[0], wts, gate, up, down, (gt, gt, dt), out=y, scratch=scratch,
                                      stream=s)

        times = {name: graph_ms(fn, launches, stream) for name, fn in
                 (("gateup", gateup), ("down", down_only), ("moe", whole))}
        nbytes = {"gateup": n_distinct * 2 * gs, "down": n_distinct * ds}
        nbytes["moe"] = nbytes["gateup"] + nbytes["down"]
        rows.append({"T": T, "ms": times, "bytes": nbytes})
    del gate, up, down
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def dense_gbs(ggml_type: int, T: int, launches: int, stream) -> float:
    cp = cupy()
    row_bytes = Q.row_bytes(ggml_type, DENSE_N_IN)
    n_out = max(32, (DENSE_MB * 10**6 // row_bytes) // 32 * 32)
    w = _random_bytes(n_out * row_bytes).reshape(n_out, row_bytes)
    x, y = cp.ones((T, DENSE_N_IN), cp.float32), cp.empty((T, n_out), cp.float32)
    split = launch_gemv.SplitK.empty()
    ms = graph_ms(lambda s: launch_gemv.gemv(w, ggml_type, DENSE_N_IN, x, out=y, split=split, stream=s), launches,
                  stream)
    del w
    return n_out * row_bytes / ms / 1e6


def warm(types, jobs: int) -> None:
    """Compile the modules the bench launches in parallel processes (CuPy's disk cache), before any timing."""
    mods = {"gemv.q8_0", "moe"} | {f"{BASE}.{variant(t)}" for t in types if t != Q.Q8_0}
    mods |= {f"{BASE}.{variant(down_type(t))}" for t in types if down_type(t) != Q.Q8_0}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(_compile, sorted(mods)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=DEFAULT_TYPES)
    ap.add_argument("--window", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--dense-windows", type=int, nargs="*", default=[])
    ap.add_argument("--paths", default="tc,cuda", help="expert kernel families: tc (qtc_*), cuda (qgemv_*)")
    args = ap.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        raise SystemExit(f"quant_gemv_bench: --paths: expected a list of {', '.join(PATHS)}, got '{args.paths}'")
    names = {Q.TYPE_NAMES[t]: t for t in Q.BLOCK_TYPES}
    unknown = [n for n in args.types.split(",") if n.strip() and n.strip().upper() not in names]
    if unknown:
        raise SystemExit(f"quant_gemv_bench: --types: unknown {', '.join(unknown)}")
    types = [names[n.strip().upper()] for n in args.types.split(",") if n.strip()]
    t0 = time.perf_counter()
    warm(types, args.jobs)
    print(f"# compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    stream = new_stream()
    rng = np.random.default_rng(0)
    copy = copy_gbs()
    print(f"# device-to-device copy {copy:.0f} GB/s (read + written)", flush=True)
    print(f"{'type':8} {'down':6} {'path':4} {'T':>2} {'rel_err':>8} {'gateup GB/s':>11} {'%':>5} {'down GB/s':>10} "
          f"{'%':>5} {'moe GB/s':>9} {'%':>5} {'moe us':>8}", flush=True)
    rows, dense = [], []
    for t in types:
        for path in paths:
            with U.recording_path(PATHS[path]):
                err = check_rel_err(t, rng)
                timed = expert_times(t, args.window, args.launches, stream, rng)
            for r in timed:
                gbs = {k: r["bytes"][k] / r["ms"][k] / 1e6 for k in r["ms"]}
                row = {"type": Q.TYPE_NAMES[t], "down_type": Q.TYPE_NAMES[down_type(t)], "T": r["T"], "rel_err": err,
                       "path": path}
                for k in ("gateup", "down", "moe"):
                    row[f"{k}_gbs"] = round(gbs[k], 1)
                    row[f"{k}_pct"] = round(100 * gbs[k] / copy, 1)
                row["moe_us"] = round(1000 * r["ms"]["moe"], 2)
                rows.append(row)
                print(f"{row['type']:8} {row['down_type']:6} {path:4} {r['T']:2} {err:8.1e} {gbs['gateup']:11.0f} "
                      f"{row['gateup_pct']:5.1f} {gbs['down']:10.0f} {row['down_pct']:5.1f} {gbs['moe']:9.0f} "
                      f"{row['moe_pct']:5.1f} {row['moe_us']:8.1f}", flush=True)
        for T in args.dense_windows:
            g = dense_gbs(t, T, args.launches, stream)
            dense.append({"type": Q.TYPE_NAMES[t], "T": T, "gbs": round(g, 1), "pct": round(100 * g / copy, 1)})
            print(f"# dense {Q.TYPE_NAMES[t]} T={T}: {g:.0f} GB/s ({100 * g / copy:.1f} %)", flush=True)
    print(json.dumps({"copy_gbs": round(copy, 1), "rows": rows, "dense": dense,
                      "shape": {"E": E, "F": F, "D": D, "K": K, "launches": args.launches},
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
