"""GPU time per kernel (and launch shape) of one eager verify window: where a window's time goes.

    python3 bench/profile_kernels.py MODEL [--window T ...] [--context N] [--no-pack]

Every kernel launch is bracketed by CUDA events on the engine's stream; the table sums them per
(kernel, grid) so that, e.g., the head GEMV stands apart from the layers' GEMVs.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from benchlib import patch_kernels
from strata_cli.gpu.runtime import cupy
from strata_cli.analysis.window_timing import TokenStream, prefill

RECORDS: list = []


class TimedKernel:
    def __init__(self, name, k):
        self.name, self.k = name, k
        self.kernel = k.kernel

    def __call__(self, grid, block, args, **kw):
        cp = cupy()
        stream = kw.get("stream") or cp.cuda.get_current_stream()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        self.k(grid, block, args, **kw)
        end.record(stream)
        RECORDS.append((self.name, tuple(grid), start, end))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--window", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-pack", action="store_true", help="keep Q8_0 matrices raw (no Q8_0_R32 repacking)")
    args = ap.parse_args()
    patch_kernels(lambda module, function, k: TimedKernel(function, k))
    from strata_cli.engine.gpu import GPUEngine
    from strata_cli.model.gguf_file import open_model

    eng = GPUEngine(open_model(args.model), pack_q8=not args.no_pack)
    rng = np.random.default_rng(0)
    for T in args.window:
        prefill(eng, args.context, TokenStream(rng, eng.g.n_vocab), chunk=16)
        for _ in range(2):  # warm, then measure
            RECORDS.clear()
            eng.run(rng.integers(0, eng.g.n_vocab, T), eng.n_past, eager=True, logits=False)
            eng.commit(0)
        eng.stream.synchronize()
        totals, counts = defaultdict(float), defaultdict(int)
        for name, grid, start, end in RECORDS:
            key = f"{name} grid={grid}"
            totals[key] += cupy().cuda.get_elapsed_time(start, end)
            counts[key] += 1
        total = sum(totals.values())
        print(f"\nT={T}: {len(RECORDS)} launches, {total:.3f} ms of kernel time")
        for key, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {ms:8.3f} ms  {counts[key]:4d}x  {ms / counts[key] * 1e3:8.1f} us each  {key}")


if __name__ == "__main__":
    main()
