"""Q8_0_R32 dense GEMVs on Qwen3.8-Flash-Next's shapes: the CUDA-core kernels (tensor_cores=False) against the
tensor-core kernels of T >= 2 (tensor_cores=True, kernels/gemv_q8r.cu), time per launch inside a graph and x floor.

    python3 bench/gemv_tc_bench.py [--window T ...] [--launches N] [--variant DEPTH:ROWS:MINB ...]

Each (shape, T, path) is a graph of N back-to-back launches replayed (bench/gemv_bench.py's graph_ms); the floor is
a device-to-device copy of the weight bytes in the same way. --variant sweeps Q8T_DEPTH (blocks of loads in flight
per warp on the tensor-core path), Q8T_ROWS (row groups of 32 per warp) and Q8T_MIN_BLOCKS (launch bounds);
2:2:1 is the kernel file's default. Weights are constant bytes (values do not change the time); the correctness of
both paths is tests/test_gpu_q8r.py's.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gemv_bench import SHAPES, graph_ms, use_defines  # noqa: E402

import strata_cli.gpu.compile as compile_mod  # noqa: E402
from strata_cli.gpu import launch_gemv  # noqa: E402
from strata_cli.gpu import launch_util as U  # noqa: E402
from strata_cli.gpu.graphs import new_stream  # noqa: E402
from strata_cli.gpu.runtime import cupy  # noqa: E402
from strata_cli.model.packed import Q8_0_R32  # noqa: E402


DEFAULT = "2:2:1"  # Q8T_DEPTH:Q8T_ROWS:Q8T_MIN_BLOCKS of kernels/gemv_q8r.cu: that module is the one the tests compiled (cached)


def use_variant(variant: str, plain=compile_mod.module, plain_rows=U.Q8T_LANE_ROWS) -> None:
    """The kernel file's default module, else one compiled with -DQ8T_DEPTH / -DQ8T_ROWS / -DQ8T_MIN_BLOCKS (the
    launcher's rows per warp follow)."""
    depth, rows, min_blocks = (int(v) for v in variant.split(":"))
    if variant == DEFAULT:
        compile_mod.module = plain
        compile_mod.kernel.cache_clear()
        U.Q8T_LANE_ROWS = plain_rows
    else:
        use_defines([f"-DQ8T_DEPTH={depth}", f"-DQ8T_ROWS={rows}", f"-DQ8T_MIN_BLOCKS={min_blocks}"])
        U.Q8T_LANE_ROWS = rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--variant", nargs="+", default=[DEFAULT])
    args = ap.parse_args()
    cp = cupy()
    stream = new_stream()
    t0 = time.perf_counter()
    weights = {name: cp.full(n_out * n_in // 32 * 34, 0x11, cp.uint8) for name, n_out, n_in in SHAPES}
    xs = {(n_in, T): cp.ones((T, n_in), cp.float32) for (_, _, n_in), T in itertools.product(SHAPES, args.window)}
    ys = {(n_out, T): cp.empty((T, n_out), cp.float32) for (_, n_out, _), T in itertools.product(SHAPES, args.window)}
    split = launch_gemv.SplitK.empty()
    floor = {}
    for name, n_out, n_in in SHAPES:
        src, dst = weights[name], cp.empty_like(weights[name])
        floor[name] = graph_ms(lambda s: dst.data.copy_from_device_async(src.data, src.nbytes, s), args.launches,
                               stream)
    print(f"setup {time.perf_counter() - t0:.1f} s", flush=True)
    paths = [("cuda", False, DEFAULT)] + [(f"tc {v}", True, v) for v in args.variant]
    times = {}
    for label, tensor_cores, variant in paths:
        use_variant(variant)
        for (name, n_out, n_in), T in itertools.product(SHAPES, args.window):
            w, x, y = weights[name], xs[(n_in, T)], ys[(n_out, T)]
            times[(label, name, T)] = graph_ms(
                lambda s: launch_gemv.gemv(w, Q8_0_R32, n_in, x, out=y, split=split, stream=s,
                                           tensor_cores=tensor_cores), args.launches, stream)
        print(f"{label} done {time.perf_counter() - t0:.1f} s", flush=True)
    use_variant(DEFAULT)
    labels = [p[0] for p in paths]
    print("\nus per launch (x copy floor):  shape T  " + "  ".join(f"{lb:>14s}" for lb in labels) + "  floor")
    for (name, _, _), T in itertools.product(SHAPES, args.window):
        cells = "  ".join(f"{times[(lb, name, T)] * 1e3:7.1f} ({times[(lb, name, T)] / floor[name]:4.1f}x)"
                          for lb in labels)
        print(f"  {name:11s} T={T:<2} {cells}  {floor[name] * 1e3:6.1f}")
    for T in args.window:
        tot = {lb: sum(times[(lb, n, T)] for n, _, _ in SHAPES) for lb in labels}
        print(f"  all shapes T={T}: " + "  ".join(f"{lb} {tot[lb] * 1e3:.1f} us" for lb in labels) +
              f"  floor {sum(floor.values()) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
