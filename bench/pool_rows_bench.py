"""One core's rate of the CPU pool's gate/up kernel per block type, rows hot in L2 (no DRAM, no team): what a kernel
change does, apart from the memory and the threads that bench/pool_bench.py measures with it.

    python3 bench/pool_rows_bench.py IQ2_XXS,IQ3_XXS[,...] [--m 1] [--rows 640 --n 2560] [--ab NAME=V|ISA,...]
                                     [--old OTHER_TREE/kernels]

strata_rows_dots (the kernel as the pool takes it: the lane-order one where it serves m rows) on ROWS x N valid
random blocks of the type and m token rows, best of --reps x 10 calls; each build is checked against float64 first
(max |err| / max |ref| printed). --ab adds builds of this source with -D defines and/or another ISA; --old builds
another tree's kernels/expert_pool.c (a kernel before and after, interleaved on one machine)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from strata_cli.model import quants
from strata_cli.synth.blocks import random_tensor
from strata_cli.tiers import native

ISA_NAMES = [name for name, _, _ in native.ISAS]


def load_builds(args) -> dict:
    builds = {"base": native.load_variant((), isa=args.isa)}
    for spec in args.ab:
        parts = spec.split(",")
        isas = [p for p in parts if p in ISA_NAMES]
        builds[spec] = native.load_variant(tuple(p for p in parts if p not in isas), isa=isas[0] if isas else args.isa)
    if args.old:
        builds["old"] = native.load_variant((), isa=args.isa, kernels=Path(args.old))
    missing = [name for name, lib in builds.items() if lib is None]
    if missing:
        raise SystemExit(f"pool_rows_bench: cannot build {', '.join(missing)} (no compiler, or the ISA is not this CPU's)")
    return builds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("types", help="comma-separated GGML type names")
    ap.add_argument("--m", type=int, default=1, help="token rows a call (default 1)")
    ap.add_argument("--rows", type=int, default=640, help="weight rows (default 640: gate/up of Flash-Next)")
    ap.add_argument("--n", type=int, default=2560, help="weights a row (default 2560)")
    ap.add_argument("--ab", action="append", default=[], help="another build: NAME=VALUE defines and/or an ISA")
    ap.add_argument("--isa", choices=ISA_NAMES, default=None, help="the builds' ISA (default: the best this CPU runs)")
    ap.add_argument("--old", default=None, help="another tree's kernels/ folder, built as 'old'")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    by_name = {v: k for k, v in quants.TYPE_NAMES.items()}
    unknown = [t for t in args.types.split(",") if t not in by_name or by_name[t] not in native.native_types()]
    if unknown:
        raise SystemExit(f"pool_rows_bench: no pool kernel for {', '.join(unknown)}")
    builds = load_builds(args)
    rng = np.random.default_rng(0)
    for name in args.types.split(","):
        t = by_name[name]
        w = np.ascontiguousarray(random_tensor(rng, t, (args.rows, args.n), 0.05))
        x = rng.standard_normal((args.m, args.n)).astype(np.float32)
        dense = quants.dequantize(w, t).reshape(args.rows, args.n).astype(np.float64)
        ref = dense @ x.astype(np.float64).T  # rows x m
        cells = []
        for label, lib in builds.items():
            out = np.full((args.rows, args.m), np.nan, np.float32)
            call = (native.NATIVE_TYPES[name], w.ctypes.data, w.nbytes // args.rows, args.rows, args.n, x.ctypes.data,
                    args.m, 1, out.ctypes.data)
            if lib.strata_rows_dots(*call) != 0:
                raise SystemExit(f"pool_rows_bench: {label} refused {name} rows of {args.n}")
            err = float(np.abs(out - ref).max() / np.abs(ref).max())
            if not err <= 1e-4:
                raise SystemExit(f"pool_rows_bench: {label} {name} is wrong (max |err| / max |ref| {err:.1e})")
            best = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                for _ in range(10):
                    lib.strata_rows_dots(*call)
                best = min(best, (time.perf_counter() - t0) / 10)
            cells.append(f"{label} {w.nbytes / best / 1e9:6.2f} GB/s {best / args.rows * 1e9:7.1f} ns/row err {err:.1e}")
        print(f"{name:8s} m={args.m}  " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
