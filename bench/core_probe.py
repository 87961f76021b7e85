"""Which of this machine's CPUs share a core: the pool's gate/up kernel (compute-bound, rows hot in L2) run on one
CPU alone, then on CPU 0 beside each other CPU, then on all of them at once, each thread pinned. A CPU whose
company halves CPU 0's rate is its SMT sibling (a VM's vCPUs can be hyperthreads of fewer cores even where lscpu
says one thread a core), and the all-CPU rate a thread is what a compute-bound pool type can reach at full team.

    python3 bench/core_probe.py [--type IQ2_XXS] [--seconds 0.5]

One JSON document last: per-thread GB/s alone, beside each CPU, and at every CPU."""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from strata_cli.model import quants
from strata_cli.synth.blocks import random_tensor
from strata_cli.tiers import native


def run_on(lib, cpus: list[int], work: list, seconds: float) -> list[float]:
    """GB/s each worker reached, one forked process pinned to each CPU in cpus, all starting at one instant (processes,
    not threads: a thread of this interpreter needs the GIL between two calls, and sixteen of them serialized there)"""
    t_start = time.time() + 0.2
    readers = []
    for i, cpu in enumerate(cpus):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            os.sched_setaffinity(0, {cpu})
            call, nbytes = work[i]
            while time.time() < t_start:
                pass
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                lib.strata_rows_dots(*call)
                n += 1
            os.write(w, repr(n * nbytes / (time.perf_counter() - t0) / 1e9).encode())
            os._exit(0)
        os.close(w)
        readers.append(r)
    rates = []
    for r in readers:
        with os.fdopen(r) as f:
            rates.append(float(f.read()))
    for _ in cpus:
        os.wait()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="IQ2_XXS")
    ap.add_argument("--seconds", type=float, default=0.5)
    args = ap.parse_args()
    if args.type not in native.NATIVE_TYPES:
        raise SystemExit(f"core_probe: no pool kernel for {args.type}")
    if args.seconds <= 0:
        raise SystemExit(f"core_probe: --seconds must be positive, not {args.seconds}")
    lib = native.load()
    if lib is None:
        raise SystemExit("core_probe: no native pool library (no compiler?)")
    cpus = sorted(os.sched_getaffinity(0))
    t = native.NATIVE_TYPES[args.type]
    rng = np.random.default_rng(0)
    work, keep = [], []
    for _ in cpus:  # each thread its own rows and x (no shared lines)
        w = np.ascontiguousarray(random_tensor(rng, t, (640, 2560), 0.05))
        x = rng.standard_normal((1, 2560)).astype(np.float32)
        out = np.zeros((640, 1), np.float32)
        keep.append((w, x, out))
        work.append(((t, w.ctypes.data, w.nbytes // 640, 640, 2560, x.ctypes.data, 1, 1, out.ctypes.data), w.nbytes))
    alone = run_on(lib, [cpus[0]], work, args.seconds)[0]
    beside = {}
    for c in cpus[1:]:
        r = run_on(lib, [cpus[0], c], work, args.seconds)
        beside[c] = r
    every = run_on(lib, cpus, work, args.seconds)
    print(f"{args.type} ({lib.isa}): CPU {cpus[0]} alone {alone:.2f} GB/s")
    for c, (r0, rc) in beside.items():
        flag = "  <- shares a core" if r0 < 0.7 * alone else ""
        print(f"  beside CPU {c:3d}: {r0:.2f} / {rc:.2f}{flag}")
    print(f"  all {len(cpus)} CPUs: {np.mean(every):.2f} GB/s a thread (min {min(every):.2f}), {sum(every):.1f} in all")
    print(json.dumps({"type": args.type, "isa": lib.isa, "cpus": cpus, "alone_GB_s": alone,
                      "beside_GB_s": {str(c): r for c, r in beside.items()}, "every_GB_s": every}))


if __name__ == "__main__":
    main()
