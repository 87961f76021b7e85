"""Load the CUDA C sources in kernels/ and compile them with CuPy (NVRTC) for the device found."""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from .runtime import cupy, device_arch


def kernels_dir() -> Path:
    """The repo's top-level kernels/ (source checkout) or the copy installed next to the package."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "kernels", here / "_kernels"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(f"no CUDA kernel sources found next to {here}")


# kernels/gemv.cu is compiled once per weight type ("gemv.<suffix>"; launch_util.TYPE_SUFFIX's values, a test holds
# them equal): one program of all four took ~100 s of NVRTC, the longest module by far
GEMV = "gemv"
GEMV_VARIANTS = ("f32", "f16", "bf16", "q8_0")


def variant_modules() -> list[str]:
    """Every module of a file compiled per variant: gemv.<type> and gemv_quant.<block type>."""
    from . import quant_source

    return ([f"{GEMV}.{v}" for v in GEMV_VARIANTS]
            + [f"{quant_source.BASE}.{quant_source.variant(t)}" for t in quant_source.TYPES])


def module_names() -> list[str]:
    """Every module a window may load: the per-variant ones and each other kernels/*.cu."""
    from . import quant_source

    plain = sorted(p.stem for p in kernels_dir().glob("*.cu") if p.stem not in (GEMV, quant_source.BASE))
    return variant_modules() + plain


def source(name: str, defines: tuple[str, ...] = (), src_dir: Path | None = None) -> str:
    """The C source of module `name`: kernels/<name>.cu, or for '<file>.<variant>' a generated head (gemv: the
    type's define; gemv_quant: the block type's defines and tables, gpu/quant_source.py) followed by
    kernels/<file>.cu. defines: 'NAME=VALUE' lines put first (a launcher's compile-time tunables, e.g.
    the bench's launch_quant.PROBE_DEFINES; none: the source as it has always been, so the kernel cache keeps its
    entries). src_dir: another kernels/ folder (bench/kernel_sass.py reads an older tree's), else kernels_dir()."""
    base, _, variant = name.partition(".")
    code = ((src_dir or kernels_dir()) / f"{base}.cu").read_text()
    from . import quant_source

    head = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in defines)
    if base == GEMV:
        if variant not in GEMV_VARIANTS:
            raise ValueError(f"kernels/gemv.cu is compiled per type: module 'gemv.<{'|'.join(GEMV_VARIANTS)}>', "
                             f"not '{name}'")
        return head + f"#define GEMV_{variant.upper()}\n" + code
    if variant:
        if base != quant_source.BASE:
            raise ValueError(f"kernels/{base}.cu has no variants")
        code = quant_source.prefix(variant) + code
    return head + code


def headers_tag(src_dir: Path) -> str:
    """A comment naming the hash of every kernels/*.cuh: CuPy keys its disk cache on the source text, not on what
    it includes, so without it an edited header (a decoder in quant_decode.cuh) would load a stale cubin."""
    digest = hashlib.sha1(b"".join(h.name.encode() + h.read_bytes() for h in sorted(src_dir.glob("*.cuh"))))
    return f"\n// kernels/*.cuh {digest.hexdigest()}\n"


@lru_cache(maxsize=None)
def module(name: str, defines: tuple[str, ...] = ()):
    """RawModule of kernels/<name>.cu (common.cuh is on the include path) with `defines` (source's), compiled once
    per process."""
    src_dir = kernels_dir()
    code = source(name, defines) + headers_tag(src_dir)
    options = (f"-arch={device_arch()}", "--std=c++17", f"-I{src_dir}")
    mod = cupy().RawModule(code=code, options=options)
    mod.compile()
    return mod


# The function names _function handed out: kernels of kernels/, each starting with pdl_begin (gpu/pdl.py)
_LOADED: set[str] = set()


@lru_cache(maxsize=None)
def _function(module_name: str, function: str, defines: tuple[str, ...] = ()):
    fn = module(module_name, defines).get_function(function)
    _LOADED.add(function)
    return fn


def loaded_functions() -> frozenset[str]:
    """The names of the kernels of kernels/ this process has loaded (kernel())."""
    return frozenset(_LOADED)


# Told (function name, argument tuple) of every launch this thread makes through kernel() while set: the profiling
# graph's byte ledger (engine/stage_bytes.py) sees each launch's weight arguments as it is recorded (per thread: a
# tiered eager window records on a helper thread while the main one serves it). Empty otherwise, and kernel()
# hands out the kernel itself.
_LOCAL = threading.local()


class _Observed:
    """A kernel whose calls are shown to the observers first; attributes (max_dynamic_shared_size_bytes, ...) are
    the kernel's own."""

    __slots__ = ("_fn", "_name", "_observers")

    def __init__(self, fn, name: str, observers: tuple):
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_observers", observers)

    def __call__(self, grid, block, args, *rest, **kwargs):
        for observer in self._observers:
            observer(self._name, args)
        return self._fn(grid, block, args, *rest, **kwargs)

    def __getattr__(self, name):
        return getattr(self._fn, name)

    def __setattr__(self, name, value):
        setattr(self._fn, name, value)


def kernel(module_name: str, function: str, defines: tuple[str, ...] = ()):
    """One kernel of kernels/<module_name>.cu (looked up once: launchers call this on every launch)."""
    fn = _function(module_name, function, defines)
    observers = getattr(_LOCAL, "observers", ())
    return _Observed(fn, function, observers) if observers else fn


kernel.cache_clear = _function.cache_clear  # benches reload a module's functions (bench/gemv_bench.py)


@contextmanager
def observing(observer):
    """observer(function, args) is told of every launch through kernel() inside the block (before the launch
    itself, which is unchanged): under a graph capture, of every kernel node recorded."""
    before = getattr(_LOCAL, "observers", ())
    _LOCAL.observers = (*before, observer)
    try:
        yield observer
    finally:
        _LOCAL.observers = before


# NVRTC's flags besides -arch: CuPy's RawModule adds -ftz=true and the device default itself (module() passes the
# rest); compile_check and bench/kernel_sass.py pass them all, so their code is the one a window loads.
NVRTC_FLAGS = ("--std=c++17", "-ftz=true", "--device-as-default-execution-space")


def nvrtc_options(arch: str) -> list[bytes]:
    """The NVRTC options of a CPU-side compile for `arch` (an sm_XX: NVRTC then emits a cubin)."""
    return [f"-arch={arch}".encode(), *(flag.encode() for flag in NVRTC_FLAGS)]


def nvrtc_compile(name: str, arch: str = "sm_90", defines: tuple[str, ...] = (),
                  src_dir: Path | None = None) -> tuple[str, bytes]:
    """Compile module `name` (source's) with NVRTC without a GPU (cuda-bindings + an NVRTC wheel), the *.cuh of
    src_dir (default kernels_dir()) as its headers; returns (log, cubin). Raises RuntimeError with NVRTC's log on
    failure."""
    from cuda.bindings import nvrtc

    src_dir = src_dir or kernels_dir()
    code = source(name, defines, src_dir).encode()
    headers = sorted(src_dir.glob("*.cuh"))
    err, prog = nvrtc.nvrtcCreateProgram(code, f"{name}.cu".encode(), len(headers),
                                         [h.read_bytes() for h in headers], [h.name.encode() for h in headers])
    opts = nvrtc_options(arch)
    result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.decode(errors="replace").strip("\x00 \n")
    cubin = b""
    if int(result[0]) == 0:
        _, cubin_size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * cubin_size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(prog)
    if int(result[0]) != 0:
        raise RuntimeError(f"kernels/{name}.cu failed to compile for {arch}:\n{text}")
    return text, cubin


def compile_check(name: str, arch: str = "sm_90", defines: tuple[str, ...] = ()) -> str:
    """Compile kernels/<name>.cu with NVRTC without a GPU; returns the log (nvrtc_compile's errors)."""
    return nvrtc_compile(name, arch, defines)[0]
