"""CuPy launchers of kernels/gemv_quant.cu: the dense and grouped-expert GEMVs and the row gather of the GGUF block
types other than Q8_0 (K-quants, i-quants, legacy 4/5-bit, TQ, FP4), one compiled module per type
("gemv_quant.<type>", compile.source). launch_gemv.launch_gemv, launch_moe and launch_embed.gather_rows hand these
types here after their own checks; the numpy references are theirs (ops/gemv.gemv, ops/moe.routed_experts_raw,
ops/embed.gather_rows), over model/quants.dequantize.

Two GEMV kernel sets live in the module: v1 (qgemv_t*, qgemv_expert_t*: every lane loads and rounds its own
weights) and v2 (qgemv2_*: a warp stages its rows' blocks in shared memory with 16-byte loads and sums in q-form,
kernels/gemv_quant.cu). STRATA_QUANT_GEMV=v2 selects v2; v1 stays the default until the device has shown v2
correct and faster. v2 also needs the weight's base address at the block's natural alignment (quant_decode.cuh
QAl); a weight view that lacks it runs v1.

Legend: T window rows, n_in / n_out GEMV widths, J (row, slot) entries of the MoE, N gathered rows.
"""

from __future__ import annotations


import numpy as np

from ..model import quants as Q
from . import compile as nvrtc
from . import launch_util as U
from .quant_source import TYPES, variant

QSTEP = 256  # input elements per warp step (kernels/gemv_quant.cu)
QROWS = {1: 4, 2: 4, 4: 4, 8: 2, 16: 2}  # output rows per warp by window bucket (QROWS(NT) in the kernel)
QUANT_TARGET_WARPS = 4096  # split K until a launch has about this many warps ...
QUANT_MIN_STEPS = 1  # ... but leave every warp at least this many 256-element steps
GATHER_BLOCK = 256


def handles(ggml_type: int) -> bool:
    """This module launches the type (every block type but Q8_0)."""
    return ggml_type in TYPES


def _kernel(ggml_type: int, function: str):
    return nvrtc.kernel(f"gemv_quant.{variant(ggml_type)}", function)


def gemv_version() -> str:
    """'v1' or 'v2' from STRATA_QUANT_GEMV (default v1); anything else is one clear error."""
    from .. import settings

    return settings.QUANT_GEMV.value()


def block_align(ggml_type: int) -> int:
    """The natural alignment of a type's blocks (largest power of two <= 16 dividing the block size): quant_decode.cuh
    QAl, what v2's decoders assume of every block start."""
    nbytes = U.row_stride(ggml_type, Q.BLOCK[ggml_type][0])
    return min(16, nbytes & -nbytes)


def kernel_prefix(ggml_type: int, w, expert_stride: int = 0) -> str:
    """Kernel name prefix for weight w: 'qgemv2' when v2 is chosen and w's base (and every expert's) has the block
    alignment v2 assumes, else 'qgemv'."""
    align = block_align(ggml_type)
    if gemv_version() == "v2" and U.data_ptr(w) % align == 0 and expert_stride % align == 0:
        return "qgemv2"
    return "qgemv"


def quant_split(n_out: int, n_in: int, T: int = 1, n_matrices: int = 1, max_z: int = 1) -> tuple[int, int]:
    """(ksplit, zsplit): warps of a block and blocks along grid z sharing one row group's input axis."""
    warps = -(-n_out // QROWS[U.nt_bucket(T)]) * n_matrices
    steps = -(-n_in // QSTEP)
    split = 1
    while split < U.GEMV_WARPS * max_z and warps * split < QUANT_TARGET_WARPS and steps >= 2 * split * QUANT_MIN_STEPS:
        split *= 2
    ksplit = min(split, U.GEMV_WARPS)
    zsplit = split // ksplit
    if zsplit > 1 and n_out > 2048:
        zsplit = 1
    return ksplit, zsplit


def launch_gemv_quant(w, ggml_type: int, n_in: int, x, y, work, *, act: int = U.ACT_NONE, div: float = 1.0,
                      mul=None, mul_strides: tuple[int, int] = (0, 0)) -> None:
    """y [T, n_out] = act(x [T, n_in] @ W^T / div) * mul; arguments checked by launch_gemv. `work`: a z-split
    launch's SplitK (launch_gemv makes one when None)."""
    T, n_out = y.shape
    U.check_vector_rows("x", x)
    max_z = U.GEMV_MAX_ZSPLIT if T <= U.GEMV_MAXT else 1
    ksplit, zsplit = quant_split(n_out, n_in, T, max_z=max_z)
    rpw = QROWS[U.nt_bucket(T)]
    grid, block = U.gemv_grid(n_out, T, ksplit, zsplit, rpw=rpw)
    from .launch_gemv import zsplit_args  # launch_gemv dispatches the block-quant types here

    partial, tile_done = zsplit_args(grid, zsplit, work)
    _kernel(ggml_type, f"{kernel_prefix(ggml_type, w)}_t{U.nt_bucket(T)}")(grid, block, (
        w, np.int64(U.row_stride(ggml_type, n_in)), x, np.int32(n_in), y, np.int32(n_out), np.int32(T),
        np.int32(ksplit), np.int32(act), np.float32(div), U.null_or(mul), np.int32(mul_strides[0]),
        np.int32(mul_strides[1]), partial, tile_done))


def launch_expert_gemv_quant(w, ggml_type: int, expert_stride: int, n_expert: int, groups, n_groups: int, T: int, x,
                             x_div: int, n_in: int, y, *, act: int = U.ACT_NONE, mul=None,
                             mul_strides: tuple[int, int] = (0, 0)) -> None:
    """y [*, n_out]: entry j of the n_groups groups = its group's expert applied to x row j // x_div (groups from
    moe_group or tier_group); arguments checked by launch_moe."""
    J, n_out = n_groups, y.shape[1]
    U.check_vector_rows("x", x)
    g_expert, g_count, g_entries = groups
    ksplit, _ = quant_split(n_out, n_in, T, n_matrices=J)
    grid, block = U.expert_grid(n_out, J, ksplit, rpw=QROWS[U.nt_bucket(T)])
    _kernel(ggml_type, f"{kernel_prefix(ggml_type, w, expert_stride)}_expert_t{U.nt_bucket(T)}")(grid, block, (
        w, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert, g_count,
        g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), np.int32(ksplit), np.int32(act),
        np.float32(1.0), U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1])))


def launch_gather_quant(rows, table, ggml_type: int, row_len: int, out) -> None:
    """out [N, row_len]: table rows rows [N] (int64) dequantized exactly; arguments checked by gather_rows."""
    _kernel(ggml_type, "qgather_rows")((int(rows.size), 1, 1), (GATHER_BLOCK, 1, 1), (
        rows, table, np.int64(U.row_stride(ggml_type, row_len)), out, np.int32(row_len)))
