"""The host kernels (kernels/expert_pool.c + expert_pool_decode.h): built on first use with the system C compiler into the strata cache,
loaded with ctypes (which drops the GIL for the length of every call).

Why a C file and not numba or a wheel: the pool's int8->float dot products vectorize only with explicit intrinsics
(a plain numba loop measured 12.7 GB/s on the device, the AVX2 C kernel 56.6 GB/s), a compiler
is on every Linux box strata targets, and building at first use keeps the package pure Python (no build step, no
new dependency). No compiler, or STRATA_POOL_NATIVE=0: load() returns None and the pool computes with numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from .. import settings
from ..model.quant_tables import host_header
from ..model.quants import TYPE_IDS

SOURCE = "expert_pool.c"
HEADERS = ("expert_pool_base.h", "expert_pool_simd.h", "expert_pool_decode.h", "expert_pool_dispatch.h",
           "expert_pool_groups.h", "expert_pool_grids.h", "expert_pool_limbs.h", "expert_pool_few.h",
           "expert_pool_plan.h", "expert_pool_serve.h")  # next to SOURCE, part of the build key
# The GGML types the C file decodes: every type of the table (tests/test_tiers_pool.py holds each to gguf.quants)
NATIVE_TYPES = dict(TYPE_IDS)
_VP, _I32, _I64, _U32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32
# strata_pool_swiglu(threads, H, F, G, gate, up, down, 3 row strides, 3 types, start, tok, dst, x, y, h)
SWIGLU_ARGS = [_I32, _I32, _I32, _I32, _VP, _VP, _VP, _I64, _I64, _I64, _I32, _I32, _I32, _VP, _VP, _VP, _VP, _VP, _VP]
# strata_pool_config's out[]: the build's tuning constants, in this order (kernels/expert_pool.c)
CONFIG_FIELDS = ("POOL_CHUNK", "PREFETCH_AHEAD", "ROWS_GATE_UP", "ROWS_DOWN", "perm", "POOL_MIN_TAKES")


def native_types() -> frozenset[int]:
    return frozenset(NATIVE_TYPES.values())


def source_path() -> Path:
    """kernels/expert_pool.c of a source checkout, or the copy installed as strata_cli/_kernels."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "kernels" / SOURCE, here / "_kernels" / SOURCE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{SOURCE} not found next to {here}")


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# the instruction sets the pool is built for, best first: (name, /proc/cpuinfo flags it needs, compiler flags)
ISAS = (("avx512vbmi", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_bitalg",
                        "avx512_vnni", "avx512dq"},
         ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vbmi", "-mavx512bitalg",
          "-mavx512vnni", "-mavx512dq"]),
        # Ice Lake's and later, Zen 4's: the grid i-quants' integer-product kernels (expert_pool_limbs.h)
        ("avx512", {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"},
         ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"]),
        ("avx2", {"avx2", "fma", "f16c"}, ["-mavx2", "-mfma", "-mf16c"]),
        ("scalar", set(), []))


def host_isas() -> list[str]:
    """The ISA builds this CPU can run, best first ("scalar" always: plain C)."""
    cpu = _cpu_flags()
    return [name for name, needs, _ in ISAS if needs <= cpu]


def compile_flags(isa: str) -> list[str]:
    """-ffp-contract=off: the dequantizers must round like numpy (no fused d*q - m); the dots use explicit FMAs."""
    flags = ["-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-std=c11"]
    for name, _, isa_flags in ISAS:
        if name == isa:
            return flags + isa_flags
    raise ValueError(f"unknown pool ISA {isa!r} (known: {', '.join(n for n, _, _ in ISAS)})")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _warn(message: str) -> None:
    print(f"strata: warning: {message}", file=sys.stderr)


def build(out_dir: Path | None = None, defines: tuple[str, ...] = (), isa: str | None = None,
          kernels: Path | None = None) -> Path | None:
    """The shared library for this source + ISA + flags + compiler, compiled once (atomically) into the cache.
    `defines` ("NAME=VALUE") are passed as -D (bench/pool_bench.py --variant, the tests' STRATA_NO_SIMD); `isa` one of
    ISAS (default: the best this CPU runs); `kernels` another tree's kernels/ folder (the benches' --old: a kernel
    before and after on one machine)."""
    from ..sysio.cache import cache_dir

    cc = _compiler()
    if cc is None:
        return None
    src = Path(kernels) / SOURCE if kernels else source_path()
    tables = host_header()  # the type table and the decoders' value tables, generated from model/quants.py
    isa = isa or host_isas()[0]
    flags = compile_flags(isa) + [f"-D{d}" for d in defines]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    # the headers that are there (another tree's kernels, bench/pool_rows_bench.py --old, may hold fewer)
    text = src.read_bytes() + b"".join((src.parent / h).read_bytes() for h in HEADERS if (src.parent / h).is_file())
    key = hashlib.sha1(text + tables.encode() + " ".join(flags + version).encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir() / "native"
    lib = out_dir / f"expert_pool-{key}.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{lib.name}.{os.getpid()}.tmp"
    with tempfile.TemporaryDirectory(prefix="strata-pool-") as include:
        Path(include, "expert_pool_tables.h").write_text(tables)
        result = subprocess.run([cc, *flags, f"-I{include}", f"-I{src.parent}", "-o", str(tmp), str(src), "-lm"],
                                capture_output=True, text=True)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = (result.stderr.strip().splitlines() or ["?"])[0]
        _warn(f"cannot build {src.name} for {isa} with {cc} ({first})")
        return None
    os.replace(tmp, lib)
    return lib


def build_config(lib) -> dict:
    """The tuning a loaded build was compiled with (strata_pool_config): CONFIG_FIELDS and the item schedule."""
    out = (ctypes.c_int64 * len(CONFIG_FIELDS))()
    kind = lib.strata_pool_config(out).decode()
    return dict(zip(CONFIG_FIELDS, (int(v) for v in out)), schedule=kind)


@lru_cache(maxsize=1)
def load():
    """The loaded library with argtypes set for the best ISA this CPU runs whose build succeeds (a compiler that
    knows no AVX-512 falls back to AVX2, then plain C), or None (no compiler, every build failed, or
    STRATA_POOL_NATIVE=0)."""
    if not settings.POOL_NATIVE.value():
        return None
    if _compiler() is None:
        return None
    for isa in host_isas():
        lib = load_variant((), isa=isa)
        if lib is not None:
            return lib
    _warn("the CPU expert pool uses numpy")
    return None


def load_variant(defines: tuple[str, ...], isa: str | None = None, kernels: Path | None = None):
    """The library built with the given -D defines for `isa` (default: the best this CPU runs) from this tree's
    kernels or `kernels` (build); not cached: the benchmark and the tests compare variants. lib.isa names the build."""
    isa = isa or host_isas()[0]
    path = build(defines=defines, isa=isa, kernels=kernels)
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    lib.isa = "scalar" if "STRATA_NO_SIMD=1" in defines else isa
    lib.strata_pool_swiglu.restype = _I32
    lib.strata_pool_swiglu.argtypes = SWIGLU_ARGS
    lib.strata_pool_diag.restype = _I32
    lib.strata_pool_diag.argtypes = SWIGLU_ARGS + [_I32, _VP]  # + touch, profile
    lib.strata_pool_experts.restype = _I32
    # threads, H, F, G, experts, base[3], estride[3], 3 row strides, 3 types, start, tok, dst, x, y, h, profile
    lib.strata_pool_experts.argtypes = [_I32, _I32, _I32, _I32, _VP, _VP, _VP] + SWIGLU_ARGS[7:] + [_VP]
    lib.strata_pool_config.restype = ctypes.c_char_p
    lib.strata_pool_config.argtypes = [_VP]
    lib.strata_wait_geq.restype = _U32
    lib.strata_wait_geq.argtypes = [_VP, _U32, _I64]
    lib.strata_gather.restype = _I32
    lib.strata_gather.argtypes = [_I32, _I32, _VP, _VP, _VP]
    lib.strata_plan_step.restype = _I32
    # n, K, ids, res, E, pcie_frac, j0, JM, M, slot, cpu experts / start / tok / dst, pcie experts / start / dst,
    # counts, group scratch (kernels/expert_pool_plan.h)
    lib.strata_plan_step.argtypes = [_I32, _I32, _VP, _VP, _I32, ctypes.c_double, _I32, _I32, _I32] + [_VP] * 10
    # args (strata_serve_args: tiers/serve_loop.ServeArgs), first step, wait slice ns, stats (kernels/expert_pool_serve.h)
    lib.strata_serve_steps.restype = _I64
    lib.strata_serve_steps.argtypes = [_VP, _I64, _I64, _VP]
    lib.strata_stream_read.restype = ctypes.c_double
    lib.strata_stream_read.argtypes = [_I32, _I32, _VP, _VP]
    lib.strata_dequant_row.restype = _I32
    lib.strata_dequant_row.argtypes = [_I32, _VP, _I64, _VP]
    lib.strata_rows_dots.restype = _I32  # type, rows, row stride, n rows, n, x, m, lane, out (the tests)
    lib.strata_rows_dots.argtypes = [_I32, _VP, _I64, _I32, _I32, _VP, _I32, _I32, _VP]
    return lib
