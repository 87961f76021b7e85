"""The host gather alone (strata_cli/tiers/gather.gather_rows: an adaptive cache's fills without a PCIe share, and until
e8f2295 the PCIe share's staging): GB/s of expert bytes copied from a mapping into a staging buffer, per way and
thread count, cold by construction.

    python3 bench/gather_bench.py [--gb 2] [--experts 3,32] [--threads N[,N...]] [--iters 20]

Source: --gb GB of anonymous memory (written first: no page faults timed) as experts of Flash-Next's full-size
projections (Q2_K gate / up 640 x 2560 = 537,600 bytes, Q4_0 down 2560 x 640 = 921,600); each iteration gathers the
next disjoint set of --experts experts (a permutation: a set comes back only after all others), all three projections,
into one destination buffer (as a step fills its group's staging; pinned memory on the device writes at the same
rate). --experts 3 is about a T = 1 step's PCIe share at 0.25-0.5 (K = 8-10 misses a layer), 32 a T = 8 step's.
Ways: `take` numpy's take on this thread (the path without the native library), `native` strata_gather on the
calling thread's OpenMP team at each fixed --threads count, `sized` the engine's path: the whole team offered, of which
tiers/gather.gather_threads uses what the bytes call for (its threads column shows that count). Each result is checked
against numpy's take before it is timed. GB/s = the median over iterations. Last line: one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from strata_cli.tiers.gather import gather_rows, gather_threads
from strata_cli.tiers import native

PROJ_BYTES = (537_600, 537_600, 921_600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--experts", default="3,32")
    ap.add_argument("--threads", default=None, help="comma list (default 1 and every core this process may use)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    threads = sorted({int(t) for t in args.threads.split(",")}) if args.threads else sorted({1, cores})
    per = sum(PROJ_BYTES)
    n_exp = max(64, int(args.gb * 1e9 / per))
    srcs = [np.empty((n_exp, b), np.uint8) for b in PROJ_BYTES]
    rng = np.random.default_rng(0)
    for s in srcs:
        s[:] = rng.integers(0, 256, s.shape[1], dtype=np.uint8)[None, :]
        s[:, :8] = np.arange(n_exp, dtype=np.uint64).view(np.uint8).reshape(n_exp, 8)  # rows differ
    lib = native.load()
    # (way, lib, threads, size_by_bytes): `native` at each fixed count, `sized` the engine's path (the whole team,
    # of which gather_threads takes what the bytes call for)
    ways = [("take", None, 1, False)] + ([("native", lib, t, False) for t in threads] + [("sized", lib, cores, True)]
                                         if lib is not None else [])
    perm = rng.permutation(n_exp)
    rows, pos = [], 0
    print(f"gather: {n_exp} experts of {per / 1e6:.2f} MB ({n_exp * per / 1e9:.2f} GB), {cores} cores")
    print(f"{'way':>8} {'threads':>7} {'experts':>7} {'MB/call':>8} {'GB/s':>7}")
    for n in (int(e) for e in args.experts.split(",")):
        outs = [np.zeros((n, b), np.uint8) for b in PROJ_BYTES]
        for name, lib, t, sized in ways:
            check = perm[:n]
            gather_rows(lib, t, outs, srcs, check, size_by_bytes=sized)
            for out, src in zip(outs, srcs):
                np.testing.assert_array_equal(out, src[check])
            times = []
            for _ in range(args.iters):
                if pos + n > n_exp:
                    pos = 0
                experts = perm[pos:pos + n].astype(np.intp)
                pos += n
                t0 = time.perf_counter()
                gather_rows(lib, t, outs, srcs, experts, size_by_bytes=sized)
                times.append(time.perf_counter() - t0)
            gbs = n * per / 1e9 / statistics.median(times)
            t = gather_threads(t, n * per) if sized else t
            rows.append(dict(way=name, threads=t, experts=n, mb=n * per / 1e6, GB_s=round(gbs, 2)))
            print(f"{name:>8} {t:>7} {n:>7} {n * per / 1e6:>8.1f} {gbs:>7.2f}")
    print(json.dumps({"cores": cores, "rows": rows}))


if __name__ == "__main__":
    main()
