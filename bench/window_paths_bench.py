"""The window's two launch paths (launch_util.WINDOW_PATHS) against each other at every T: ms per window graph
(median of CUDA-event times over -r windows after a context of -d tokens), the dense Q8_0_R32 GEMVs on CUDA cores
("unfused") vs on tensor cores ("fused"; the names of the columns as before), and which one the table picks. Checks the table on a device and file.

    python3 bench/window_paths_bench.py MODEL [--window 1 2 4 8] [-r 30] [-d 256]

Last line: one JSON document {"model", "windows": [{"T", "unfused_ms", "fused_ms", "table"}]}.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics

import numpy as np

from strata_cli.engine.gpu import GPUEngine
from strata_cli.gpu.launch_util import WindowPath, window_path
from strata_cli.model.gguf_file import open_model

PATHS = {"unfused": WindowPath(gemv_tc=False),
         "fused": WindowPath(gemv_tc=True)}


def window_ms(model, path: WindowPath, windows, reps: int, depth: int) -> dict[int, float]:
    """{T: median ms} of one engine taking `path` at every T (one engine per path: a full-size file fits once)."""
    eng = GPUEngine(model, window_paths=lambda t: path)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.geometry.n_vocab, depth + sum(windows) * (reps + 2))
    for pos in range(0, depth, eng.max_t):  # the context, committed eagerly
        n = min(eng.max_t, depth - pos)
        eng.run(tokens[pos:pos + n], pos, eager=True, logits=False)
        eng.commit(n, eager=True)
    timer = eng.window_only_timer(profile=False)
    out, pos = {}, depth
    for T in windows:
        times = []
        for _ in range(reps + 2):
            ms, _ = timer(eng, tokens[pos:pos + T], eng.n_past, 1)
            times.append(ms)
            pos += 1
        out[T] = statistics.median(times[2:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--window", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("-r", "--repetitions", type=int, default=30)
    ap.add_argument("-d", "--depth", type=int, default=256)
    args = ap.parse_args()
    model = open_model(args.model)
    rows = []
    by_path = {}
    for name, path in PATHS.items():
        by_path[name] = window_ms(model, path, args.window, args.repetitions, args.depth)
        gc.collect()
    print(f"{'T':>3} {'unfused ms':>11} {'fused ms':>9}  table  faster")
    for T in args.window:
        ms = {name: by_path[name][T] for name in PATHS}
        table = "fused" if window_path(T).gemv_tc else "unfused"
        faster = min(ms, key=ms.get)
        print(f"{T:>3} {ms['unfused']:>11.3f} {ms['fused']:>9.3f}  {table:7s} {faster}{'' if faster == table else ' (!)'}",
              flush=True)
        rows.append({"T": T, "unfused_ms": ms["unfused"], "fused_ms": ms["fused"], "table": table})
    print(json.dumps({"model": args.model, "windows": rows}))


if __name__ == "__main__":
    main()
