"""The CPU expert pool's GB/s of expert weights per block type on Qwen3.8-Flash-Next shapes, against a plain read.

    python3 bench/pool_bench.py [--types Q8_0,Q4_0,Q2_K,...|all] [--threads N] [--isa avx512|avx2|scalar]
                                [--gb 4] [--layers 8] [--tokens 1,4] [--iters 10] [--variant PREFETCH_AHEAD=4096 ...]

Per type: routed experts gate/up [640 x 2560] of that type and down [2560 x 640] of it too where 640 weights hold
whole blocks (else Q4_0, as the full-size file pairs Q2_K gate/up with Q4_0 down), valid random blocks
(strata_cli/synth/blocks.py) held in memory as the GGUF stores them, `--layers` layers with as many experts each
as make `--gb` GB in all (far more than the last-level cache; 4 distinct experts' bytes copied into every expert's
own memory). T rows per expert: per iteration and layer, T tokens all route to the same 10 random distinct experts,
and the pool computes each of them once for its T rows (one ctypes call per layer). GB/s = the distinct experts'
bytes / wall time of the layers; GB_per_cpu_s = those bytes / the process's CPU seconds (what one core does, also
on a shared host). Before timing, every T is checked on layer 0 against the numpy reference
(float64 SwiGLU on strata_cli/model/quants.dequantize): rel err = max |pool - numpy| / max |numpy|, <= 1e-4 or no
timing. The plain read sums --gb / 8 bytes at a time with the same threads (strata_stream_read).
Last line: one JSON document, a row per type and T (type, down_type, T, GB_s, ms_median, rel_err).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from types import SimpleNamespace

import numpy as np

from strata_cli.model import quants
from strata_cli.ops import moe
from strata_cli.synth.blocks import random_tensor
from strata_cli.tiers import native
from strata_cli.tiers.plan import build_plan
from strata_cli.tiers.pool import ExpertPool, default_threads

ROLES = ("gate", "up", "down")
DISTINCT = 4  # distinct experts' bytes per tensor (copied into every expert: values do not change the time)


def random_expert(ggml_type: int, rows: int, n: int, rng) -> np.ndarray:
    """[rows, row bytes] uint8 of one expert's tensor (valid random blocks), or [rows, n] random floats in the
    type's own dtype (as the GGUF reader maps float tensors, so the numpy reference reads them as values)."""
    if ggml_type in quants.BLOCK_TYPES:
        return random_tensor(rng, ggml_type, (rows, n), 0.05)
    x = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(0.05)
    dtype = {quants.F32: np.float32, quants.F16: np.float16}.get(ggml_type, np.uint16)  # BF16: its 16-bit words
    return np.ascontiguousarray(quants.quantize(x, ggml_type)).view(dtype).reshape(rows, n)


class SyntheticExperts:
    """What ExpertPool reads from a model: geometry + blk.L.ffn_*_exps infos, raw blocks in memory."""

    def __init__(self, types: tuple[int, int, int], n_layers: int, n_expert: int, hidden: int, ff: int, k: int,
                 seed: int = 0):
        rng = np.random.default_rng(seed)
        self.geometry = SimpleNamespace(n_layers=n_layers, n_expert=n_expert, n_embd=hidden, n_ff_exp=ff,
                                        n_expert_used=k)
        self.types = types
        shapes = {"gate": (ff, hidden), "up": (ff, hidden), "down": (hidden, ff)}
        self.distinct = {role: np.stack([random_expert(t, *shapes[role], rng) for _ in range(DISTINCT)])
                         for role, t in zip(ROLES, types)}
        self.tensors = {}
        for layer in range(n_layers):
            for role, t in zip(ROLES, types):
                one = self.distinct[role]
                raw = np.empty((n_expert, *one.shape[1:]), dtype=one.dtype)
                for d in range(DISTINCT):
                    raw[d::DISTINCT] = one[d]
                rows, n = shapes[role]
                self.tensors[f"blk.{layer}.ffn_{role}_exps.weight"] = SimpleNamespace(
                    raw=raw, ggml_type=t, n_bytes=raw.nbytes, shape=(n, rows, n_expert))

    def info(self, name):
        return self.tensors[name]

    def reference(self, x: np.ndarray, experts) -> dict[int, np.ndarray]:
        """float64 SwiGLU of rows x through the given experts (expert e holds distinct bytes e % DISTINCT)."""
        w = {}
        out = {}
        for e in experts:
            d = int(e) % DISTINCT
            if d not in w:
                w[d] = [quants.dequantize(self.distinct[role][d], t).astype(np.float64)
                        for role, t in zip(ROLES, self.types)]
            out[int(e)] = moe.swiglu(x, *w[d])
        return out


def routing(model, n_tokens: int, rng) -> np.ndarray:
    """[T, k]: T tokens, all routed to the same k distinct random experts (T rows per expert)."""
    g = model.geometry
    return np.tile(rng.choice(g.n_expert, g.n_expert_used, replace=False), (n_tokens, 1))


def check(model, pool, n_tokens: int, rng) -> float:
    """Max |pool - numpy| / max |numpy| on layer 0 at T rows per expert."""
    g = model.geometry
    ids = routing(model, n_tokens, rng)
    x = rng.standard_normal((n_tokens, g.n_embd)).astype(np.float32)
    plan = build_plan(0, ids, np.full(g.n_expert, -1, np.int32))
    out = pool.compute(0, x, plan.cpu)
    ref = np.zeros_like(out, dtype=np.float64)
    per_expert = model.reference(x, plan.cpu.experts)
    for i, e in enumerate(plan.cpu.experts):
        tok, dst = plan.cpu.entries(i)
        ref[dst] = per_expert[int(e)][tok]
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def time_pool(model, pool, n_tokens: int, iters: int, rng) -> tuple[list[float], int, float]:
    """Wall times of the iterations, the bytes of one, and the process's CPU seconds per iteration (all threads:
    on a shared host the CPU time, not the wall time, says what a core does)."""
    g = model.geometry
    none = np.full(g.n_expert, -1, np.int32)
    x = rng.standard_normal((n_tokens, g.n_embd)).astype(np.float32)
    out = np.zeros((n_tokens * g.n_expert_used, g.n_embd), np.float32)
    times, nbytes, cpu = [], 0, 0.0
    for it in range(iters + 2):
        plans = [build_plan(layer, routing(model, n_tokens, rng), none) for layer in range(g.n_layers)]
        t0, c0 = time.perf_counter(), time.process_time()
        for plan in plans:
            pool.compute(plan.layer, x, plan.cpu, out=out)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if it >= 2:  # two warm-up iterations (thread team, page faults)
            times.append(dt)
            cpu += dc
            nbytes += sum(p.cpu.n_groups for p in plans) * pool.expert_bytes(0)
    return times, nbytes // iters, cpu / iters


def time_read(lib, threads: int, nbytes: int, iters: int) -> float:
    """GB/s of a plain parallel read of nbytes in expert-sized pieces, cycling through 4 such buffers (4 x nbytes,
    more than the last-level cache)."""
    piece = 5 << 20
    bufs = [np.ones(max(nbytes, piece), np.uint8) for _ in range(4)]
    speeds = []
    for it in range(iters + 2):
        buf = bufs[it % len(bufs)]
        ptrs = np.array([buf[o:].ctypes.data for o in range(0, buf.size - piece + 1, piece)], dtype=np.uint64)
        sizes = np.full(len(ptrs), piece, dtype=np.int64)
        t0 = time.perf_counter()
        lib.strata_stream_read(threads, len(ptrs), ptrs.ctypes.data, sizes.ctypes.data)
        if it >= 2:
            speeds.append(int(sizes.sum()) / (time.perf_counter() - t0) / 1e9)
    return statistics.median(speeds)


def down_type(ggml_type: int, ff: int) -> int:
    return ggml_type if quants.fits(ggml_type, ff) else quants.Q4_0


def bench_type(name: str, args, lib, rows: list[dict]) -> None:
    t = quants.TYPE_IDS[name]
    types = (t, t, down_type(t, args.ff))
    one = SyntheticExperts(types, 1, DISTINCT, args.hidden, args.ff, args.k)
    expert_bytes = ExpertPool(one, n_threads=1, lib=lib).expert_bytes(0)
    n_expert = max(args.k, math.ceil(args.gb * 1e9 / args.layers / expert_bytes))
    t0 = time.perf_counter()
    model = SyntheticExperts(types, args.layers, n_expert, args.hidden, args.ff, args.k)
    pool = ExpertPool(model, n_threads=args.threads, lib=lib)
    label = f"{name}+{quants.TYPE_NAMES[types[2]]}" if types[2] != t else name
    print(f"{label}: {args.layers} layers x {n_expert} experts ({args.layers * n_expert * expert_bytes / 1e9:.2f} GB,"
          f" built in {time.perf_counter() - t0:.1f} s), pool {pool.backend}", flush=True)
    rng = np.random.default_rng(1)
    for n_tokens in args.tokens:
        rel_err = check(model, pool, n_tokens, rng)
        if rel_err > 1e-4:
            raise SystemExit(f"pool_bench: {label} T={n_tokens}: the pool disagrees with the numpy reference "
                             f"(rel err {rel_err:.2e}): no timing reported")
        times, nbytes, cpu_s = time_pool(model, pool, n_tokens, args.iters, rng)
        med = statistics.median(times)
        rows.append({"type": name, "down_type": quants.TYPE_NAMES[types[2]], "T": n_tokens, "GB_s": nbytes / med / 1e9,
                     "GB_s_per_thread": nbytes / med / 1e9 / args.threads, "GB_per_cpu_s": nbytes / cpu_s / 1e9,
                     "ms_median": med * 1e3, "MB": nbytes / 1e6, "rel_err": rel_err})
        print(f"  T={n_tokens:<3} {rows[-1]['GB_s']:7.1f} GB/s ({rows[-1]['GB_s_per_thread']:.2f} per thread, "
              f"{rows[-1]['GB_per_cpu_s']:.2f} per CPU second)  {med * 1e3:8.2f} ms for {nbytes / 1e6:.0f} MB   "
              f"rel err {rel_err:.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_0,Q2_K",
                    help="comma-separated GGML type names, or 'all' (every type the pool has a kernel for)")
    ap.add_argument("--threads", type=int, default=None, help="pool threads (default: STRATA_POOL_THREADS or all cores)")
    ap.add_argument("--isa", choices=[name for name, _, _ in native.ISAS], default=None,
                    help="the kernel build (default: the best this CPU runs)")
    ap.add_argument("--gb", type=float, default=4.0, help="expert weights in memory per type, GB")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--ff", type=int, default=640)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--tokens", default="1,4", help="rows per expert, comma-separated")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variant", action="append", default=[],
                    help="build the kernel with -DNAME=VALUE (e.g. PREFETCH_AHEAD=4096)")
    args = ap.parse_args()
    args.threads = args.threads or default_threads()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    names = sorted(native.NATIVE_TYPES, key=native.NATIVE_TYPES.get) if args.types == "all" else args.types.split(",")
    unknown = [n for n in names if n not in native.NATIVE_TYPES]
    if unknown:
        raise SystemExit(f"pool_bench: --types: no pool kernel for {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(native.NATIVE_TYPES))})")
    isa = args.isa or native.host_isas()[0]
    lib = native.load_variant(tuple(args.variant), isa=isa)
    if lib is None:
        raise SystemExit("pool_bench: no C compiler, the pool would run on numpy: nothing to measure")
    rows: list[dict] = []
    for name in names:
        bench_type(name, args, lib, rows)
    read = time_read(lib, args.threads, int(args.gb * 1e9 / 8), args.iters)
    print(f"plain read: {read:.1f} GB/s ({args.threads} threads, isa {lib.isa})")
    print(json.dumps({"threads": args.threads, "isa": lib.isa, "variant": args.variant, "gb": args.gb,
                      "plain_read_GB_s": read, "rows": [dict(r, threads=args.threads, isa=lib.isa) for r in rows]}))


if __name__ == "__main__":
    main()
