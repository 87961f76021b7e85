"""GB/s of the block-type GEMVs (kernels/gemv_quant.cu) per GGML type: dense at T = 1, 4, 8, 16 and the routed
experts (512 experts, top-10, Flash-Next's 2560 x 640) at T = 1 and 8, next to the repacked Q8_0 kernels.

    python3 bench/quant_gemv_bench.py [--window T ...] [--launches N] [--mbytes M] [--types Q4_K,IQ2_XS,...]
                                      [--versions v1,v2]

--versions runs every type under each of gemv_quant.cu's kernel sets (launch_quant's STRATA_QUANT_GEMV: v1 the
per-lane decoder, v2 the staged one), one table row per type and version (Q8_0_R32 has one kernel: one row).

Dense: one matrix of about M MB (default 512, far over the 50 MB L2) with 5120-wide rows, launched N times back to
back inside one CUDA graph (as gemv_bench.py); GB/s = the matrix's bytes / time per launch. Experts: moe_group, the
three grouped GEMVs and the combine in one launch sequence; GB/s = the bytes of the distinct experts the routing
selects / time. Down projections whose 640-wide rows do not fit the type's block use Q5_0 (llama-quantize's
fallback for Q4_K; the bytes count what is read). Weights are random bytes made on the device: values do not
change the time (no data-dependent control flow; the i-quant grid lookups stay random, as in real files).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gemv_bench import graph_ms

from strata_cli.gpu import launch_gemv, launch_moe
from strata_cli.gpu.graphs import new_stream
from strata_cli.gpu.quant_source import TYPES
from strata_cli.gpu.runtime import cupy
from strata_cli.model import quants as Q
from strata_cli.model.packed import Q8_0_R32

PEAK_GBS = 4400.0  # what a device-to-device copy reaches on the H200 (docs/BENCHMARKS.md); reported as a fraction
N_IN = 5120
E, F, D, K = 512, 640, 2560, 10


def _random_bytes(n: int):
    cp = cupy()
    return cp.random.randint(0, 256, size=n, dtype=cp.uint8)


def dense_rows(ggml_type: int, n_in: int, T: int, launches: int, mbytes: int, stream) -> tuple[float, int]:
    cp = cupy()
    row_bytes = Q.row_bytes(Q.Q8_0 if ggml_type == Q8_0_R32 else ggml_type, n_in)
    n_out = max(32, (mbytes * 10**6 // row_bytes) // 32 * 32)
    w = _random_bytes(n_out * row_bytes).reshape(n_out, row_bytes)
    x = cp.ones((T, n_in), cp.float32)
    y = cp.empty((T, n_out), cp.float32)
    split = launch_gemv.SplitK.empty()
    ms = graph_ms(lambda s: launch_gemv.gemv(w, ggml_type, n_in, x, out=y, split=split, stream=s), launches, stream)
    del w
    return ms, n_out * row_bytes


def expert_rows(ggml_type: int, T: int, launches: int, stream, rng) -> tuple[float, int]:
    cp = cupy()
    down_type = ggml_type if F % Q.BLOCK[Q.Q8_0 if ggml_type == Q8_0_R32 else ggml_type][0] == 0 else Q.Q5_0
    types = (ggml_type, ggml_type, down_type)

    def rb(t, n):
        return Q.row_bytes(Q.Q8_0 if t == Q8_0_R32 else t, n)

    gate = _random_bytes(E * F * rb(ggml_type, D)).reshape(E, F, -1)
    up = _random_bytes(E * F * rb(ggml_type, D)).reshape(E, F, -1)
    down = _random_bytes(E * D * rb(down_type, F)).reshape(E, D, -1)
    ids_host = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    ids = cp.asarray(ids_host)
    wts = cp.full((T, K), 0.1, cp.float32)
    x = cp.ones((T, D), cp.float32)
    y = cp.empty((T, D), cp.float32)
    scratch = launch_moe.MoeScratch.empty(T * K, F, D)
    ms = graph_ms(lambda s: launch_moe.routed_experts(x, ids, wts, gate, up, down, types, out=y, scratch=scratch,
                                                      stream=s), launches, stream)
    n_distinct = len(np.unique(ids_host))
    per_expert = 2 * F * rb(ggml_type, D) + D * rb(down_type, F)
    return ms, n_distinct * per_expert


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--mbytes", type=int, default=512)
    ap.add_argument("--types", default="")
    ap.add_argument("--versions", default="", help="comma-separated STRATA_QUANT_GEMV values (default: as set)")
    args = ap.parse_args()
    versions = [v.strip() for v in args.versions.split(",") if v.strip()] or [os.environ.get("STRATA_QUANT_GEMV", "")]
    cupy()
    stream = new_stream()
    rng = np.random.default_rng(0)
    names = {Q.TYPE_NAMES[t]: t for t in TYPES} | {"Q8_0_R32": Q8_0_R32}
    chosen = [names[n.strip().upper() if n.strip().upper() in names else n.strip()]
              for n in args.types.split(",") if n.strip()] or [Q8_0_R32, *TYPES]
    t0 = time.perf_counter()
    print(f"{'type':9} {'gemv':>4} {'bpw':>6} " + " ".join(f"{'T=' + str(T) + ' GB/s':>11}" for T in args.window)
          + f" {'%peak T=1':>9} {'moe T=1 GB/s':>13} {'moe T=8 GB/s':>13} {'moe T=1 ms':>10}", flush=True)
    for t in chosen:
        name = "Q8_0_R32" if t == Q8_0_R32 else Q.TYPE_NAMES[t]
        bpw = Q.QUANT_TYPES[Q.Q8_0 if t == Q8_0_R32 else t].bits_per_weight
        for version in versions[:1] if t == Q8_0_R32 else versions:
            if version:
                os.environ["STRATA_QUANT_GEMV"] = version
            dense = []
            for T in args.window:
                ms, nbytes = dense_rows(t, N_IN, T, args.launches, args.mbytes, stream)
                dense.append(nbytes / ms / 1e6)
            moe1, bytes1 = expert_rows(t, 1, args.launches, stream, rng)
            moe8, bytes8 = expert_rows(t, 8, args.launches, stream, rng)
            cupy().get_default_memory_pool().free_all_blocks()
            print(f"{name:9} {version or '-':>4} {bpw:6.3f} " + " ".join(f"{g:11.0f}" for g in dense)
                  + f" {100 * dense[0] / PEAK_GBS:8.1f}% {bytes1 / moe1 / 1e6:13.0f} {bytes8 / moe8 / 1e6:13.0f}"
                  + f" {moe1:10.4f}", flush=True)
    print(f"# {time.perf_counter() - t0:.1f} s; dense {args.mbytes} MB matrices x {N_IN} wide; moe E={E} F={F} "
          f"D={D} K={K}; {args.launches} launches per graph", flush=True)


if __name__ == "__main__":
    main()
