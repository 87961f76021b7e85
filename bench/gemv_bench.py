"""Packed Q8_0 GEMV variants on Qwen3.8-Flash-Next's shapes: time per launch inside a graph, and GB/s.

    python3 bench/gemv_bench.py [--window T ...] [--launches N]

Each (shape, T) is captured as a graph of N back-to-back launches (node gaps included, as in the window graph)
and replayed; a device-to-device copy of the same bytes, also N to a graph, gives the floor. Compile-time variants
(Q8R_INFLIGHT group-blocks of loads in flight per warp) and the split heuristics are swept; the MoE rows
time moe_group + the three grouped expert GEMVs + combine for 512 experts, top-10, random routing.
Weights are constant bytes (values do not change the time).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time

import numpy as np

import strata_cli.gpu.compile as compile_mod
from strata_cli.gpu import launch_gemv, launch_moe
from strata_cli.gpu import launch_util as U
from strata_cli.gpu.graphs import CapturedGraph, new_stream
from strata_cli.gpu.runtime import cupy
from strata_cli.model.packed import Q8_0_R32

SHAPES = [("head", 248320, 2560), ("gdn_qkv", 10240, 2560), ("gdn_z", 6144, 2560), ("out", 2560, 6144),
          ("hc_down", 320, 10240), ("hc_up", 10240, 320), ("shexp_up", 640, 2560), ("shexp_down", 2560, 640),
          ("attn_k", 512, 2560), ("attn_q", 12288, 2560)]
DEFINES: list[str] = []


@functools.lru_cache(maxsize=None)
def _module(name: str, defines: tuple):
    cp = cupy()
    src = compile_mod.kernels_dir()
    code = (src / f"{name}.cu").read_text()
    options = (f"-arch={compile_mod.device_arch()}", "--std=c++17", f"-I{src}", *defines)
    mod = cp.RawModule(code=code, options=options)
    mod.compile()
    return mod


def use_defines(defines: list[str]) -> None:
    DEFINES[:] = defines
    compile_mod.module = lambda name: _module(name, tuple(DEFINES))
    compile_mod.kernel.cache_clear()  # kernel() looks functions up once; look them up in the new module


def graph_ms(record, launches: int, stream) -> float:
    cp = cupy()
    # inputs made on another stream are complete first: `stream` is non-blocking, so it does not wait for the legacy
    # default stream's work (quant_gemv_bench's warm-up once read moe_group's outputs before they were written)
    cp.cuda.Device().synchronize()
    record(stream)  # eager warm-up (compiles and loads the kernels before the capture)
    stream.synchronize()
    graph = CapturedGraph(lambda s: [record(s) for _ in range(launches)], stream)
    graph.launch(stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(3):
        graph.launch(stream)
    end.record(stream)
    end.synchronize()
    graph.destroy()
    return cp.cuda.get_elapsed_time(start, end) / (3 * launches)


def dense_times(windows, launches, stream, weights, xs, ys):
    out = {}
    split = launch_gemv.SplitK.empty()  # the z-split workspace, allocated before any capture
    for (name, n_out, n_in), T in itertools.product(SHAPES, windows):
        w, x, y = weights[name], xs[(n_in, T)], ys[(n_out, T)]
        out[(name, T)] = graph_ms(lambda s: launch_gemv.gemv(w, Q8_0_R32, n_in, x, out=y, split=split, stream=s),
                                  launches, stream)
    return out


def moe_times(windows, launches, stream, experts, rng):
    cp = cupy()
    out = {}
    E, F, D, K = 512, 640, 2560, 10
    for T in windows:
        ids = cp.asarray(np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32))
        wts = cp.full((T, K), 0.1, cp.float32)
        x = cp.ones((T, D), cp.float32)
        y = cp.empty((T, D), cp.float32)
        scratch = launch_moe.MoeScratch.empty(T * K, F, D)
        out[("moe", T)] = graph_ms(lambda s: launch_moe.routed_experts(
            x, ids, wts, *experts, (Q8_0_R32,) * 3, out=y, scratch=scratch, stream=s), launches, stream)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--launches", type=int, default=20)
    args = ap.parse_args()
    cp = cupy()
    stream = new_stream()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    weights = {name: cp.full(n_out * n_in // 32 * 34, 0x11, cp.uint8) for name, n_out, n_in in SHAPES}
    experts = [cp.full(512 * 640 * 2560 // 32 * 34, 0x11, cp.uint8).reshape(512, r, -1) for r in (640, 640, 2560)]
    xs = {(n_in, T): cp.ones((T, n_in), cp.float32) for (_, _, n_in), T in itertools.product(SHAPES, args.window)}
    ys = {(n_out, T): cp.empty((T, n_out), cp.float32) for (_, n_out, _), T in itertools.product(SHAPES, args.window)}
    xs.update({(640, T): cp.ones((T, 640), cp.float32) for T in args.window})
    floor = {}
    for name, n_out, n_in in SHAPES:
        src, dst = weights[name], cp.empty_like(weights[name])
        floor[name] = graph_ms(lambda s: dst.data.copy_from_device_async(src.data, src.nbytes, s), args.launches,
                               stream)
    print(f"setup {time.perf_counter() - t0:.1f} s; copy floor per shape (us): " +
          ", ".join(f"{n} {floor[n] * 1e3:.1f}" for n, _, _ in SHAPES), flush=True)

    variants = [[f"-DQ8R_INFLIGHT={d}"] for d in (2, 4, 8)]
    results = {}
    for defines in variants:
        use_defines(defines)
        t = dense_times(args.window, args.launches, stream, weights, xs, ys)
        t.update(moe_times(args.window, 5, stream, experts, rng))
        results[" ".join(defines)] = t
        total = {T: sum(v for (n, tt), v in t.items() if tt == T and n not in ("head", "moe")) for T in args.window}
        print(f"{' '.join(defines):28s} " + "  ".join(
            f"T={T}: layers {total[T] * 1e3:6.1f} us head {t[('head', T)] * 1e3:6.1f} moe {t[('moe', T)] * 1e3:6.1f}"
            for T in args.window), flush=True)
    best = min(results, key=lambda k: sum(results[k].values()))
    print(f"\nbest kernel variant: {best}")
    use_defines(best.split())
    for target, min_blocks, max_z in itertools.product((2048, 8192, 16384), (2, 4), (8,)):
        U.Q8R_TARGET_WARPS, U.Q8R_MIN_BLOCKS = target, min_blocks
        if max_z == 1:
            U.GEMV_MAX_ZSPLIT = 1
        else:
            U.GEMV_MAX_ZSPLIT = 8
        t = dense_times(args.window, args.launches, stream, weights, xs, ys)
        t.update(moe_times(args.window, 5, stream, experts, rng))
        print(f"target {target:5d} min_blocks {min_blocks} max_z {max_z}: " + "  ".join(
            f"T={T}: " + " ".join(f"{n} {t[(n, T)] * 1e3:.1f}" for n in [s[0] for s in SHAPES] + ["moe"])
            for T in args.window), flush=True)
    U.GEMV_MAX_ZSPLIT = 8
    print("\nper shape, best variant, default split (us; GB/s):")
    t = results[best]
    for (name, n_out, n_in), T in itertools.product(SHAPES, args.window):
        gb = n_out * n_in / 32 * 34 / 1e9
        print(f"  {name:11s} T={T:<2} {t[(name, T)] * 1e3:8.1f} us  {gb / t[(name, T)] * 1e3:7.0f} GB/s  "
              f"(copy {floor[name] * 1e3:.1f} us)")


if __name__ == "__main__":
    main()
