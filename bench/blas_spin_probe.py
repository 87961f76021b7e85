"""Does numpy's BLAS team slow the CPU pool's next calls? The pool's calls (bench/pool_bench.py's TypeBench, one
type, T = 1) right after a float64 matmul, against the same calls after a sleep, a few times each: their GB/s and
the mean / max wake (until the pool team's last thread started).

    OPENBLAS_NUM_THREADS=N python3 bench/blas_spin_probe.py [--type Q4_0] [--threads N] [--repeats 3]

OpenBLAS spins its threads on every core for a while after each call; the pool's OpenMP team then waits for cores
(dev box, 2 threads, 2026-12-03: wake 362 / 175 / 7 us after the matmul in three repeats, 5-8 us after a sleep;
7-18 us either way with OPENBLAS_NUM_THREADS=1). This is why bench/pool_bench.py runs with one BLAS thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

# as the caller gave it: pool_bench (imported below) sets it to 1 by default, after numpy's OpenBLAS has read it here
BLAS_THREADS = os.environ.get("OPENBLAS_NUM_THREADS", "- (OpenBLAS's default: every core)")
import numpy as np  # noqa: E402  first: OpenBLAS takes OPENBLAS_NUM_THREADS from the caller's environment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pool_bench  # noqa: E402

from strata_cli.tiers import native  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="Q4_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    lib = native.load()
    if lib is None:
        raise SystemExit("blas_spin_probe: no native pool here (no C compiler)")
    shape = SimpleNamespace(ff=640, hidden=2560, gb=0.5, layers=8, k=10, pages=["anon"], file_dir=None)
    bench = pool_bench.TypeBench(args.type, shape, 32 << 20)
    a = np.random.default_rng(0).random((600, 600))
    print(f"OPENBLAS_NUM_THREADS={BLAS_THREADS}, pool threads {args.threads}")
    for _ in range(args.repeats):
        for label in ("after a matmul", "after 0.5 s sleep"):
            if label == "after a matmul":
                float((a @ a).sum())
            else:
                time.sleep(0.5)
            r = bench.run("anon", "pool", lib, args.threads, 1, args.iters)
            prof = pool_bench.mean_of(r["profile"])
            print(f"  {label:18s} {statistics.median(r['GB_s']):6.2f} GB/s  wake {prof['wake_us']:6.1f} us "
                  f"(max {prof['wake_max_us']:6.1f})")


if __name__ == "__main__":
    main()
