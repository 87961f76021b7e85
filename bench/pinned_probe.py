"""Would page-locked experts let the PCIe share gain? (issue 17 item 2: the copy engine reading page-locked memory.)

    python3 bench/pinned_probe.py [--gb 8] [--threads N] [--k 10] [--tokens 1] [--iters 6] [--piece-mb 2]

Today's PCIe share gathers each step's experts from the mapped file into pinned staging on the pool's cores, and
loses to the pool alone at every share (the gather and the pool share the host's cores and DRAM). If the experts
the share may send lived in page-locked memory, the copy engine would read them itself and the host cores would
only run the pool. This measures, on the released file's expert types (Q2_K gate/up, Q4_0 down, the real shapes),
what that needs and what it gives:

  pin     the cost of page-locking: cudaHostRegister of --gb of experts on 2 MB pages (already faulted in), and
          cudaHostAlloc of the same size, in GB/s (extrapolate to the ~46 GB a cache-0 engine would pin)
  pool    the pool alone on those experts (the engine's calls: k experts a layer, --tokens rows, cold rotation), GB/s,
          before and after the registration (page-locked memory must not slow the pool)
  dma     the copy engine alone: cudaMemcpyAsync of --piece-mb pieces (an expert is ~2 MB) from the registered
          experts to the device, GB/s
  both    the two at once (a thread keeps the copy engine busy while the pool runs): each one's GB/s and their sum,
          against the pool alone: the PCIe share can gain only if the sum is well above the pool alone

The last line is one JSON document with every figure. Needs a CUDA device (the tier host's runtime).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from types import SimpleNamespace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS: as bench/pool_bench.py, why there

import numpy as np  # noqa: E402

import pool_bench  # bench/pool_bench.py (python3 bench/pinned_probe.py puts bench/ on the path)
from strata_cli.gpu.runtime import check, cudart
from strata_cli.model import quants
from strata_cli.tiers import native
from strata_cli.tiers.pool import default_threads


def register(ptr: int, nbytes: int) -> float:
    rt = cudart()
    t0 = time.perf_counter()
    check(rt.cudaHostRegister(ptr, nbytes, rt.cudaHostRegisterPortable), "cudaHostRegister")
    return time.perf_counter() - t0


def host_alloc_seconds(nbytes: int) -> float:
    rt = cudart()
    t0 = time.perf_counter()
    ptr = check(rt.cudaHostAlloc(nbytes, rt.cudaHostAllocPortable), "cudaHostAlloc")
    dt = time.perf_counter() - t0
    check(rt.cudaFreeHost(ptr), "cudaFreeHost")
    return dt


class CopyLoad:
    """A thread that keeps the copy engine busy: pieces of the registered region [base, base + nbytes) to a device
    buffer, walking the region, one stream sync every `batch` copies; bytes and seconds while it runs."""

    def __init__(self, base: int, nbytes: int, piece: int, batch: int = 64):
        rt = cudart()
        self.base, self.nbytes, self.piece, self.batch = base, nbytes, piece, batch
        self.dev = check(rt.cudaMalloc(piece * batch), "cudaMalloc")
        self.stream = check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        # a blocking-sync event: the thread sleeps while its copies run (a spinning stream sync took a core from the
        # pool's team: on 2026-12-02 the pool beside it fell from 38 to 0.7 GB/s, every barrier waiting for the
        # descheduled thread), as the engine's copy thread sleeps between its steps
        self.done = check(rt.cudaEventCreateWithFlags(rt.cudaEventBlockingSync | rt.cudaEventDisableTiming),
                          "cudaEventCreateWithFlags")
        self.stop = threading.Event()
        self.bytes, self.seconds = 0, 0.0
        self.device = check(rt.cudaGetDevice(), "cudaGetDevice")

    def _run(self) -> None:
        rt = cudart()
        check(rt.cudaSetDevice(self.device), "cudaSetDevice")
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        at, t0 = 0, time.perf_counter()
        while not self.stop.is_set():
            for b in range(self.batch):
                if at + self.piece > self.nbytes:
                    at = 0
                check(rt.cudaMemcpyAsync(self.dev + b * self.piece, self.base + at, self.piece, kind, self.stream),
                      "cudaMemcpyAsync")
                at += self.piece
            check(rt.cudaEventRecord(self.done, self.stream), "cudaEventRecord")
            check(rt.cudaEventSynchronize(self.done), "cudaEventSynchronize")
            self.bytes += self.piece * self.batch
        self.seconds = time.perf_counter() - t0

    def run_for(self, seconds: float) -> float:
        self.start()
        time.sleep(seconds)
        return self.finish()

    def start(self) -> None:
        self.bytes, self.seconds = 0, 0.0
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, name="pinned-probe-copy")
        self.thread.start()

    def finish(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

    def close(self) -> None:
        rt = cudart()
        check(rt.cudaEventDestroy(self.done), "cudaEventDestroy")
        check(rt.cudaFree(self.dev), "cudaFree")
        check(rt.cudaStreamDestroy(self.stream), "cudaStreamDestroy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--piece-mb", type=float, default=2.0)
    ap.add_argument("--layers", type=int, default=48)
    args = ap.parse_args()
    threads = args.threads or default_threads()
    lib = native.load()
    if lib is None:
        raise SystemExit("pinned_probe: the native pool library did not build")
    bench_args = SimpleNamespace(ff=640, hidden=2560, layers=args.layers, k=args.k, gb=args.gb, pages=["huge"],
                                 file_dir=None, tokens=[args.tokens])
    l3 = pool_bench.pool_memory.l3_bytes()
    tb = pool_bench.TypeBench("Q2_K", bench_args, l3)
    assert tb.types == (quants.Q2_K, quants.Q2_K, quants.Q4_0)
    errs = tb.check_builds({"base": lib}, [threads])
    arena = tb.models["huge"].arena
    base, nbytes = arena.base.ctypes.data, arena.nbytes
    out = {"threads": threads, "gb": nbytes / 1e9, "k": args.k, "T": args.tokens, "rel_err": errs["base"]}

    def pool_gbs() -> float:
        res = tb.run("huge", "pool", lib, threads, args.tokens, args.iters)
        return float(np.median(res["GB_s"]))

    out["pool_pageable_GB_s"] = pool_gbs()
    out["register_s"] = register(base, nbytes)
    out["register_GB_s"] = nbytes / out["register_s"] / 1e9
    out["pool_pinned_GB_s"] = pool_gbs()
    copy = CopyLoad(base, nbytes, int(args.piece_mb * 2**20))
    out["dma_GB_s"] = copy.run_for(3.0)
    copy.start()
    t0 = time.perf_counter()
    out["both_pool_GB_s"] = pool_gbs()
    out["both_seconds"] = time.perf_counter() - t0
    out["both_dma_GB_s"] = copy.finish()
    out["both_sum_GB_s"] = out["both_pool_GB_s"] + out["both_dma_GB_s"]
    copy.close()
    check(cudart().cudaHostUnregister(base), "cudaHostUnregister")
    out["host_alloc_s"] = host_alloc_seconds(nbytes)
    out["host_alloc_GB_s"] = nbytes / out["host_alloc_s"] / 1e9
    tb.models["huge"].close()
    print(f"pinned_probe: {out['gb']:.1f} GB of Q2_K+Q4_0 experts, {threads} threads, k {args.k}, T {args.tokens}")
    print(f"  pin: cudaHostRegister {out['register_s']:.2f} s ({out['register_GB_s']:.1f} GB/s), cudaHostAlloc "
          f"{out['host_alloc_s']:.2f} s ({out['host_alloc_GB_s']:.1f} GB/s)")
    print(f"  pool alone: pageable {out['pool_pageable_GB_s']:.1f} GB/s, page-locked {out['pool_pinned_GB_s']:.1f}")
    print(f"  copy engine alone: {out['dma_GB_s']:.1f} GB/s ({args.piece_mb:g} MB pieces)")
    print(f"  both at once: pool {out['both_pool_GB_s']:.1f} + copy {out['both_dma_GB_s']:.1f} = "
          f"{out['both_sum_GB_s']:.1f} GB/s (pool alone {out['pool_pinned_GB_s']:.1f})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
