"""The CPU expert pool's GB/s of expert weights per block type on Qwen3.8-Flash-Next shapes, from DRAM, and where
the time goes.

    python3 bench/pool_bench.py [--types Q8_0,Q4_0,Q2_K,...|all] [--threads N[,N...]] [--isa avx512vbmi|avx512|avx2|scalar]
                                [--gb 4] [--layers 8] [--k 10[,4...]] [--tokens 1,4] [--iters 10]
                                [--variant NAME=VALUE ...] [--ab NAME=VALUE[,...]|ISA ...] [--pages anon,huge,4k,file] [--modes pool,read,...]
                                [--rounds R] [--sweep] [--old OTHER_TREE/kernels]

Per type: routed experts gate/up [640 x 2560] of that type and down [2560 x 640] of it too where 640 weights hold
whole blocks (else Q4_0, as the full-size file pairs Q2_K gate/up with Q4_0 down), valid random blocks
(strata_cli/synth/blocks.py; 4 distinct experts' bytes copied into every expert's own memory), `--layers` layers with
as many experts each as make `--gb` GB in all, held in memory of each `--pages` kind (bench/pool_memory.py: numpy's
own, 2 MB or 4 KB anonymous pages, or a read-only file mapping like the engine's GGUF).

Cold by construction: per layer the experts are dealt into disjoint sets of k (a random permutation), and each
iteration takes the next set in every layer (every configuration continues the same rotation), so a set comes back
only after every other set was read: that reuse distance is printed against the L3, and --gb is raised where it
would be under 3 x the L3. T rows per expert: T tokens all route to the iteration's k experts; one ctypes call per
layer. Each --k (experts per call) has its own expert sets: the engine's small calls are `--k 4,10 --tokens 1,8
--layers 48` (a verify window's 48 layer calls per iteration: ~4 missed experts a layer at a 24 GiB VRAM cache, ~10
at cache 0).

Modes (each a configuration per thread count and build):
  pool   the pool's calls (strata_pool_diag, with the per-thread profile: where each call's time goes, and the
         chunk its gate/up and down item loops took)
  touch  the same calls with the weights only read, not decoded: the same items, schedule and barriers (the
         access pattern's cost alone; pool much slower than touch = decoding, not fetching, is the limit)
  read   a plain parallel read of the same experts' bytes (strata_stream_read): what the memory gives
  hot    the pool on one fixed set of as many layers as fit half the L3 (the compute rate without DRAM)

Builds: the base (--isa and --variant NAME=VALUE defines, as the pool builds itself when both are absent), "old"
(--old: another tree's kernels with the base's defines and ISA, a kernel before and after on one machine) and one
per --ab (comma-separated NAME=VALUE defines and/or an ISA name, on top of the base's: `--ab avx2` is the AVX2
build on an AVX-512 host), each compiled in parallel. Before timing, every build is checked on layer 0 at every T
and at the largest and smallest thread count against the numpy reference (float64 SwiGLU on strata_cli/model/quants.dequantize): rel err = max |pool -
numpy| / max |numpy|, <= 1e-4 or no timing. Configurations run in --rounds interleaved rounds (drift on a shared
host hits every configuration alike); GB/s = the median over every timed iteration of the distinct experts' bytes /
wall time. "foreign" is the CPU the rest of the host used meanwhile, in cores ("steal": of it, what the hypervisor
gave other guests).

--sweep: threads 1, 2, 4, 8, 16 (up to the cores this process may use), pages 4k, huge, file, modes pool, touch,
read, hot, T = 1, 2 rounds of 3 iterations, --ab builds at 1 thread (on the first page kind) and the most
(--ab-threads). Last line: one JSON
document: host facts, builds, and a row per (type, k, T, pages, mode, build, threads) holding type, down_type, k, T,
GB_s, rel_err, the profile's means and the coldness figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

# numpy's OpenBLAS team spins on every core for a while after each BLAS call (the reference checks' float64
# matmuls before a configuration is timed), taking cores from the pool's OpenMP team in the configurations that
# follow: on the dev box (2 cores, bench/blas_spin_probe.py) the pool's mean wake was up to 362 us right after a
# 600 x 600 matmul against 5-8 us after a 0.5 s sleep, and 7-18 us either way with one BLAS thread. The H200 host's "late thread" wakes of
# 100-480 us at T = 1 (the first configurations after each check; T = 4, timed later, 4-30 us) fit this. One BLAS
# thread: the bench's own numpy work is small (set OPENBLAS_NUM_THREADS to override).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402  (after the environment above: OpenBLAS reads it when numpy loads it)

import pool_memory  # bench/pool_memory.py (python3 bench/pool_bench.py puts bench/ on the path)
from strata_cli.model import quants
from strata_cli.ops import moe
from strata_cli.synth.blocks import random_tensor
from strata_cli.tiers import native
from strata_cli.tiers.plan import build_plan
from strata_cli.tiers.pool import ExpertPool, default_threads

ROLES = ("gate", "up", "down")
DISTINCT = 4  # distinct experts' bytes per tensor (copied into every expert: values do not change the time)
MODES = ("pool", "touch", "read", "hot")
PROF_HEAD, PROF_PER = 4, 8  # strata_pool_diag's profile layout (kernels/expert_pool.c)
WARM = 1  # untimed iterations per configuration and round (the team's threads, the rotation's first set)


def random_expert(ggml_type: int, rows: int, n: int, rng) -> np.ndarray:
    """[rows, row bytes] uint8 of one expert's tensor (valid random blocks), or [rows, n] random floats in the
    type's own dtype (as the GGUF reader maps float tensors, so the numpy reference reads them as values)."""
    if ggml_type in quants.BLOCK_TYPES:
        return random_tensor(rng, ggml_type, (rows, n), 0.05)
    x = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(0.05)
    dtype = {quants.F32: np.float32, quants.F16: np.float16}.get(ggml_type, np.uint16)  # BF16: its 16-bit words
    return np.ascontiguousarray(quants.quantize(x, ggml_type)).view(dtype).reshape(rows, n)


def distinct_experts(types, hidden: int, ff: int, seed: int = 0) -> dict[str, np.ndarray]:
    """role -> [DISTINCT, rows, row bytes | n]: the bytes every expert of that role repeats."""
    rng = np.random.default_rng(seed)
    shapes = {"gate": (ff, hidden), "up": (ff, hidden), "down": (hidden, ff)}
    return {role: np.stack([random_expert(t, *shapes[role], rng) for _ in range(DISTINCT)])
            for role, t in zip(ROLES, types)}


class SyntheticExperts:
    """What ExpertPool reads from a model: geometry + blk.L.ffn_*_exps infos, raw blocks in one Arena."""

    def __init__(self, types, distinct, n_layers: int, n_expert: int, hidden: int, ff: int, k: int,
                 pages: str = "anon", file_dir: str | None = None):
        self.geometry = SimpleNamespace(n_layers=n_layers, n_expert=n_expert, n_embd=hidden, n_ff_exp=ff,
                                        n_expert_used=k)
        self.types, self.distinct, self.pages = types, distinct, pages
        per = {role: distinct[role][0].nbytes for role in ROLES}
        total = n_layers * sum(-(-n_expert * per[r] // pool_memory.ALIGN) * pool_memory.ALIGN for r in ROLES)
        self.arena = pool_memory.Arena(total, pages, file_dir)
        layout = {}
        for layer in range(n_layers):
            for role in ROLES:
                one = distinct[role]
                at = self.arena.place(n_expert * one[0].nbytes)
                raw = self.arena.view(at, (n_expert, *one.shape[1:]), one.dtype)
                for d in range(DISTINCT):
                    raw[d::DISTINCT] = one[d]
                layout[f"blk.{layer}.ffn_{role}_exps.weight"] = (at, raw.shape, raw.dtype)
        del raw
        self.arena.seal()
        self.tensors = {}
        for name, (at, shape, dtype) in layout.items():
            role = ROLES.index(name.split("_")[1])
            raw = self.arena.view(at, shape, dtype)
            self.tensors[name] = SimpleNamespace(raw=raw, ggml_type=types[role], n_bytes=raw.nbytes,
                                                 shape=(ff if role == 2 else hidden, shape[1], n_expert))

    def info(self, name):
        return self.tensors[name]

    def reference(self, x: np.ndarray, experts) -> dict[int, np.ndarray]:
        """float64 SwiGLU of rows x through the given experts (expert e holds distinct bytes e % DISTINCT)."""
        w, out = {}, {}
        for e in experts:
            d = int(e) % DISTINCT
            if d not in w:
                w[d] = [quants.dequantize(self.distinct[role][d], t).astype(np.float64)
                        for role, t in zip(ROLES, self.types)]
            out[int(e)] = moe.swiglu(x, *w[d])
        return out

    def close(self) -> None:
        self.tensors.clear()
        self.arena.close()


class Rotation:
    """Disjoint sets of k experts per layer (a random permutation dealt out): set 0 is the hot mode's, the cold
    modes go round sets 1 .. n_sets - 1, one per iteration, in every layer at once."""

    def __init__(self, model, seed: int = 2):
        g = model.geometry
        rng = np.random.default_rng(seed)
        self.k, self.n_layers = g.n_expert_used, g.n_layers
        self.n_sets = g.n_expert // self.k
        self.perm = [rng.permutation(g.n_expert) for _ in range(g.n_layers)]
        self.n_expert, self.turn = g.n_expert, 0

    def experts(self, layer: int, s: int) -> np.ndarray:
        return self.perm[layer][s * self.k:(s + 1) * self.k]

    def next_set(self) -> int:
        self.turn += 1
        return 1 + (self.turn - 1) % (self.n_sets - 1)

    def plans(self, n_tokens: int, s: int, layers: int) -> list:
        none = np.full(self.n_expert, -1, np.int32)
        return [build_plan(layer, np.tile(self.experts(layer, s), (n_tokens, 1)), none) for layer in range(layers)]


def check_case(model, n_tokens: int) -> tuple:
    """Layer 0's plan at T rows per expert (the rotation's set 1), its x, and the numpy reference of every row."""
    g = model.geometry
    ids = np.tile(Rotation(model).experts(0, 1), (n_tokens, 1))
    x = np.random.default_rng(n_tokens).standard_normal((n_tokens, g.n_embd)).astype(np.float32)
    plan = build_plan(0, ids, np.full(g.n_expert, -1, np.int32))
    ref = np.zeros((n_tokens * g.n_expert_used, g.n_embd), dtype=np.float64)
    per_expert = model.reference(x, plan.cpu.experts)
    for i, e in enumerate(plan.cpu.experts):
        tok, dst = plan.cpu.entries(i)
        ref[dst] = per_expert[int(e)][tok]
    return plan, x, ref


def check(pool, case) -> float:
    """Max |pool - numpy| / max |numpy| of one check_case."""
    plan, x, ref = case
    out = pool.compute(0, x, plan.cpu)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def call_profile(prof: np.ndarray, gu_bytes: int, dn_bytes: int) -> dict[str, float]:
    """One call's profile (kernels/expert_pool.c, PROF_*) -> microseconds and rates. busy: a thread's span from
    its first item to its last item done, per phase; wait: from its last item done to the phase's end (barrier,
    imbalance); wake: from the call to the thread entering the region."""
    n = int(prof[2])
    t0, t1 = prof[0], prof[1]
    th = prof[PROF_HEAD:PROF_HEAD + PROF_PER * n].reshape(n, PROF_PER).astype(np.float64)
    th = th[th[:, 0] > 0]  # the threads the team had (OpenMP may give fewer than asked)
    n = len(th)
    gu_busy, dn_busy = th[:, 2] - th[:, 1], th[:, 4] - th[:, 3]
    wall = float(t1 - t0)
    return {"call_us": wall / 1e3, "wake_us": float((th[:, 0] - t0).mean()) / 1e3,
            "wake_max_us": float((th[:, 0] - t0).max()) / 1e3, "sums_us": float((th[:, 1] - th[:, 0]).mean()) / 1e3,
            "gu_us": float(th[:, 3].mean() - th[:, 1].mean()) / 1e3,
            "gu_wait_us": float((th[:, 3] - th[:, 2]).mean()) / 1e3,
            "dn_us": float(t1 - th[:, 3].mean()) / 1e3, "dn_wait_us": float((t1 - th[:, 4]).mean()) / 1e3,
            "util": float((gu_busy.sum() + dn_busy.sum()) / (n * wall)) if wall > 0 else 0.0,
            "gu_busy_GB_s_thread": gu_bytes / max(gu_busy.sum(), 1.0),  # bytes / ns = GB/s per busy thread
            "dn_busy_GB_s_thread": dn_bytes / max(dn_busy.sum(), 1.0),
            "items_max_share": float(max(th[:, 5].max() / max(th[:, 5].mean(), 1e-9),
                                         th[:, 6].max() / max(th[:, 6].mean(), 1e-9))),
            "chunk_gu": float(prof[3]), "chunk_dn": float(th[:, 7].max())}  # the item loops' chunks (pool_chunk)


def mean_of(dicts: list[dict]) -> dict[str, float]:
    return {key: float(np.mean([d[key] for d in dicts])) for key in dicts[0]} if dicts else {}


class TypeBench:
    """One type's expert sets (one per page kind), their rotations, and the configurations run on them."""

    def __init__(self, name: str, args, l3: int):
        t = quants.TYPE_IDS[name]
        self.name, self.args, self.l3 = name, args, l3
        self.types = (t, t, t if quants.fits(t, args.ff) else quants.Q4_0)
        self.label = f"{name}+{quants.TYPE_NAMES[self.types[2]]}" if self.types[2] != t else name
        distinct = distinct_experts(self.types, args.hidden, args.ff)
        self.gu_bytes = distinct["gate"][0].nbytes + distinct["up"][0].nbytes  # one expert's
        self.expert_bytes = self.gu_bytes + distinct["down"][0].nbytes
        # --gb, raised where needed so that a cold set comes back only after >= 3 x L3 of other sets (and at
        # least 3 sets per layer: the hot one and two to rotate through)
        iter_bytes = args.layers * args.k * self.expert_bytes
        self.n_expert = max(math.ceil(args.gb * 1e9 / args.layers / self.expert_bytes),
                            args.k * (2 + math.ceil(3 * l3 / iter_bytes)), 3 * args.k)
        self.models, self.rotations, self.huge = {}, {}, {}
        for pages in args.pages:
            t0 = time.perf_counter()
            model = SyntheticExperts(self.types, distinct, args.layers, self.n_expert, args.hidden, args.ff, args.k,
                                     pages, args.file_dir)
            self.models[pages], self.rotations[pages] = model, Rotation(model)
            frac, st = model.arena.huge_fraction()
            print(f"{self.label} [{pages}]: {args.layers} layers x {self.n_expert} experts "
                  f"({args.layers * self.n_expert * self.expert_bytes / 1e9:.2f} GB, built in "
                  f"{time.perf_counter() - t0:.1f} s), {frac * 100:.0f} % on 2 MB pages (Rss {st['Rss'] >> 10} MB, "
                  f"anon huge {st['AnonHugePages'] >> 10} MB, file PMD {st['FilePmdMapped'] >> 10} MB, shmem PMD "
                  f"{st['ShmemPmdMapped'] >> 10} MB)", flush=True)
            self.huge[pages] = frac
        rot = next(iter(self.rotations.values()))
        self.call_bytes = args.k * self.expert_bytes  # one layer's call
        self.iter_bytes = args.layers * self.call_bytes
        self.reuse_bytes = (rot.n_sets - 2) * self.iter_bytes  # bytes read before a cold set comes back
        self.hot_layers = max(1, min(args.layers, int(l3 / 2 // self.call_bytes))) if l3 else 1
        cold = "cold: more than 3 x the L3" if l3 else "WARNING: L3 size unknown, coldness not checked"
        print(f"  served {self.call_bytes / 1e6:.0f} MB per call, {self.iter_bytes / 1e6:.0f} MB per iteration; a "
              f"set comes back after {self.reuse_bytes / 1e6:.0f} MB ({rot.n_sets - 1} sets rotate; L3 "
              f"{l3 / 2**20:.0f} MiB): {cold}; hot: {self.hot_layers} layers "
              f"({self.hot_layers * self.call_bytes / 1e6:.0f} MB, the same set every iteration"
              f"{'' if 2 * self.call_bytes <= l3 else '; more than half the L3: not cache-resident'})", flush=True)

    def check_builds(self, builds: dict, threads: list[int]) -> dict[str, float]:
        """Every build at every T and the largest and smallest thread count: rel err (the largest)."""
        model = next(iter(self.models.values()))
        cases = [check_case(model, n_tokens) for n_tokens in self.args.tokens]
        errs = {}
        for bname, lib in builds.items():
            worst = 0.0
            for n_threads in sorted({max(threads), min(threads)}):
                pool = ExpertPool(model, n_threads=n_threads, lib=lib)
                worst = max([worst] + [check(pool, case) for case in cases])
            if not worst <= 1e-4:
                raise SystemExit(f"pool_bench: {self.label} build {bname}: the pool disagrees with the numpy "
                                 f"reference (rel err {worst:.2e}): no timing reported")
            errs[bname] = worst
        return errs

    def run(self, pages: str, mode: str, lib, n_threads: int, n_tokens: int, iters: int) -> dict:
        """One configuration: WARM + iters iterations; per timed iteration its GB/s, CPU and foreign load."""
        model, rot = self.models[pages], self.rotations[pages]
        g = model.geometry
        pool = ExpertPool(model, n_threads=n_threads, lib=lib)
        x = np.random.default_rng(5).standard_normal((n_tokens, g.n_embd)).astype(np.float32)
        out = np.zeros((n_tokens * g.n_expert_used, g.n_embd), np.float32)
        layers = self.hot_layers if mode == "hot" else g.n_layers
        profs = [np.zeros(PROF_HEAD + PROF_PER * n_threads, np.int64) for _ in range(layers)]
        load = pool_memory.HostLoad()
        res = {"GB_s": [], "cpu_s": [], "profile": [], "bytes": 0}
        mark0, wall0 = load.mark(), time.perf_counter()
        for it in range(WARM + iters):
            plans = rot.plans(n_tokens, 0 if mode == "hot" else rot.next_set(), layers)
            nbytes = sum(p.cpu.n_groups for p in plans) * self.expert_bytes
            if mode == "read":
                ptrs, sizes = [], []
                for p in plans:
                    for role in ROLES:
                        info = model.info(f"blk.{p.layer}.ffn_{role}_exps.weight")
                        per = info.raw[0].nbytes
                        for e in p.cpu.experts:
                            ptrs.append(info.raw.ctypes.data + int(e) * per)
                            sizes.append(per)
                ptrs, sizes = np.array(ptrs, np.uint64), np.array(sizes, np.int64)
            c0, t0 = time.process_time(), time.perf_counter()
            if mode == "read":
                lib.strata_stream_read(n_threads, len(ptrs), ptrs.ctypes.data, sizes.ctypes.data)
            else:
                for p, prof in zip(plans, profs):
                    call_args, keep = pool.native_args(p.layer, x, p.cpu, out)
                    rc = lib.strata_pool_diag(*call_args, 1 if mode == "touch" else 0, prof.ctypes.data)
                    if rc != 0:
                        raise SystemExit(f"pool_bench: {self.label}: pool call failed (code {rc})")
                    del keep
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if it >= WARM:
                res["GB_s"].append(nbytes / dt / 1e9)
                res["cpu_s"].append(dc)
                res["bytes"] = nbytes
                if mode != "read":
                    gu = [call_profile(pr, p.cpu.n_groups * self.gu_bytes,
                                       p.cpu.n_groups * (self.expert_bytes - self.gu_bytes))
                          for pr, p in zip(profs, plans)]
                    calls_us = sum(d["call_us"] for d in gu)
                    summary = mean_of(gu)
                    summary["python_share"] = max(0.0, 1 - calls_us / (dt * 1e6))
                    res["profile"].append(summary)
        mark1, wall = load.mark(), time.perf_counter() - wall0
        res["foreign"], res["steal"] = load.foreign_cores(mark0, mark1, wall), load.steal_cores(mark0, mark1, wall)
        return res


def parse_build(spec: str) -> tuple[tuple[str, ...], str | None]:
    """'NAME=VALUE,...[,ISA]' -> (defines, isa or None)."""
    defines, isa = [], None
    isas = [name for name, _, _ in native.ISAS]
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item in isas:
            isa = item
        elif "=" in item and item.split("=", 1)[0].isidentifier():
            defines.append(item)
        else:
            raise ValueError(f"{item!r}: a NAME=VALUE define or an ISA ({', '.join(isas)})")
    return tuple(defines), isa


def load_builds(args) -> dict:
    """name -> loaded library: 'base' and one per --ab, compiled in parallel (each its own .so in the cache)."""
    base_isa = args.isa or native.host_isas()[0]
    specs = {"base": (tuple(args.variant), base_isa)}
    for spec in args.ab:
        defines, isa = parse_build(spec)
        specs[spec] = (tuple(args.variant) + defines, isa or base_isa)
    kernels = {name: None for name in specs}
    if args.old:  # another tree's kernels, the base's defines and ISA
        specs["old"], kernels["old"] = specs["base"], Path(args.old)
    unknown = [isa for _, isa in specs.values() if isa not in native.host_isas()]
    if unknown:
        raise SystemExit(f"pool_bench: this CPU does not run {', '.join(sorted(set(unknown)))} "
                         f"(it runs {', '.join(native.host_isas())})")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(len(specs), os.cpu_count() or 1)) as ex:
        paths = dict(zip(specs, ex.map(lambda n: native.build(defines=specs[n][0], isa=specs[n][1], kernels=kernels[n]),
                                       specs)))
    builds = {}
    for name, (defines, isa) in specs.items():
        lib = native.load_variant(defines, isa=isa, kernels=kernels[name]) if paths[name] else None
        if lib is None:
            raise SystemExit(f"pool_bench: build {name} ({isa}, {' '.join(defines) or 'no defines'}) failed: "
                             "nothing to measure")
        builds[name] = lib
    print(f"builds ({time.perf_counter() - t0:.1f} s): " + "; ".join(
        f"{name}: {lib.isa} {native.build_config(lib)}" for name, lib in builds.items()), flush=True)
    return builds


def plan_configs(args, builds) -> list[tuple[str, str, str, int]]:
    """(pages, mode, build, threads) in the order one round runs them. The --ab builds at one thread (what a
    build costs a core) run on the first page kind only: they are the slowest configurations."""
    out = []
    for pages in args.pages:
        for n_threads in args.threads:
            for mode in args.modes:
                if mode == "pool":
                    out += [(pages, mode, b, n_threads) for b in builds
                            if b == "base" or (n_threads in args.ab_threads and (n_threads > 1 or pages == args.pages[0]))]
                else:
                    out.append((pages, mode, "base", n_threads))
    return out


def bench_type(name: str, args, builds, l3: int, rows: list[dict]) -> None:
    tb = TypeBench(name, args, l3)
    errs = tb.check_builds(builds, args.threads)
    configs = plan_configs(args, builds)
    for n_tokens in args.tokens:
        results = {c: [] for c in configs}
        for _ in range(args.rounds):
            for c in configs:
                pages, mode, bname, n_threads = c
                results[c].append(tb.run(pages, mode, builds[bname], n_threads, n_tokens, args.iters))
        for c in configs:
            pages, mode, bname, n_threads = c
            rs = results[c]
            speeds = [v for r in rs for v in r["GB_s"]]
            med = statistics.median(speeds)
            nbytes = rs[0]["bytes"]
            row = {"type": name, "down_type": quants.TYPE_NAMES[tb.types[2]], "k": args.k, "T": n_tokens,
                   "pages": pages,
                   "mode": mode, "build": bname, "threads": n_threads, "isa": builds[bname].isa,
                   "GB_s": med, "GB_s_min": min(speeds), "GB_s_max": max(speeds),
                   "GB_s_per_thread": med / n_threads,
                   "GB_per_cpu_s": nbytes * len(speeds) / 1e9 / max(sum(v for r in rs for v in r["cpu_s"]), 1e-9),
                   "ms_median": nbytes / med / 1e6, "MB": nbytes / 1e6, "rel_err": errs[bname],
                   "foreign_cores": float(np.nanmean([r["foreign"] for r in rs])),
                   "steal_cores": float(np.nanmean([r["steal"] for r in rs])),
                   "huge_page_share": tb.huge[pages], "reuse_MB": tb.reuse_bytes / 1e6,
                   "call_MB": tb.call_bytes / 1e6, "l3_MB": l3 / 1e6}
            prof = mean_of([p for r in rs for p in r["profile"]])
            row.update({f"prof_{k}": v for k, v in prof.items()})
            rows.append(row)
            print(format_row(tb.label, row), flush=True)
    for model in tb.models.values():
        model.close()


def format_row(label: str, r: dict) -> str:
    text = (f"  {label:<12} k={r['k']} T={r['T']} {r['pages']:<4} {r['mode']:<5} {r['build']:<28} "
            f"{r['threads']:>2} thr "
            f"{r['GB_s']:7.1f} GB/s ({r['GB_s_per_thread']:5.2f}/thr, {r['GB_s_min']:.1f}-{r['GB_s_max']:.1f}) "
            f"{r['ms_median']:7.2f} ms")
    if "prof_util" in r:
        text += (f" | util {r['prof_util']:.2f} wake {r['prof_wake_us']:.0f}/{r['prof_wake_max_us']:.0f} us "
                 f"gu {r['prof_gu_us']:.0f} us (wait {r['prof_gu_wait_us']:.0f}, busy {r['prof_gu_busy_GB_s_thread']:.2f}"
                 f" GB/s/thr) dn {r['prof_dn_us']:.0f} us (wait {r['prof_dn_wait_us']:.0f}, busy "
                 f"{r['prof_dn_busy_GB_s_thread']:.2f}) chunk {r['prof_chunk_gu']:.0f}/{r['prof_chunk_dn']:.0f} "
                 f"py {r['prof_python_share'] * 100:.0f} %")
    if r["foreign_cores"] > 0.5:
        text += f" | foreign {r['foreign_cores']:.1f} cores (steal {r['steal_cores']:.1f})"
    return text


def short(build: str) -> str:
    """A build's name as the summary prints it."""
    return build


def print_tables(rows: list[dict]) -> None:
    """Per type, k and T: the base build's modes by page kind and thread count, the --ab builds' pool by page kind at
    their thread counts, then the digest of the most threads (small enough for the device tool's output tail)."""
    print("\n=== summary (GB/s of expert weights; per-configuration lines and the JSON above and below)")
    for typ, k, n_tokens in dict.fromkeys((r["type"], r["k"], r["T"]) for r in rows):
        sel = [r for r in rows if r["type"] == typ and r["k"] == k and r["T"] == n_tokens]
        base = [r for r in sel if r["build"] == "base"]
        threads = sorted({r["threads"] for r in base})
        print(f"{typ + ' (down ' + sel[0]['down_type'] + f') k={k} T=' + str(n_tokens) + ', base by threads':<42}"
              + " ".join(f"{t:>5}" for t in threads))
        lines = {}
        for r in base:
            lines.setdefault((r["pages"], r["mode"]), {})[r["threads"]] = r["GB_s"]
        for (pages, mode), by in lines.items():
            print(f"  {pages:<4} {mode:<5}" + " " * 30 + " ".join(f"{by[t]:5.1f}" if t in by else "    -" for t in threads))
        ab = [r for r in sel if r["build"] != "base"]
        if ab:
            cols = list(dict.fromkeys((r["pages"], r["threads"]) for r in ab))
            print("  pool of" + " " * 30 + " ".join(f"{p[:4] + '/' + str(t):>7}" for p, t in cols))
            for bname in dict.fromkeys(r["build"] for r in ab):
                by = {(r["pages"], r["threads"]): r["GB_s"] for r in ab if r["build"] == bname}
                print(f"  {short(bname)[:36]:<36} " + " ".join(f"{by[c]:7.1f}" if c in by else "      -" for c in cols))
        for line in digest(sel):
            print("  " + line)


def digest(sel: list[dict]) -> list[str]:
    """At the most threads, per page kind: pool / touch / read / hot, the base profile, the best build; and the
    one-thread rate the busy threads are held to."""
    top = max(r["threads"] for r in sel)
    get = {(r["pages"], r["mode"], r["build"], r["threads"]): r for r in sel}
    out = []
    for pages in dict.fromkeys(r["pages"] for r in sel):
        def gbs(mode, build="base", threads=top):
            r = get.get((pages, mode, build, threads))
            return f"{r['GB_s']:.1f}" if r else "-"
        text = f"{pages}/{top}: pool {gbs('pool')} touch {gbs('touch')} read {gbs('read')} hot {gbs('hot')}"
        base = get.get((pages, "pool", "base", top))
        one = get.get((pages, "pool", "base", 1))
        if base and "prof_util" in base:  # gate/up and down: barrier waits, GB/s per busy thread
            text += (f" | util {base['prof_util']:.2f} wake {base['prof_wake_us']:.0f} us waits "
                     f"{base['prof_gu_wait_us']:.0f}/{base['prof_dn_wait_us']:.0f} us busy "
                     f"{base['prof_gu_busy_GB_s_thread']:.2f}/{base['prof_dn_busy_GB_s_thread']:.2f}"
                     + (f" (1 thr {one['prof_gu_busy_GB_s_thread']:.2f}/{one['prof_dn_busy_GB_s_thread']:.2f})"
                        if one and "prof_util" in one else "") + f" py {base['prof_python_share'] * 100:.0f} %")
        builds = [r for r in sel if r["pages"] == pages and r["mode"] == "pool" and r["threads"] == top]
        if base and len(builds) > 1:
            best = max(builds, key=lambda r: r["GB_s"])
            text += f" | best {short(best['build'])} {best['GB_s']:.1f} ({(best['GB_s'] / base['GB_s'] - 1) * 100:+.0f} %)"
        foreign = max(r["foreign_cores"] for r in sel if r["pages"] == pages)
        steal = max(r["steal_cores"] for r in sel if r["pages"] == pages)
        if foreign > 0.5:
            text += f" | WARNING: {foreign:.1f} cores busy elsewhere ({steal:.1f} stolen by the hypervisor)"
        out.append(text)
    return out


def default_file_dir(gb: float) -> str:
    """/dev/shm where it holds gb GB more, else the temporary directory."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > gb * 1e9:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_0,Q2_K",
                    help="comma-separated GGML type names, or 'all' (every type the pool has a kernel for)")
    ap.add_argument("--threads", default=None,
                    help="pool threads, comma-separated (default: STRATA_POOL_THREADS or all cores; --sweep: 1,2,4,8,16)")
    ap.add_argument("--ab-threads", default=None, help="thread counts of the --ab builds (default: the fewest and most)")
    ap.add_argument("--isa", choices=[name for name, _, _ in native.ISAS], default=None,
                    help="the base build's ISA (default: the best this CPU runs)")
    ap.add_argument("--gb", type=float, default=4.0, help="expert weights in memory per type and page kind, GB")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--ff", type=int, default=640)
    ap.add_argument("--k", default="10", help="experts per layer call, comma-separated (each its own expert sets)")
    ap.add_argument("--tokens", default=None, help="rows per expert, comma-separated (default 1,4; --sweep: 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per configuration and round "
                                                            "(default 10; --sweep: 3)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 1; --sweep: 2)")
    ap.add_argument("--variant", action="append", default=[],
                    help="build every kernel with -DNAME=VALUE")
    ap.add_argument("--ab", action="append", default=[],
                    help="one more build: comma-separated NAME=VALUE defines and/or an ISA (e.g. avx2)")
    ap.add_argument("--old", default=None, help="another tree's kernels/ folder, built as 'old' (an --ab build: the "
                    "base's defines and ISA)")
    ap.add_argument("--pages", default=None, help=f"page kinds, comma-separated, of {','.join(pool_memory.PAGES)} "
                                                  "(default anon; --sweep: 4k,huge,file)")
    ap.add_argument("--modes", default=None, help=f"comma-separated, of {','.join(MODES)} "
                                                  "(default pool,read; --sweep: all)")
    ap.add_argument("--file-dir", default=None, help="where the file page kind writes its experts (default: /dev/shm "
                                                     "where it has room: no disk writes, 4 KB file pages all the same;"
                                                     " else $TMPDIR)")
    ap.add_argument("--json", default=None, help="also write the JSON document to this file")
    ap.add_argument("--sweep", action="store_true", help="the diagnosis defaults above, one JSON document last")
    args = ap.parse_args()

    def ints(text, what):
        try:
            vals = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            vals = []
        if not vals or min(vals) < 1:
            ap.error(f"--{what}: positive integers, comma-separated (got {text!r})")
        return vals

    cores = default_threads()
    sweep = args.sweep
    args.threads = ints(args.threads, "threads") if args.threads else (
        sorted({min(t, cores) for t in (1, 2, 4, 8, 16)}) if sweep else [cores])
    args.ab_threads = ints(args.ab_threads, "ab-threads") if args.ab_threads else sorted({min(args.threads),
                                                                                        max(args.threads)})
    args.ks = ints(args.k, "k")
    args.tokens = ints(args.tokens, "tokens") if args.tokens else ([1] if sweep else [1, 4])
    args.iters = args.iters or (3 if sweep else 10)
    args.rounds = args.rounds or (2 if sweep else 1)
    args.pages = (args.pages or ("4k,huge,file" if sweep else "anon")).split(",")
    args.modes = (args.modes or (",".join(MODES) if sweep else "pool,read")).split(",")
    bad = [p for p in args.pages if p not in pool_memory.PAGES] + [m for m in args.modes if m not in MODES]
    if bad:
        ap.error(f"unknown page kind or mode: {', '.join(bad)} (pages: {', '.join(pool_memory.PAGES)}; modes: "
                 f"{', '.join(MODES)})")
    if args.old and not (Path(args.old) / native.SOURCE).is_file():
        ap.error(f"--old {args.old}: no {native.SOURCE} there")
    for spec in args.ab:
        try:
            parse_build(spec)
        except ValueError as e:
            ap.error(f"--ab {spec!r}: {e}")
    names = sorted(native.NATIVE_TYPES, key=native.NATIVE_TYPES.get) if args.types == "all" else args.types.split(",")
    unknown = [n for n in names if n not in native.NATIVE_TYPES]
    if unknown:
        ap.error(f"--types: no pool kernel for {', '.join(unknown)} (known: {', '.join(sorted(native.NATIVE_TYPES))})")
    if native._compiler() is None:
        raise SystemExit("pool_bench: no C compiler, the pool would run on numpy: nothing to measure")

    l3 = pool_memory.l3_bytes()
    thp = pool_memory.thp_modes()
    args.file_dir = args.file_dir or default_file_dir(args.gb * 3)
    file_dir = args.file_dir
    print(f"host: {cores} cores for this process, L3 {l3 / 2**20:.0f} MiB, THP {thp}, file pages in {file_dir} "
          f"({pool_memory.fs_type(file_dir)}), load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '-')}"
          f" OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')}"
          f" OMP_PROC_BIND={os.environ.get('OMP_PROC_BIND', '-')}", flush=True)
    builds = load_builds(args)
    rows: list[dict] = []
    t0 = time.perf_counter()
    for name in names:
        for k in args.ks:
            bench_type(name, argparse.Namespace(**dict(vars(args), k=k)), builds, l3, rows)
    print_tables(rows)
    reads = [r for r in rows if r["mode"] == "read" and r["threads"] == max(args.threads)]
    read = statistics.median([r["GB_s"] for r in reads]) if reads else None
    if read is not None:
        print(f"plain read of the same experts: {read:.1f} GB/s ({max(args.threads)} threads, median over types "
              f"and page kinds); {time.perf_counter() - t0:.0f} s of timing")
    doc = json.dumps({"threads": args.threads, "isa": builds["base"].isa, "variant": args.variant, "ab": args.ab,
                      "gb": args.gb, "k": args.ks, "l3_bytes": l3, "thp": thp, "cores": cores, "plain_read_GB_s": read,
                      "file_dir": file_dir, "file_fs": pool_memory.fs_type(file_dir),
                      "builds": {n: dict(native.build_config(lib), isa=lib.isa) for n, lib in builds.items()},
                      "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            f.write(doc + "\n")
    print(doc)


if __name__ == "__main__":
    main()
