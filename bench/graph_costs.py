"""Where a captured verify window's time goes, measured inside graphs (no event per kernel, no Python gaps).

    python3 bench/graph_costs.py MODEL [--window T ...] [--context N] [--reps N] [--no-pack]

For every kernel function in the window graph, the graph is recaptured with that function's launches left out
and replayed; the difference from the full graph is what those nodes cost, their launch gaps included. Left-out
kernels leave stale (valid) data behind, so the outputs are meaningless and only the times count.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchlib import patch_kernels
from strata_cli.gpu.runtime import cupy
from strata_cli.analysis.window_timing import TokenStream, prefill

SKIP: set[str] = set()


def skippable(module, function, k):
    """The kernel, or a no-op while its function is in SKIP."""
    def launch(grid, block, args, **kw):
        if function not in SKIP:
            k(grid, block, args, **kw)
    return launch


def replay_ms(eng, T: int, reps: int) -> float:
    cp = cupy()
    graph = eng.graph(T)
    for _ in range(3):
        graph.launch(eng.stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(eng.stream)
    for _ in range(reps):
        graph.launch(eng.stream)
    end.record(eng.stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


def recapture(eng, T: int) -> None:
    eng.graphs.pop(T).destroy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--window", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-pack", action="store_true")
    args = ap.parse_args()
    patch_kernels(skippable)
    from strata_cli.engine.gpu import GPUEngine
    from strata_cli.model.gguf_file import open_model

    eng = GPUEngine(open_model(args.model), pack_q8=not args.no_pack)
    rng = np.random.default_rng(0)
    for T in args.window:
        prefill(eng, args.context, TokenStream(rng, eng.g.n_vocab), chunk=16)
        eng.run(rng.integers(0, eng.g.n_vocab, T), eng.n_past, logits=False)
        summary = eng.graph(T).summary()
        base = replay_ms(eng, T, args.reps)
        rows = []
        for name, count in summary.kinds:
            if name in ("memcpy", "memset", "host", "empty"):
                continue
            SKIP.clear()
            SKIP.add(name)
            recapture(eng, T)
            rows.append((base - replay_ms(eng, T, args.reps), count, name))
        SKIP.clear()
        recapture(eng, T)
        print(f"\nT={T}: window graph {base:.3f} ms, {summary.nodes} nodes; cost of each kernel's nodes "
              f"(graph without them vs with):")
        for saved, count, name in sorted(rows, reverse=True):
            print(f"  {saved:7.3f} ms  {count:4d} nodes  {saved / count * 1e3:7.1f} us/node  {name}")
        print(f"  {sum(r[0] for r in rows):7.3f} ms  in all")


if __name__ == "__main__":
    main()
