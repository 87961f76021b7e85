"""CuPy launchers of kernels/gemv_quant.cu: the dense and grouped-expert GEMVs and the row gather of the GGUF block
types other than Q8_0 (K-quants, i-quants, legacy 4/5-bit, TQ, FP4), one compiled module per type
("gemv_quant.<type>", compile.source). launch_gemv.launch_gemv, launch_moe and launch_embed.gather_rows hand these
types here after their own checks; the numpy references are theirs (ops/gemv.gemv, ops/moe.routed_experts_raw,
ops/embed.gather_rows), over model/quants.dequantize.

The GEMVs stage whole blocks of a warp's rows in shared memory with 16-byte loads and sum per scale group
(kernels/gemv_quant.cu); they need the weight's base address at the block's natural alignment (quant_decode.cuh
QAl), which every GGUF tensor and every row or expert view of one has (check_block_align says so otherwise).
The routed experts' gate and up projections of one type run as one launch (launch_gateup_quant). The grouped expert
GEMVs run on tensor cores (qtc_expert_* / qtc_gateup_*: mma.sync over the exact folded q-form, cp.async stage rings)
at every T: on the H200 at 35b700f they tied the CUDA-core qgemv_expert_* / qgemv_gateup_* at T = 1 and won at every
other T and type, so those went.

Legend: T window rows, n_in / n_out GEMV widths, J (row, slot) entries of the MoE, N gathered rows.
"""

from __future__ import annotations

import numpy as np

from ..model import quants as Q
from . import compile as nvrtc
from . import launch_util as U
from .quant_source import TYPES, variant
from .splitk import zsplit_args

QSTEP = 256  # input elements per warp step (kernels/gemv_quant.cu)
QROWS = {1: 4, 2: 4, 4: 4, 8: 2, 16: 2}  # output rows per warp by window bucket (QROWS(NT) in the kernel)
QUANT_TARGET_WARPS = 4096  # split K until a launch has about this many warps ...
QUANT_MIN_STEPS = 1  # ... but leave every warp at least this many 256-element steps
GATHER_BLOCK = 256
SMEM_DEFAULT = 48 * 1024  # dynamic shared memory a launch gets without raising the kernel's limit
_raised_smem: set = set()
# Mirrors of kernels/gemv_quant.cu's QTC_* geometry, settled on the H200 at 35b700f (bench/quant_gemv_bench.py's
# sweep of then, Q2_K gate/up + Q4_0 down and Q4_0 experts, GB/s of the whole routed_experts at T = 1/2/4/8):
#   * 2 m tiles (16 rows) a warp at T <= 2 whatever the type (Q2_K gate/up +9 % at T = 1, +6 % at T = 2: twice the
#     warps), 4 from T = 4 where a 64-row stage fits QTC_MT4_BYTES (4 m tiles: -6 % and -27 % with 2 at T = 4, 8);
#   * 4 warps a block (8: -8..-25 % at every T and type: two waves of 86 KB blocks at T = 1);
#   * a ring of about 12 KB a warp (24 KB: -6..-30 %: fewer blocks an SM, and 400 blocks of the down launch in two
#     waves);
#   * split K until ~2048 warps (8192: Q4_0 gate/up +6 / +13 % at T = 4 / 8, but its down -6 / -15 % and Q2_K at
#     T = 8 -12 %: the whole MoE within 1 %).
QTC_WARPS = 4
QTC_MT4_BYTES = 8192
QTC_RING_BYTES = 12288
QTC_TARGET_WARPS = 2048
# The decode-free probe (kernels/gemv_quant.cu QTC_PROBE: the same grids and rings decoding nothing, wrong sums): the
# defines bench/quant_gemv_bench.py --probe puts into every qtc_* module while it times its probe rows, to show how
# much of a launch's time the streaming alone takes. () in every other launch.
PROBE_DEFINES = ("QTC_PROBE=1",)
qtc_defines: tuple[str, ...] = ()


def handles(ggml_type: int) -> bool:
    """This module launches the type (every block type but Q8_0)."""
    return ggml_type in TYPES


def module_name(ggml_type: int) -> str:
    return f"gemv_quant.{variant(ggml_type)}"


def _kernel(ggml_type: int, function: str, defines: tuple[str, ...] = ()):
    return nvrtc.kernel(module_name(ggml_type), function, defines)


def block_align(ggml_type: int) -> int:
    """The natural alignment of a type's blocks (largest power of two <= 16 dividing the block size): quant_decode.cuh
    QAl, what the decoders assume of every block start."""
    nbytes = U.row_stride(ggml_type, Q.BLOCK[ggml_type][0])
    return min(16, nbytes & -nbytes)


def check_block_align(name: str, ggml_type: int, w, expert_stride: int = 0) -> None:
    """The GEMVs decode blocks in place: w's base (and every expert's, expert_stride bytes apart) must have the block
    alignment quant_decode.cuh assumes."""
    align = block_align(ggml_type)
    if U.data_ptr(w) % align or expert_stride % align:
        raise ValueError(f"{name}: {Q.TYPE_NAMES[ggml_type]} weights must start {align}-byte aligned "
                         f"(base {U.data_ptr(w) % 16} mod 16, expert stride {expert_stride})")


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
    check_block_align("w", ggml_type, w)
    ksplit, zsplit = quant_split(n_out, n_in, T, max_z=max_z)
    rpw = QROWS[U.nt_bucket(T)]
    grid, block = U.gemv_grid(n_out, T, ksplit, zsplit, rpw=rpw)
    partial, tile_done = zsplit_args(grid, zsplit, work)
    _kernel(ggml_type, f"qgemv_t{U.nt_bucket(T)}")(grid, block, (
        w, np.int64(U.row_stride(ggml_type, n_in)), x, np.int32(n_in), y, np.int32(n_out), np.int32(T),
        np.int32(ksplit), np.int32(act), np.float32(div), U.null_or(mul), np.int32(mul_strides[0]),
        np.int32(mul_strides[1]), partial, tile_done))


def _qtc_chunks(ggml_type: int) -> int:
    """QCHUNKS: the 16-byte chunks that hold one 256-element step of a row at any alignment."""
    return (U.row_stride(ggml_type, QSTEP) + 30) // 16


def qtc_mt(ggml_type: int, T: int) -> int:
    """m tiles of 16 rows per warp (qtc_mt(NT) in the kernel): the expert kernel's warp takes 16 qtc_mt rows, the
    gate/up kernel's 8 qtc_mt rows of each matrix."""
    if U.nt_bucket(T) <= 2:
        return 2
    return 4 if 64 * _qtc_chunks(ggml_type) * 16 <= QTC_MT4_BYTES else 2


def qtc_xsplit_bytes(T: int) -> int:
    """Shared memory of one warp's x split of a step (qtc_xs_bytes(NT) in the kernel): at T <= 2 (window bucket NT)
    NT columns of 1088 bytes (hi and lo B words of 8 spans, the 16-element sums) and 32 bytes of span masks; none
    from T = 3 on (the spans split x in registers there)."""
    nt = U.nt_bucket(T)
    return nt * 1088 + 32 if nt <= 2 else 0


def qtc_smem_bytes(ggml_type: int, T: int) -> int:
    """Dynamic shared memory of a qtc_* block: per warp, a ring of qtc_nstage stages of 16 qtc_mt row units, each unit
    QCHUNKS 16-byte chunks, and its x split (qtc_xsplit_bytes): qtc_smem_bytes(NT) in the kernel."""
    stage = 16 * qtc_mt(ggml_type, T) * 16 * _qtc_chunks(ggml_type)
    return QTC_WARPS * (min(4, max(2, QTC_RING_BYTES // stage)) * stage + qtc_xsplit_bytes(T))


def qtc_split(n_sets: int, n_in: int) -> int:
    """ksplit of the qtc_* kernels: warps of a block sharing one row set's input axis (interleaved steps), for
    n_sets row sets (rows per warp x groups) in the launch."""
    steps = -(-n_in // QSTEP)
    ksplit = 1
    while ksplit < QTC_WARPS and n_sets * ksplit < QTC_TARGET_WARPS and steps >= 2 * ksplit:
        ksplit *= 2
    return ksplit


def qtc_grid(ggml_type: int, gateup: bool, n_out: int, n_groups: int, n_in: int,
             T: int) -> tuple[tuple[int, int, int], int, int]:
    """(grid, ksplit, dynamic shared bytes) of a qtc_* launch over n_groups expert groups of up to T entries: a warp
    takes 16 qtc_mt rows (gate/up: 8 qtc_mt of each matrix), QTC_WARPS / ksplit row sets a block, grid (row blocks,
    groups)."""
    rows = (8 if gateup else 16) * qtc_mt(ggml_type, T)
    ksplit = qtc_split(-(-n_out // rows) * n_groups, n_in)
    if n_groups > U.MAX_GRID_Y:
        raise ValueError(f"ids: {n_groups} (row, slot) entries exceed {U.MAX_GRID_Y}")
    return (-(-n_out // (rows * (QTC_WARPS // ksplit))), n_groups, 1), ksplit, qtc_smem_bytes(ggml_type, T)


def _launch_qtc(ggml_type: int, function: str, n_out: int, n_groups: int, n_in: int, T: int, args) -> None:
    """A qtc_* kernel over n_groups expert groups (qtc_grid); args(ksplit) gives its arguments for the ksplit
    qtc_split chose."""
    if n_out * U.row_stride(ggml_type, n_in) >= 2**31:  # (the kernel keeps a unit row's offset in 31 bits)
        raise ValueError(f"w: an expert matrix of {n_out} rows of {n_in} {Q.TYPE_NAMES[ggml_type]} exceeds 2 GiB")
    grid, ksplit, smem = qtc_grid(ggml_type, function.startswith("qtc_gateup"), n_out, n_groups, n_in, T)
    defines = qtc_defines
    kernel = _kernel(ggml_type, function, defines)
    if smem > SMEM_DEFAULT and (ggml_type, function, defines) not in _raised_smem:
        kernel.max_dynamic_shared_size_bytes = smem  # (the kernel writes NaN rows if it gets less)
        _raised_smem.add((ggml_type, function, defines))
    kernel(grid, (QTC_WARPS * 32, 1, 1), args(np.int32(ksplit)), shared_mem=smem)


def launch_expert_gemv_quant(w, ggml_type: int, expert_stride: int, n_expert: int, groups, n_groups: int, T: int, x,
                             x_div: int, n_in: int, y, *, act: int = U.ACT_NONE, mul=None,
                             mul_strides: tuple[int, int] = (0, 0)) -> None:
    """y [*, n_out]: entry j of the n_groups groups = its group's expert applied to x row j // x_div (groups from
    moe_group or tier_group); arguments checked by launch_moe."""
    J, n_out = n_groups, y.shape[1]
    U.check_vector_rows("x", x)
    check_block_align("w", ggml_type, w, expert_stride)
    g_expert, g_count, g_entries = groups
    _launch_qtc(ggml_type, f"qtc_expert_t{U.nt_bucket(T)}", n_out, J, n_in, T, lambda ksplit: (
        w, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert, g_count,
        g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), ksplit, np.int32(act), np.float32(1.0),
        U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1])))


def launch_gateup_quant(gate, up, ggml_type: int, expert_stride: int, n_expert: int, groups, n_groups: int, T: int,
                        x, x_div: int, n_in: int, y) -> None:
    """y [*, n_out] = silu(gate_e . x) * (up_e . x) for entry j of each group (x row j // x_div): one launch that
    stages an expert's gate and up rows together (gate and up of one type and geometry); arguments checked by
    launch_moe."""
    J, n_out = n_groups, y.shape[1]
    U.check_vector_rows("x", x)
    check_block_align("gate_raw", ggml_type, gate, expert_stride)
    check_block_align("up_raw", ggml_type, up, expert_stride)
    g_expert, g_count, g_entries = groups
    _launch_qtc(ggml_type, f"qtc_gateup_t{U.nt_bucket(T)}", n_out, J, n_in, T, lambda ksplit: (
        gate, up, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert,
        g_count, g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), ksplit))


def launch_gather_quant(rows, table, ggml_type: int, row_len: int, out) -> None:
    """out [N, row_len]: table rows rows [N] (int64) dequantized exactly; arguments checked by gather_rows."""
    _kernel(ggml_type, "qgather_rows")((int(rows.size), 1, 1), (GATHER_BLOCK, 1, 1), (
        rows, table, np.int64(U.row_stride(ggml_type, row_len)), out, np.int32(row_len)))
