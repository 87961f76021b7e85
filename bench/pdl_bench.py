"""The window graph on programmatic edges (gpu/pdl.py, issue 18) against the same window on ordinary edges: one
engine, both graphs of each T captured from the same recording, their logits checked equal (bitwise), then timed
interleaved: --pairs rounds of -r windows each (CUDA-event ms of the window graph alone, after a context of -d
tokens, n_keep = 0 so every window sees the same state), the first of a pair alternating. Exit 1 when the logits
differ.

    python3 bench/pdl_bench.py MODEL [--window 1 2 8] [-r 30] [--pairs 3] [-d 256]

Last line: one JSON document {"model", "windows": [{"T", "nodes", "edges", "programmatic", "plain_ms", "pdl_ms",
"speedup", "pairs": [[plain_ms, pdl_ms], ...], "logits_equal"}]}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from strata_cli.engine.gpu import GPUEngine
from strata_cli.engine.gpu.window import record_window
from strata_cli.gpu.graphs import CapturedGraph
from strata_cli.model.gguf_file import open_model

MODES = ("plain", "pdl")


def graphs_of(eng, T: int) -> dict[str, CapturedGraph]:
    """The T-row window graph on ordinary edges and on programmatic ones (the engine's own)."""
    return {"plain": CapturedGraph(lambda s: record_window(eng, T, s), eng.stream, programmatic=False),
            "pdl": eng.graph(T)}


def logits_of(eng, graph, tokens, pos: int) -> np.ndarray:
    eng.graphs[len(tokens)] = graph
    return eng.run(tokens, pos).logits


def time_pairs(eng, graphs, tokens, reps: int, pairs: int) -> list[tuple[float, float]]:
    """(plain, pdl) median ms of each pair of rounds, the mode run first alternating."""
    timer = eng.window_only_timer(profile=False)
    out = []
    for p in range(pairs):
        med = {}
        for mode in (MODES if p % 2 == 0 else MODES[::-1]):
            eng.graphs[len(tokens)] = graphs[mode]
            times = [timer(eng, tokens, eng.n_past, 0)[0] for _ in range(reps + 2)]
            med[mode] = statistics.median(times[2:])  # the first two: the mode's graph cold
        out.append((med["plain"], med["pdl"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--window", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("-r", "--repetitions", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("-d", "--depth", type=int, default=256)
    args = ap.parse_args()
    model = open_model(args.model)
    eng = GPUEngine(model)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.geometry.n_vocab, args.depth + max(args.window))
    for pos in range(0, args.depth, eng.max_t):  # the context, committed eagerly
        n = min(eng.max_t, args.depth - pos)
        eng.run(tokens[pos:pos + n], pos, eager=True, logits=False)
        eng.commit(n, eager=True)
    rows, ok = [], True
    print(f"{'T':>3} {'nodes':>6} {'edges':>6} {'prog':>6} {'plain ms':>9} {'pdl ms':>9} {'speedup':>8}  "
          "pairs (plain/pdl)")
    for T in args.window:
        window = tokens[args.depth:args.depth + T]
        graphs = graphs_of(eng, T)
        summary = graphs["pdl"].summary()
        logits = {mode: logits_of(eng, graphs[mode], window, eng.n_past) for mode in MODES}
        equal = bool(np.array_equal(logits["plain"], logits["pdl"], equal_nan=True))
        ok &= equal
        pairs = time_pairs(eng, graphs, window, args.repetitions, args.pairs)
        plain, pdl = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        rows.append({"T": T, "nodes": summary.nodes, "edges": summary.edges, "programmatic": summary.programmatic,
                     "plain_ms": plain, "pdl_ms": pdl, "speedup": plain / pdl, "pairs": pairs,
                     "logits_equal": equal})
        spread = " ".join(f"{a:.3f}/{b:.3f}" for a, b in pairs)
        print(f"{T:>3} {summary.nodes:>6} {summary.edges:>6} {summary.programmatic:>6} {plain:>9.3f} {pdl:>9.3f} "
              f"{plain / pdl:>8.3f}  {spread}" + ("" if equal else "  LOGITS DIFFER "
              f"(max |diff| {np.nanmax(np.abs(logits['plain'] - logits['pdl'])):.3g})"))
        eng.graphs[T] = graphs["pdl"]  # the engine destroys it at close; the plain one here
        graphs["plain"].destroy()
    eng.close()
    print(json.dumps({"model": args.model, "windows": rows}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
