"""Compile every kernel module (kernels/*.cu and each block type's gemv_quant variant) in parallel processes, so
that CuPy's on-disk kernel cache is warm before tests or benchmarks start (a cold NVRTC compile of the whole set
takes minutes in one process).

    python3 bench/warm_kernels.py [--jobs N] [MODULE ...]   (default: every module; e.g. gdn gemv_quant.q4_k)
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor, as_completed


def _compile(name: str) -> tuple[str, float]:
    from strata_cli.gpu.compile import module

    t0 = time.perf_counter()
    module(name)
    return name, time.perf_counter() - t0


def module_names() -> list[str]:
    from strata_cli.gpu.compile import module_names as every_module

    # the longest compiles first (measured on the H200's host: gemv_q8r ~26 s, each gemv_quant type ~20-30 s, the
    # rest ~1 s): a long one submitted last sets the whole warm-up's time
    names = every_module()
    first = [name for name in names if name == "gemv_q8r" or name.startswith("gemv.q8_0")]
    return first + [name for name in names if name not in first]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("modules", nargs="*", help="module names (kernels/<name>.cu, gemv_quant.<type>); default all")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        # printed as each finishes, so a cut run still shows which modules are in the cache
        for done in as_completed([pool.submit(_compile, name) for name in args.modules or module_names()]):
            name, seconds = done.result()
            print(f"{name:24} {seconds:6.1f} s", flush=True)
    print(f"# all modules compiled in {time.perf_counter() - t0:.1f} s with {args.jobs} processes", flush=True)


if __name__ == "__main__":
    main()
