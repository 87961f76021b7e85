"""The CPU expert pool's GB/s of expert weights on Qwen3.8-Flash-Next shapes, against a plain parallel read.

    python3 bench/pool_bench.py [--threads N] [--layers 8] [--experts 48] [--tokens 1,2,4,8] [--iters 20]
                                [--variant PREFETCH_AHEAD=4096 ...]

Q8_0 routed experts (gate/up [640 x 2560], down [2560 x 640], 5.2 MB each) held in memory as the GGUF stores them
(34-byte blocks), `--experts` per layer so that the working set (8 x 48 x 5.2 MB = 2 GB) is far larger than the
last-level cache. Per iteration and layer, each token routes to 10 random distinct experts; the pool computes every
distinct expert once for its rows (one ctypes call per layer). GB/s = distinct expert bytes / wall time of the 8
layers; the plain read sums the same bytes with the same threads (strata_stream_read). Before timing, the pool's
output on one layer is checked against the numpy reference (float64 on the dequantized weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np

from strata_cli.model import quants
from strata_cli.ops import moe
from strata_cli.tiers import native
from strata_cli.tiers.plan import build_plan
from strata_cli.tiers.pool import ExpertPool, default_threads

Q8 = quants.Q8_0


class SyntheticExperts:
    """What ExpertPool reads from a model: geometry + blk.L.ffn_*_exps infos, Q8_0 raw blocks in memory."""

    def __init__(self, n_layers: int, n_expert: int, hidden: int, ff: int, k: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.geometry = SimpleNamespace(n_layers=n_layers, n_expert=n_expert, n_embd=hidden, n_ff_exp=ff,
                                        n_expert_used=k)
        self.tensors = {}
        ones = {role: quants.quantize_q8_0(rng.standard_normal((rows, n)).astype(np.float32) * 0.05)
                for role, rows, n in (("gate", ff, hidden), ("up", ff, hidden), ("down", hidden, ff))}
        for layer in range(n_layers):
            for role, rows, n in (("gate", ff, hidden), ("up", ff, hidden), ("down", hidden, ff)):
                one = ones[role]
                raw = np.empty((n_expert, rows, one.shape[1]), dtype=np.uint8)
                raw[:] = one  # every expert the same bytes, in its own memory (values do not change the time)
                raw[1:, :, 2] ^= np.arange(1, n_expert, dtype=np.uint8)[:, None]  # but not identical experts
                self.tensors[f"blk.{layer}.ffn_{role}_exps.weight"] = SimpleNamespace(
                    raw=raw, ggml_type=Q8, n_bytes=raw.nbytes, shape=(n, rows, n_expert))

    def info(self, name):
        return self.tensors[name]


def check(model, pool, rng) -> float:
    """Max |pool - numpy| / max |numpy| on layer 0, three rows, 10 experts each."""
    g = model.geometry
    ids = np.stack([rng.choice(g.n_expert, g.n_expert_used, replace=False) for _ in range(3)])
    x = rng.standard_normal((3, g.n_embd)).astype(np.float32)
    plan = build_plan(0, ids, np.full(g.n_expert, -1, np.int32))
    out = pool.compute(0, x, plan.cpu)
    ref = np.zeros_like(out)
    for i, e in enumerate(plan.cpu.experts):
        w = [quants.dequantize(model.info(f"blk.0.ffn_{r}_exps.weight").raw[e], Q8).astype(np.float64)
             for r in ("gate", "up", "down")]
        tok, dst = plan.cpu.entries(i)
        ref[dst] = moe.swiglu(x[tok], *w)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def time_pool(model, pool, n_tokens: int, iters: int, rng) -> tuple[list[float], int]:
    g = model.geometry
    none = np.full(g.n_expert, -1, np.int32)
    x = rng.standard_normal((n_tokens, g.n_embd)).astype(np.float32)
    out = np.zeros((n_tokens * g.n_expert_used, g.n_embd), np.float32)
    times, nbytes = [], 0
    for it in range(iters + 2):
        plans = [build_plan(layer, np.stack([rng.choice(g.n_expert, g.n_expert_used, replace=False)
                                             for _ in range(n_tokens)]), none) for layer in range(g.n_layers)]
        t0 = time.perf_counter()
        for plan in plans:
            pool.compute(plan.layer, x, plan.cpu, out=out)
        dt = time.perf_counter() - t0
        if it >= 2:  # two warm-up iterations (thread team, page faults)
            times.append(dt)
            nbytes += sum(p.cpu.n_groups for p in plans) * pool.expert_bytes(0)
    return times, nbytes // iters


def time_read(model, lib, threads: int, n_experts: int, iters: int, rng) -> list[float]:
    g = model.geometry
    out = []
    for it in range(iters + 2):
        ptrs, sizes = [], []
        for layer in range(g.n_layers):
            for e in rng.choice(g.n_expert, n_experts, replace=False):
                for role in ("gate", "up", "down"):
                    raw = model.info(f"blk.{layer}.ffn_{role}_exps.weight").raw
                    ptrs.append(raw[e].ctypes.data)
                    sizes.append(raw[e].nbytes)
        p, s = np.array(ptrs, dtype=np.uint64), np.array(sizes, dtype=np.int64)
        t0 = time.perf_counter()
        lib.strata_stream_read(threads, len(p), p.ctypes.data, s.ctypes.data)
        if it >= 2:
            out.append((time.perf_counter() - t0, int(s.sum())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=48, help="experts per layer held in memory")
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--ff", type=int, default=640)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--variant", action="append", default=[],
                    help="also time T=1 with the kernel built with -DNAME=VALUE (e.g. PREFETCH_AHEAD=4096)")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    model = SyntheticExperts(args.layers, args.experts, args.hidden, args.ff, args.k)
    setup_s = time.perf_counter() - t0
    pool = ExpertPool(model, n_threads=args.threads)
    lib = native.load()
    rel_err = check(model, pool, rng)
    print(f"pool: {pool.backend}; {args.layers} layers x {args.experts} Q8_0 experts in memory "
          f"({args.layers * args.experts * pool.expert_bytes(0) / 1e9:.2f} GB, built in {setup_s:.1f} s); "
          f"check vs numpy: max rel err {rel_err:.2e}")
    if rel_err > 1e-4:
        raise SystemExit("the pool disagrees with the numpy reference: no timing reported")
    rows = []
    for n_tokens in (int(t) for t in args.tokens.split(",")):
        times, nbytes = time_pool(model, pool, n_tokens, args.iters, rng)
        med = statistics.median(times)
        rows.append({"what": f"pool T={n_tokens}", "MB": nbytes / 1e6, "ms_median": med * 1e3,
                     "ms_min": min(times) * 1e3, "GB_s": nbytes / med / 1e9})
    for define in args.variant:
        vpool = ExpertPool(model, n_threads=args.threads, lib=native.load_variant((define,)))
        if check(model, vpool, rng) > 1e-4:
            raise SystemExit(f"variant {define} disagrees with the numpy reference")
        times, nbytes = time_pool(model, vpool, 1, args.iters, rng)
        med = statistics.median(times)
        rows.append({"what": f"T=1 {define}", "MB": nbytes / 1e6, "ms_median": med * 1e3,
                     "ms_min": min(times) * 1e3, "GB_s": nbytes / med / 1e9})
    if lib is not None:
        reads = time_read(model, lib, args.threads, args.k, args.iters, rng)
        med = statistics.median(t for t, _ in reads)
        nbytes = reads[0][1]
        rows.append({"what": "plain read", "MB": nbytes / 1e6, "ms_median": med * 1e3,
                     "ms_min": min(t for t, _ in reads) * 1e3, "GB_s": nbytes / med / 1e9})
    print(f"{'what':<22}{'MB':>9}{'ms med':>9}{'ms min':>9}{'GB/s':>8}   ({args.threads} threads, {args.iters} iters)")
    for r in rows:
        print(f"{r['what']:<22}{r['MB']:>9.1f}{r['ms_median']:>9.2f}{r['ms_min']:>9.2f}{r['GB_s']:>8.1f}")
    print(json.dumps({"threads": args.threads, "rel_err": rel_err, "rows": rows}))


if __name__ == "__main__":
    main()
