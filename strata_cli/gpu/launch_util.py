"""Argument checks, raw-weight geometry and grid math shared by the CuPy launchers.

Nothing here touches the device: numpy arrays pass the same checks as CuPy arrays, so the launcher logic is
tested on CPU (tests/test_launch_checks.py). Every check raises ValueError naming the offending argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass

import numpy as np

from ..model import packed, quants

# Mirrors of the kernels' compile-time constants (kernels/common.cuh, kernels/gemv.cu).
ACT_NONE, ACT_SILU, ACT_SIGMOID, ACT_2SIGMOID = 0, 1, 2, 3
GEMV_WARPS = 8  # warps per block (kernels/gemv.cu)
GEMV_MAXT = 16  # window rows per block along grid y
GEMV_RPW = 4  # output rows per warp
GEMV_TARGET_WARPS = 4096  # split K until a launch has about this many warps (fills 132 SMs with loads in flight)
GEMV_MIN_CHUNKS = 4  # ... but leave every warp at least this many 32-wide chunks of the input
BLOCK = 256  # threads per block of the norm / elementwise / router kernels
ELEMWISE_MAX_BLOCKS = 4096  # grid-stride kernels never need more
MAX_GRID_Y = 65535
ROUTER_MAXK = 16
ROUTER_MAX_E = 48 * 1024 // 4  # p[E] lives in the default 48 KiB of dynamic shared memory

Q8_0_R32 = packed.Q8_0_R32  # Q8_0 repacked by 32-row groups (model/packed.py): kernels/gemv_q8r.cu only
# dtypes a raw weight may arrive in (GGUF memmaps give typed F32/F16 and uint8 byte rows otherwise).
WEIGHT_DTYPES = {
    quants.F32: (np.float32, np.uint8),
    quants.F16: (np.float16, np.uint8),
    quants.BF16: (np.uint8, np.uint16),
    quants.Q8_0: (np.uint8,),
    Q8_0_R32: (np.uint8,),
}
# The kernels load F32 as float and F16/BF16 as uint16; Q8_0 is read byte-wise but its rows assume even offsets;
# repacked Q8_0 is read in 16-byte vectors.
WEIGHT_ALIGN = {quants.F32: 4, quants.F16: 2, quants.BF16: 2, quants.Q8_0: 2, Q8_0_R32: 16}
# The other block types (kernels/gemv_quant.cu, gpu/launch_quant.py): uint8 byte rows, loads check alignment.
WEIGHT_DTYPES.update({t: (np.uint8,) for t in quants.BLOCK_TYPES if t not in WEIGHT_DTYPES})
WEIGHT_ALIGN.update({t: 1 for t in quants.BLOCK_TYPES if t not in WEIGHT_ALIGN})
# kernels/gemv.cu families (the repacked type has its own file)
TYPE_SUFFIX = {quants.F32: "f32", quants.F16: "f16", quants.BF16: "bf16", quants.Q8_0: "q8_0"}


def type_name(ggml_type: int) -> str:
    return quants.TYPE_NAMES.get(ggml_type) or packed.NAMES.get(ggml_type) or str(ggml_type)


def data_ptr(a) -> int:
    """Device (CuPy) or host (numpy) address of the first element."""
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


def check_array(name: str, a, dtype, shape: tuple) -> object:
    """a must be C-contiguous, of dtype, and of shape (None = any size on that axis, but >= 1)."""
    if a is None or not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise ValueError(f"{name}: expected an array, got {type(a).__name__}")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(f"{name}: dtype {np.dtype(a.dtype)}, expected {np.dtype(dtype)}")
    if len(a.shape) != len(shape) or any(want is not None and got != want for got, want in zip(a.shape, shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name}: shape {tuple(a.shape)}, expected ({want})")
    if any(got == 0 for got in a.shape):
        raise ValueError(f"{name}: empty shape {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: not C-contiguous")
    return a


def check_type(name: str, ggml_type: int) -> int:
    if ggml_type not in WEIGHT_DTYPES:
        raise ValueError(f"{name}: GGML type {ggml_type} has no GPU kernel (supported: "
                         f"{', '.join(type_name(t) for t in WEIGHT_DTYPES)})")
    return int(ggml_type)


def row_stride(ggml_type: int, n_in: int) -> int:
    """Bytes of one raw weight row of n_in values (a repacked Q8_0 row takes as many bytes as a raw one)."""
    return quants.row_bytes(quants.Q8_0 if ggml_type == Q8_0_R32 else ggml_type, n_in)


def _check_raw(name: str, w, ggml_type: int, n_in: int) -> int:
    check_type(f"{name} type", ggml_type)
    if w is None or not hasattr(w, "dtype"):
        raise ValueError(f"{name}: expected an array, got {type(w).__name__}")
    if np.dtype(w.dtype) not in [np.dtype(d) for d in WEIGHT_DTYPES[ggml_type]]:
        raise ValueError(f"{name}: dtype {np.dtype(w.dtype)} cannot hold {type_name(ggml_type)} weights")
    if not w.flags.c_contiguous:
        raise ValueError(f"{name}: not C-contiguous")
    block = quants.QK8_0 if ggml_type == Q8_0_R32 else quants.BLOCK[ggml_type][0]
    if n_in < 1 or n_in % block:
        raise ValueError(f"{name}: input width {n_in} is not a positive multiple of the "
                         f"{type_name(ggml_type)} block ({block})")
    if data_ptr(w) % WEIGHT_ALIGN[ggml_type]:
        raise ValueError(f"{name}: data not {WEIGHT_ALIGN[ggml_type]}-byte aligned")
    return row_stride(ggml_type, n_in)


def weight_rows(name: str, w, ggml_type: int, n_in: int, n_out: int | None = None) -> int:
    """Output rows of a raw [n_out, n_in] weight (any shape holding whole rows); checks n_out when given."""
    rb = _check_raw(name, w, ggml_type, n_in)
    if w.nbytes == 0 or w.nbytes % rb:
        raise ValueError(f"{name}: {w.nbytes} bytes is not a whole number of {n_in}-wide "
                         f"{type_name(ggml_type)} rows ({rb} bytes each)")
    rows = w.nbytes // rb
    _check_groups(name, ggml_type, rows)
    if n_out is not None and rows != n_out:
        raise ValueError(f"{name}: {rows} rows of width {n_in}, expected {n_out}")
    return rows


def expert_geometry(name: str, w, ggml_type: int, n_in: int, n_out: int | None = None,
                    n_expert: int | None = None) -> tuple[int, int, int]:
    """(E, rows per expert, expert stride in bytes) of a raw [E, n_out, n_in] expert tensor (numpy order)."""
    rb = _check_raw(name, w, ggml_type, n_in)
    if len(w.shape) != 3 or w.shape[0] == 0:
        raise ValueError(f"{name}: shape {tuple(w.shape)}, expected [E, rows, row] (3-D, numpy order)")
    E = int(w.shape[0])
    per_expert = w.nbytes // E
    if per_expert == 0 or per_expert % rb:
        raise ValueError(f"{name}: {per_expert} bytes per expert is not a whole number of {n_in}-wide "
                         f"{type_name(ggml_type)} rows ({rb} bytes each)")
    rows = per_expert // rb
    _check_groups(name, ggml_type, rows, "rows per expert")
    if n_out is not None and rows != n_out:
        raise ValueError(f"{name}: {rows} rows per expert of width {n_in}, expected {n_out}")
    if n_expert is not None and E != n_expert:
        raise ValueError(f"{name}: {E} experts, expected {n_expert}")
    return E, rows, per_expert


def _check_groups(name: str, ggml_type: int, rows: int, what: str = "rows") -> None:
    if ggml_type == Q8_0_R32 and rows % packed.GROUP:
        raise ValueError(f"{name}: {rows} {what} is not a whole number of {packed.GROUP}-row Q8_0_R32 groups")


def out_array(name: str, out, shape: tuple, dtype, empty):
    """The caller's preallocated `out` (checked: no allocation, so launches can be graph-captured) or a new one."""
    if out is None:
        return empty(shape, dtype=dtype)
    return check_array(name, out, dtype, shape)


def scratch_rows(name: str, buf, rows: int, shape_tail: tuple, empty):
    """Scratch with at least `rows` leading rows (a buffer sized for the largest window serves smaller ones)."""
    if buf is None:
        return empty((rows, *shape_tail), dtype=np.float32)
    check_array(name, buf, np.float32, (None, *shape_tail))
    if buf.shape[0] < rows:
        raise ValueError(f"{name}: {buf.shape[0]} rows, the window needs {rows}")
    return buf[:rows]


GEMV_MAX_ZSPLIT = 8  # blocks along grid z sharing one row group's input axis
GEMV_PARTIAL_FLOATS = GEMV_MAX_ZSPLIT * GEMV_MAXT * 16384  # z splits happen only up to 16384 output rows


def gemv_split(n_out: int, n_in: int, n_matrices: int = 1, max_z: int = 1, rpw: int = GEMV_RPW) -> tuple[int, int]:
    """(ksplit, zsplit): warps of a block and blocks along z that share one row group's input axis. Matrices with
    few rows and a long input axis are split until the launch has about GEMV_TARGET_WARPS warps."""
    groups = -(-n_out // rpw) * n_matrices
    chunks = -(-n_in // 32)
    split = 1
    while (split < GEMV_WARPS * max_z and groups * split < GEMV_TARGET_WARPS
           and chunks >= 2 * split * GEMV_MIN_CHUNKS):
        split *= 2
    ksplit = min(split, GEMV_WARPS)
    zsplit = split // ksplit
    if zsplit > 1 and n_out > 2048:
        zsplit = 1
    return ksplit, zsplit


Q8R_GROUP = packed.GROUP  # output rows per lane-row of kernels/gemv_q8r.cu
Q8R_LANE_ROWS = {1: 1, 2: 2, 4: 4, 8: 4, 16: 2}  # row groups per warp by window bucket (q8r_rows in the kernel)
# row groups per warp and matrix of gemv_q8r_gateup_t<NT> (q8r_gateup_rows: half the plain kernel's, at least 1)
Q8R_GATEUP_ROWS = {nt: max(1, r // 2) for nt, r in Q8R_LANE_ROWS.items()}
Q8R_DENSE_GATEUP_NT = (1, 2)  # window buckets of gemv_q8r_gateup_dense_t<NT> (the CUDA-core path's)
Q8R_TARGET_WARPS = 2048  # split K until a launch has about this many warps ...
Q8R_MAX_CHAIN = 40  # ... or while a warp would stream more than this many blocks in a row (the head) ...
Q8R_MIN_BLOCKS = 2  # ... but leave every warp at least this many Q8_0 blocks to stream
Q8R_MAX_ZROWS = 16384  # z splits (raw sums in the shared partial buffer) only up to this many output rows


# The fill of a z-split launch (q8r_split's fill_sms; issue 18: the small dense GEMVs of a T = 1 window, hc_down
# [352 x 10240] and the shared expert's [640 x 2560] gate / up, ran 88 and 80 blocks of 5 and 2.5 blocks of Q8_0 a
# warp on 132 SMs, 6-11 % of the copy rate): a launch that already splits over z splits further, up to a resident
# wave of blocks (Q8R_RESIDENT_BLOCKS an SM), one Q8_0 block a warp at least, Q8R_FILL_MAX_Z slices and what the
# partial buffer holds. Blocks of 256 threads an SM holds at once by window bucket, the fewer of gemv_q8r_t<NT> and
# gemv_q8r_gateup_dense_t<NT> (ptxas sm_90: t1 64 / 100 registers -> 4 / 2 blocks, t2 149 / 145 -> 1, t4 255 -> 1):
# a second wave of these short blocks would cost a whole load latency more.
Q8R_RESIDENT_BLOCKS = {1: 2}  # other buckets: 1
Q8R_FILL_MAX_Z = 32
DEFAULT_SMS = 132  # the H200's SMs: sm_count() without a device (the CPU tests and launch listings)


def sm_count() -> int:
    """The current device's SM count (DEFAULT_SMS without CuPy or a device)."""
    try:
        from .runtime import cupy

        cp = cupy()
        return _sm_count(cp.cuda.runtime.getDevice())
    except (ImportError, RuntimeError):
        return DEFAULT_SMS


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    from .runtime import cupy

    rt = cupy().cuda.runtime
    return int(rt.deviceGetAttribute(getattr(rt, "cudaDevAttrMultiProcessorCount", 16), device))  # CUDA's enum 16


Q8T_LANE_ROWS = 2  # row groups per warp of the tensor-core kernels gemv_q8r_tc_t<NT> (Q8T_ROWS in the kernel)


def q8r_rows_per_warp(T: int) -> int:
    return Q8R_GROUP * Q8R_LANE_ROWS[nt_bucket(T)]


@dataclass(frozen=True)
class WindowPath:
    """The launch variants a T-row window records (engine/gpu/window.py, launch_gemv)."""

    # Q8_0_R32 GEMVs on tensor cores (kernels/gemv_q8r.cu): the dense gemv_q8r_tc_t* and the grouped experts'
    # gemv_expert_q8r_tc_t* (the grouped ones within 3 % of their CUDA-core kernels from T = 4 on the H200 at
    # ed54e55, bench/quant_gemv_bench.py)
    gemv_tc: bool
    # (the routed-expert GEMVs of the block types have one path, the tensor-core qtc_* kernels of gemv_quant.cu: on
    # the H200 at 35b700f they tied the CUDA-core qgemv_expert_* / qgemv_gateup_* at T = 1 (Q2_K + Q4_0 down: 432
    # against 437 GB/s) and won at every other T and type (T = 8: 834 against 426), so the CUDA-core ones went)


# (first T, path) in ascending T: a window takes the path of the last row whose first T <= T. Measured on the H200
# at 947c884 (issue 18: the full-size Flash-Next file, every expert in VRAM, STRATA_QUANT_GEMV=v2, ms per window at
# T = 1/2/4/8): without and with the tensor-core Q8_0_R32 GEMVs (together with the fused HC read and GDN launches
# of then, which every window now runs in their place: kernels/hyper.cu, kernels/gdn.cu) 13.56 / 16.91 / 22.63 /
# 43.62 against 14.44 / 18.52 / 21.76 / 32.82, so they lose at T <= 2 and win from T = 4.
WINDOW_PATHS = ((1, WindowPath(gemv_tc=False)),
                (4, WindowPath(gemv_tc=True)))


def window_path(T: int) -> WindowPath:
    """The launch variants of a T-row window (WINDOW_PATHS)."""
    return [path for first, path in WINDOW_PATHS if first <= T][-1]


_RECORDING_PATH: contextvars.ContextVar[WindowPath | None] = contextvars.ContextVar("window_path", default=None)


@contextlib.contextmanager
def recording_path(path: WindowPath):
    """The launches of this thread inside the block follow `path` (a window recorder: its GEMVs of one token
    group's rows take the window's choice, and a test's path holds for every T)."""
    token = _RECORDING_PATH.set(path)
    try:
        yield
    finally:
        _RECORDING_PATH.reset(token)


def q8r_tensor_cores(T: int) -> bool:
    """Whether a Q8_0_R32 GEMV (dense or grouped experts) of T rows takes the tensor-core kernel (T >= 2): the
    recording window's path, else window_path(T)."""
    path = _RECORDING_PATH.get() or window_path(T)
    return T >= 2 and path.gemv_tc


def q8r_split(n_out: int, n_in: int, T: int = 1, n_matrices: int = 1, max_z: int = 1,
              rpw: int | None = None, fill_sms: int = 0) -> tuple[int, int]:
    """(ksplit, zsplit) of the repacked Q8_0 GEMVs: as gemv_split, over warps of rpw rows (default
    q8r_rows_per_warp(T)). The constants come from bench/gemv_bench.py on the H200 (docs/BENCHMARKS.md).
    fill_sms (the dense CUDA-core launches, gemv_q8r_t<NT> and gemv_q8r_gateup_dense_t<NT>: the device's SM count)
    > 0: a launch split over z is split further to fill that many SMs (q8r_fill_z)."""
    warps = -(-n_out // (rpw or q8r_rows_per_warp(T))) * n_matrices
    blocks = n_in // quants.QK8_0
    split = 1
    while (split < GEMV_WARPS * max_z and blocks >= 2 * split * Q8R_MIN_BLOCKS
           and (warps * split < Q8R_TARGET_WARPS or blocks > Q8R_MAX_CHAIN * split)):
        split *= 2
    ksplit = min(split, GEMV_WARPS)
    zsplit = split // ksplit
    if zsplit > 1 and n_out > Q8R_MAX_ZROWS:
        zsplit = 1
    if fill_sms > 0 and zsplit > 1:
        zsplit = q8r_fill_z(n_out, n_in, T, zsplit, fill_sms)
    return ksplit, zsplit


def q8r_fill_z(n_out: int, n_in: int, T: int, zsplit: int, sms: int) -> int:
    """The z split of a dense CUDA-core Q8_0_R32 launch that already splits over z (ksplit = GEMV_WARPS): raised
    (never lowered) to the most slices that keep the gate/up kernel's grid (its tiles of Q8R_GATEUP_ROWS row groups,
    at least the plain kernel's) within one resident wave of Q8R_RESIDENT_BLOCKS blocks on each of `sms` SMs, every
    warp at least one Q8_0 block, at most Q8R_FILL_MAX_Z slices and the partial buffer's T x 2 n_out floats a
    slice. It depends only on (n_out, n_in, T): launch_gemv and launch_q8r_gateup take the same split of one
    matrix, so the fused gate/up keeps the two-launch path's bits."""
    nt = nt_bucket(T)
    tiles = -(-n_out // (Q8R_GROUP * Q8R_GATEUP_ROWS[nt])) * -(-T // GEMV_MAXT)
    z = min(Q8R_RESIDENT_BLOCKS.get(nt, 1) * sms // tiles, n_in // quants.QK8_0 // GEMV_WARPS, Q8R_FILL_MAX_Z,
            GEMV_PARTIAL_FLOATS // (2 * T * n_out))
    return max(zsplit, z)


def gemv_ksplit(n_out: int, n_in: int, n_matrices: int = 1) -> int:
    return gemv_split(n_out, n_in, n_matrices)[0]


def nt_bucket(T: int) -> int:
    """Window-row bucket compiled into the dense kernels (gemv_<type>_t<NT>)."""
    rows = min(T, GEMV_MAXT)
    return next(nt for nt in (1, 2, 4, 8, 16) if nt >= rows)


def gemv_grid(n_out: int, T: int, ksplit: int = 1, zsplit: int = 1, rpw: int = GEMV_RPW) -> tuple[tuple, tuple]:
    """(grid, block) of the dense gemv_* kernels: GEMV_WARPS/ksplit groups of GEMV_RPW rows per block, GEMV_MAXT
    window rows per grid y."""
    grid_y = -(-T // GEMV_MAXT)
    if grid_y > MAX_GRID_Y:
        raise ValueError(f"x: {T} rows exceed the kernel's {MAX_GRID_Y * GEMV_MAXT}")
    rows_per_block = rpw * (GEMV_WARPS // ksplit)
    return (-(-n_out // rows_per_block), grid_y, zsplit), (GEMV_WARPS * 32, 1, 1)


def expert_grid(n_out: int, n_entries: int, ksplit: int = 1, rpw: int = GEMV_RPW) -> tuple[tuple, tuple]:
    """(grid, block) of the gemv_expert_* kernels: grid y = one (row, slot) entry."""
    if n_entries > MAX_GRID_Y:
        raise ValueError(f"ids: {n_entries} (row, slot) entries exceed {MAX_GRID_Y}")
    rows_per_block = rpw * (GEMV_WARPS // ksplit)
    return (-(-n_out // rows_per_block), n_entries, 1), (GEMV_WARPS * 32, 1, 1)


def elementwise_grid(n: int, block: int = BLOCK) -> tuple[tuple, tuple]:
    """(grid, block) of a grid-stride kernel over n elements (or items: rows, channels) with `block` threads."""
    return (max(1, min(-(-n // block), ELEMWISE_MAX_BLOCKS)), 1, 1), (block, 1, 1)


def check_vector_rows(name: str, x) -> None:
    """The repacked Q8_0 and block-quant GEMVs read x rows as float4: the rows must start 16-byte aligned."""
    if data_ptr(x) % 16:
        raise ValueError(f"{name}: data not 16-byte aligned (the Q8_0_R32 and block-quant GEMVs read x as float4)")


def null_or(a):
    """A kernel pointer argument: the array, or a null pointer (a uint64 zero: 8 bytes, like a pointer)."""
    return np.uint64(0) if a is None else a


def on_stream(stream):
    """Make `stream` current for the launches (and any allocation) inside; None keeps the current stream."""
    return contextlib.nullcontext() if stream is None else stream
