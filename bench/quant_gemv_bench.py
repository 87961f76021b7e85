"""GB/s of the routed-expert GEMVs per GGML block type on Flash-Next's expert shapes (512 experts of gate / up
[640 x 2560] and down [2560 x 640], top-10), T = 1, 2, 4, 8 window rows, against a measured device-to-device copy.

    python3 bench/quant_gemv_bench.py [--types Q4_K,IQ2_XS,...] [--window T ...] [--launches N] [--jobs J]
                                      [--probe]

Each type's experts are what the GPU engine runs: Q8_0 experts are repacked to Q8_0_R32 at load time
(engine/gpu/weights.py), so the Q8_0 rows time kernels/gemv_q8r.cu's grouped GEMVs (path "q8r"); every other
block type kernels/gemv_quant.cu's. Per type (and variant), first the check: routed_experts (moe_group, gate + up
in one launch, down, combine) at every timed T on valid random blocks of 12 experts of the real shapes, routed
top-10 (groups of up to T entries), against ops/moe.routed_experts (numpy over gguf.quants' dequantization), as the
max error relative to the reference's largest value (rel_err).
Then the timing, on random bytes of all 512 experts (values do not change the time: no data-dependent control
flow; i-quant grid lookups stay random as in real files), each of the N launches of one CUDA graph with its own
routing (T rows of 10 distinct experts drawn at random, grouped by moe_group before the capture), so the experts a
launch reads are rarely still in the 50 MB L2:
  gateup   launch_moe.launch_gateup_experts: bytes = gate + up rows of the window's distinct experts
  down     the down projection (the type itself when 640 holds whole blocks, else Q4_0, as llama-quantize's
           files have it: the row names its down type); bytes = the distinct experts' down rows
  moe      launch_moe.routed_experts whole (group, gateup, down, combine); bytes = both
GB/s = bytes / time per launch; %copy = GB/s / the copy rate, where the copy rate is what cupy's device-to-device
copy of 2 GB reaches counting the bytes read and written (the bandwidth a streaming read can get).
The grouped expert GEMVs of the block types have one path, the tensor-core qtc_* kernels (the row's "path": tc).
--probe adds, per block type, the same rows under launch_quant.PROBE_DEFINES (variant "probe": the qtc_* grids and
stage rings streaming the weights and decoding nothing; rel_err ~1 by design): probe / full time is the share of a
launch the decode takes.
Default types then Q2_K,Q4_0,Q8_0 with --probe.

Dense rows (with Q8_0 in the types): the window's dense Q8_0 GEMVs as the engine holds them (Q8_0_R32, the path
launch_util.window_path(T) picks: "q8r" or "q8r_tc") on Flash-Next's shapes (DENSE_SHAPES), each first checked on
valid random blocks of its first 64 rows against ops/gemv.gemv (rel_err), then timed on random bytes of the whole
matrix: GB/s = its bytes / time per launch. Then the shared expert's gate + up pair (`shexp_gu`, path q8r_gu where
it is one launch, T <= 2) as launch_moe.shared_expert launches it: compare its us with two shexp_up launches.

All device work runs on the timing stream (a non-blocking stream does not wait for the legacy default stream: a
graph's eager warm-up once read moe_group's outputs before they were written, and garbage entry rows faulted).

"# graph node floor": the time a graph node of an empty kernel takes, which every timed launch pays too.

Last line: one JSON document {"copy_gbs": ..., "node_us": ..., "rows": [{"type", "down_type", "T", "rel_err", "gateup_gbs",
"gateup_pct", "down_gbs", "down_pct", "moe_gbs", "moe_pct", "moe_us", "path", "variant"}, ...], "dense": [{"type",
"matrix", "n_out", "n_in", "T", "path", "rel_err", "gbs", "pct", "us"}, ...], "seconds": ...}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from gemv_bench import graph_ms

from strata_cli.gpu import compile as nvrtc
from strata_cli.gpu import launch_gemv, launch_moe, launch_quant
from strata_cli.gpu import launch_util as U
from strata_cli.gpu.graphs import new_stream
from strata_cli.gpu.runtime import cupy
from strata_cli.model import packed
from strata_cli.model import quants as Q
from strata_cli.ops import moe as ref_moe
from strata_cli.ops.gemv import dequant_rows
from strata_cli.ops.gemv import gemv as ref_gemv
from strata_cli.synth.blocks import random_tensor

E, F, D, K = 512, 640, 2560, 10
CHECK_E = 12  # the reference check: a few experts of the real shapes
DEFAULT_TYPES = "Q8_0,Q4_0,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ2_XS,IQ3_XXS,IQ4_XS,MXFP4"
AB_TYPES = "Q2_K,Q4_0,Q8_0"
# The window's dense GEMVs on Flash-Next (profiles/presets/flash-next.yaml), [n_out, n_in]: the GDN layer's one
# [qkv | z] projection (q, k 16 x 128 each, v 48 x 128; z 48 x 128) and its out-projection; the shared expert's up and
# gate (this shape each; one launch of both at T <= 2: gateup_rows) and down; the hyper-connection read's stacked down + inject matrix (320 + 4 rows,
# padded to whole 32-row groups: ops/hyper.down_inject_rows); the head. (The router is F32, fused into
# router_gemv_topk; the hc up matrix is read raw inside hc_up_mix: neither is a Q8_0 GEMV launch.)
DENSE_SHAPES = {"gdn_qkvz": (16384, 2560), "gdn_out": (2560, 6144), "shexp_up": (640, 2560), "shexp_down": (2560, 640),
                "hc_down": (352, 10240), "head": (248320, 2560)}
DENSE_CHECK_ROWS = 64


def copy_gbs() -> float:
    """Device-to-device copy rate of a 2 GB buffer, bytes read + written per second (GB/s)."""
    cp = cupy()
    n = 2 * 10**9
    src, dst = cp.ones(n, cp.uint8), cp.empty(n, cp.uint8)
    dst[...] = src
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(5):
        dst[...] = src
    end.record()
    end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end) / 5
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * n / ms / 1e6


def down_type(ggml_type: int) -> int:
    return ggml_type if F % Q.BLOCK[ggml_type][0] == 0 else Q.Q4_0


def device_types(ggml_type: int) -> tuple[int, int, int]:
    """(gate, up, down) types as the engine holds them: Q8_0 repacked (every expert matrix has rows in groups of 32),
    the rest raw."""
    types = (ggml_type, ggml_type, down_type(ggml_type))
    return tuple(packed.Q8_0_R32 if t == Q.Q8_0 else t for t in types)


def uses_quant_kernels(ggml_type: int) -> bool:
    """Whether the type's expert GEMVs run kernels/gemv_quant.cu (the probe applies), not gemv_q8r.cu."""
    return any(launch_quant.handles(t) for t in device_types(ggml_type))


@dataclass
class Check:
    """The reference check's cases, one per timed T: routed_experts' inputs on the device (Q8_0 repacked) and
    numpy's answer; made once per type for every path and variant."""

    types: tuple
    cases: list  # (x, ids, w, gate, up, down) on the device, want [T, D]


def make_check(ggml_type: int, windows, rng, stream) -> Check:
    """CHECK_E valid random experts of the real shapes, routed top-K as the real ones (groups of up to T entries:
    every kernel bucket the timing runs), and numpy's routed_experts over their dequantized weights."""
    raw_types = (ggml_type, ggml_type, down_type(ggml_type))
    raw = [random_tensor(rng, t, shape, 0.05) for t, shape in
           zip(raw_types, ((CHECK_E, F, D), (CHECK_E, F, D), (CHECK_E, D, F)))]
    wg, wu = (dequant_rows(a, raw_types[0], D).reshape(CHECK_E, F, D) for a in raw[:2])
    wd = dequant_rows(raw[2], raw_types[2], F).reshape(CHECK_E, D, F)
    dev = [packed.pack_q8_0(a, n_in) if t == Q.Q8_0 else a for a, t, n_in in zip(raw, raw_types, (D, D, F))]
    cases = []
    with stream:
        weights = [cupy().asarray(a) for a in dev]
        for T in windows:
            x = rng.standard_normal((T, D)).astype(np.float32)
            ids, w = ref_moe.router_topk(rng.standard_normal((T, CHECK_E)).astype(np.float32), K)
            want = ref_moe.routed_experts(x, ids, w, lambda e: (wg[e], wu[e], wd[e]))
            cases.append(((*(cupy().asarray(a) for a in (x, ids, w)), *weights), want))
    stream.synchronize()
    return Check(device_types(ggml_type), cases)


def check_rel_err(check: Check, stream) -> float:
    """max over the cases of max |gpu - numpy| / max |numpy| of routed_experts under the current variant
    (NaN-poisoned output: an unwritten row is NaN)."""
    err = 0.0
    for args, want in check.cases:
        with stream:
            out = cupy().full(want.shape, np.nan, np.float32)
            launch_moe.routed_experts(*args, check.types, out=out, stream=stream)
            got = out.get(stream=stream)
        stream.synchronize()
        err = max(err, float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30)))
    return err


def node_floor_ms(launches: int, stream) -> float:
    """ms per node of a graph of empty kernels: what a launch costs inside the graph before it reads a byte."""
    nop = cupy().RawKernel('extern "C" __global__ void nop() {}', "nop")

    def record(s):
        with U.on_stream(s):
            nop((1,), (32,), ())

    return graph_ms(record, launches, stream)


def _random_bytes(n: int):
    cp = cupy()
    return cp.random.randint(0, 256, size=n, dtype=cp.uint8)


class Experts:
    """All 512 experts of one type as random bytes and each T's routings (grouped once), reused by every variant;
    everything made on the timing stream."""

    def __init__(self, ggml_type: int, windows, launches: int, stream, rng):
        cp = cupy()
        self.types = device_types(ggml_type)
        gt, _, dt = self.types
        rb_gate, rb_down = U.row_stride(gt, D), U.row_stride(dt, F)
        self.gs, self.ds = F * rb_gate, D * rb_down
        self.launches = launches
        self.routings = {}
        with stream:
            self.gate = _random_bytes(E * F * rb_gate).reshape(E, F, rb_gate)
            self.up = _random_bytes(E * F * rb_gate).reshape(E, F, rb_gate)
            self.down = _random_bytes(E * D * rb_down).reshape(E, D, rb_down)
            for T in windows:
                J = T * K
                sets = []
                for _ in range(launches):
                    ids_host = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
                    ids = cp.asarray(ids_host)
                    groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
                    launch_moe.group_entries(ids, J, groups)
                    sets.append((ids, groups, len(np.unique(ids_host))))
                self.routings[T] = (sets, cp.ones((T, D), cp.float32), cp.full((T, K), 0.1, cp.float32),
                                    cp.empty((T, D), cp.float32), launch_moe.MoeScratch.empty(J, F, D))
        stream.synchronize()

    def times(self, T: int, stream) -> dict:
        """ms per launch of gateup, down and the whole routed_experts at T, and the bytes each reads."""
        gt, ut, dt = self.types
        gate, up, down, gs, ds = self.gate, self.up, self.down, self.gs, self.ds
        sets, x, wts, y, scratch = self.routings[T]
        J = T * K
        h, parts = scratch.h, scratch.parts
        turn = [0]

        def next_set():
            turn[0] += 1
            return sets[turn[0] % len(sets)]

        def gateup(s):
            with U.on_stream(s):
                launch_moe.launch_gateup_experts((gate, gt, gs), (up, ut, gs), E, next_set()[1], J, T, x, K, h)

        def down_only(s):
            with U.on_stream(s):
                launch_moe.launch_expert_gemv(down, dt, ds, E, next_set()[1], J, T, h, 1, F, parts)

        def whole(s):
            launch_moe.routed_experts(x, next_set()[0], wts, gate, up, down, self.types, out=y, scratch=scratch,
                                      stream=s)

        ms = {name: graph_ms(fn, self.launches, stream) for name, fn in
              (("gateup", gateup), ("down", down_only), ("moe", whole))}
        n_distinct = sum(st[2] for st in sets) / len(sets)
        nbytes = {"gateup": n_distinct * 2 * gs, "down": n_distinct * ds}
        nbytes["moe"] = nbytes["gateup"] + nbytes["down"]
        return {"T": T, "ms": ms, "bytes": nbytes}

    def free(self) -> None:
        del self.gate, self.up, self.down, self.routings
        cupy().get_default_memory_pool().free_all_blocks()


def dense_rows(T_list, launches: int, stream, rng, copy: float) -> list[dict]:
    """The dense Q8_0 rows: per DENSE_SHAPES matrix and T, rel_err of its first DENSE_CHECK_ROWS rows (valid random
    blocks, repacked) against ops/gemv.gemv, then GB/s of the whole matrix of random bytes."""
    cp = cupy()
    rows = []
    split = launch_gemv.SplitK.empty()  # the z-split workspace, allocated before any capture
    for name, (n_out, n_in) in DENSE_SHAPES.items():
        row_bytes = U.row_stride(Q.Q8_0, n_in)
        raw = random_tensor(rng, Q.Q8_0, (DENSE_CHECK_ROWS, n_in), 0.05)
        with stream:
            small = cp.asarray(packed.pack_q8_0(raw, n_in))
            w = _random_bytes(n_out * row_bytes).reshape(n_out, row_bytes)
        stream.synchronize()
        for T in T_list:
            x = rng.standard_normal((T, n_in)).astype(np.float32)
            want = ref_gemv(raw, Q.Q8_0, n_in, x)
            with stream:
                got = launch_gemv.gemv(small, packed.Q8_0_R32, n_in, cp.asarray(x),
                                       out=cp.full((T, DENSE_CHECK_ROWS), np.nan, np.float32), split=split,
                                       stream=stream).get(stream=stream)
                xd, y = cp.asarray(x), cp.empty((T, n_out), cp.float32)
            stream.synchronize()
            err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
            ms = graph_ms(lambda s: launch_gemv.gemv(w, packed.Q8_0_R32, n_in, xd, out=y, split=split, stream=s),
                          launches, stream)
            gbs = n_out * row_bytes / ms / 1e6
            row = {"type": "Q8_0", "matrix": name, "n_out": n_out, "n_in": n_in, "T": T,
                   "path": "q8r_tc" if U.q8r_tensor_cores(T) else "q8r", "rel_err": err, "gbs": round(gbs, 1),
                   "pct": round(100 * gbs / copy, 1), "us": round(1000 * ms, 2)}
            rows.append(row)
            print(f"# dense Q8_0 {name:10} [{n_out} x {n_in}] T={T:2} {row['path']:6} rel_err {err:.1e} "
                  f"{gbs:6.0f} GB/s {row['pct']:5.1f} % {row['us']:8.1f} us", flush=True)
        w = small = None  # (freed before the next matrix)
        cp.get_default_memory_pool().free_all_blocks()
    return rows + gateup_rows(T_list, launches, stream, rng, copy)


def _gateup(w_gate, w_up, n_in: int, x, y, split, stream) -> None:
    """The shared expert's h = silu(x @ gate^T) * (x @ up^T) as launch_moe.shared_expert launches it, on stream: one
    launch where launch_gemv.gateup_fuses (T <= 2), else up, then gate with mul = h."""
    R32 = packed.Q8_0_R32
    with stream:
        if launch_gemv.gateup_fuses((R32, R32), x.shape[0]):
            launch_gemv.launch_q8r_gateup(w_gate, w_up, n_in, x, y, split)
            return
        launch_gemv.launch_gemv(w_up, R32, n_in, x, y, split)
        launch_gemv.launch_gemv(w_gate, R32, n_in, x, y, split, act=U.ACT_SILU, mul=y, mul_strides=(y.shape[1], 1))


def gateup_rows(T_list, launches: int, stream, rng, copy: float) -> list[dict]:
    """The shared expert's gate + up pair (DENSE_SHAPES' shexp_up twice) as the window launches it (_gateup): rel_err
    of its first DENSE_CHECK_ROWS rows against numpy, GB/s of both matrices' bytes (compare its us with two
    shexp_up launches)."""
    cp = cupy()
    n_out, n_in = DENSE_SHAPES["shexp_up"]
    row_bytes = U.row_stride(Q.Q8_0, n_in)
    split = launch_gemv.SplitK.empty()
    raws = [random_tensor(rng, Q.Q8_0, (DENSE_CHECK_ROWS, n_in), 0.05) for _ in range(2)]
    with stream:
        small = [cp.asarray(packed.pack_q8_0(r, n_in)) for r in raws]
        big = [_random_bytes(n_out * row_bytes).reshape(n_out, row_bytes) for _ in range(2)]
    stream.synchronize()
    rows = []
    for T in T_list:
        x = rng.standard_normal((T, n_in)).astype(np.float32)
        g, u = (ref_gemv(r, Q.Q8_0, n_in, x) for r in raws)
        want = g / (1.0 + np.exp(-g)) * u
        with stream:
            got = cp.full((T, DENSE_CHECK_ROWS), np.nan, np.float32)
            xd, y = cp.asarray(x), cp.empty((T, n_out), cp.float32)
            _gateup(*small, n_in, xd, got, split, stream)
            got = got.get(stream=stream)
        stream.synchronize()
        err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
        ms = graph_ms(lambda s: _gateup(*big, n_in, xd, y, split, s), launches, stream)
        gbs = 2 * n_out * row_bytes / ms / 1e6
        path = "q8r_gu" if launch_gemv.gateup_fuses((packed.Q8_0_R32,) * 2, T) else (
            "q8r_tc" if U.q8r_tensor_cores(T) else "q8r")
        row = {"type": "Q8_0", "matrix": "shexp_gateup", "n_out": n_out, "n_in": n_in, "T": T, "path": path,
               "rel_err": err, "gbs": round(gbs, 1), "pct": round(100 * gbs / copy, 1), "us": round(1000 * ms, 2)}
        rows.append(row)
        print(f"# dense Q8_0 {'shexp_gu':10} [2 x {n_out} x {n_in}] T={T:2} {path:6} rel_err {err:.1e} "
              f"{gbs:6.0f} GB/s {row['pct']:5.1f} % {row['us']:8.1f} us", flush=True)
    return rows


def _compile(job: tuple[str, tuple[str, ...]]) -> float:
    t0 = time.perf_counter()
    nvrtc.module(*job)
    return time.perf_counter() - t0


def warm(types, variants, jobs: int) -> None:
    """Compile the modules the bench launches (each variant's gemv_quant modules, gemv_q8r) in parallel processes
    (CuPy's disk cache), before any timing."""
    mods = {("moe", ()), ("gemv_q8r", ())}
    for t in types:
        for dt in set(device_types(t)):
            if launch_quant.handles(dt):
                mods |= {(launch_quant.module_name(dt), v.qtc) for v in variants if v.applies(t)}
            elif dt != packed.Q8_0_R32:
                mods.add((f"gemv.{U.TYPE_SUFFIX[dt]}", ()))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(_compile, sorted(mods)))


@dataclass(frozen=True)
class Variant:
    """A row set's kernels: the defines its qtc_* modules (block types) are compiled with; "default" is what the
    engine runs (the only variant of Q8_0)."""

    label: str
    qtc: tuple = ()

    def applies(self, ggml_type: int) -> bool:
        return self.label == "default" or (bool(self.qtc) and uses_quant_kernels(ggml_type))


DEFAULT = Variant("default")


@contextlib.contextmanager
def variant_kernels(v: Variant):
    """The launches inside take v's kernels (launch_quant.qtc_defines for the qtc_* kernels)."""
    qtc = launch_quant.qtc_defines
    launch_quant.qtc_defines = v.qtc
    try:
        yield
    finally:
        launch_quant.qtc_defines = qtc


def _row(t: int, path: str, variant: str, err: float, r: dict, copy: float) -> dict:
    gbs = {k: r["bytes"][k] / r["ms"][k] / 1e6 for k in r["ms"]}
    row = {"type": Q.TYPE_NAMES[t], "down_type": Q.TYPE_NAMES[down_type(t)], "T": r["T"], "rel_err": err,
           "path": path, "variant": variant}
    for k in ("gateup", "down", "moe"):
        row[f"{k}_gbs"] = round(gbs[k], 1)
        row[f"{k}_pct"] = round(100 * gbs[k] / copy, 1)
    row["moe_us"] = round(1000 * r["ms"]["moe"], 2)
    print(f"{row['type']:8} {row['down_type']:6} {path:4} {r['T']:2} {err:8.1e} {gbs['gateup']:11.0f} "
          f"{row['gateup_pct']:5.1f} {gbs['down']:10.0f} {row['down_pct']:5.1f} {gbs['moe']:9.0f} "
          f"{row['moe_pct']:5.1f} {row['moe_us']:8.1f}  {variant}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=None, help=f"default {DEFAULT_TYPES} ({AB_TYPES} with --probe)")
    ap.add_argument("--window", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--probe", action="store_true", help="block types: also the decode-free probe's rows")
    args = ap.parse_args()
    names = {Q.TYPE_NAMES[t]: t for t in Q.BLOCK_TYPES}
    type_arg = args.types or (AB_TYPES if args.probe else DEFAULT_TYPES)
    unknown = [n for n in type_arg.split(",") if n.strip() and n.strip().upper() not in names]
    if unknown:
        ap.error(f"--types: unknown {', '.join(unknown)}")
    if any(T < 1 or T > U.GEMV_MAXT for T in args.window):
        ap.error(f"--window: every T must be 1..{U.GEMV_MAXT}, got {args.window}")
    types = [names[n.strip().upper()] for n in type_arg.split(",") if n.strip()]
    variants = [DEFAULT] + ([Variant("probe", qtc=launch_quant.PROBE_DEFINES)] if args.probe else [])
    t0 = time.perf_counter()
    warm(types, variants, args.jobs)
    print(f"# compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    stream = new_stream()
    rng = np.random.default_rng(0)
    copy = copy_gbs()
    print(f"# device-to-device copy {copy:.0f} GB/s (read + written)", flush=True)
    node_us = 1000 * node_floor_ms(args.launches, stream)
    print(f"# graph node floor {node_us:.2f} us (an empty kernel a node: each timed launch pays it)", flush=True)
    print(f"{'type':8} {'down':6} {'path':4} {'T':>2} {'rel_err':>8} {'gateup GB/s':>11} {'%':>5} {'down GB/s':>10} "
          f"{'%':>5} {'moe GB/s':>9} {'%':>5} {'moe us':>8}  variant", flush=True)
    rows, dense = [], []
    for t in types:
        check = make_check(t, args.window, rng, stream)
        experts = Experts(t, args.window, args.launches, stream, rng)
        path = "tc" if uses_quant_kernels(t) else "q8r"
        for v in (v for v in variants if v.applies(t)):
            with variant_kernels(v):
                err = check_rel_err(check, stream)
                rows += [_row(t, path, v.label, err, experts.times(T, stream), copy) for T in args.window]
        experts.free()
        if t == Q.Q8_0:
            dense = dense_rows(args.window, args.launches, stream, rng, copy)
    print(json.dumps({"copy_gbs": round(copy, 1), "node_us": round(node_us, 2), "rows": rows, "dense": dense,
                      "shape": {"E": E, "F": F, "D": D, "K": K, "launches": args.launches},
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
