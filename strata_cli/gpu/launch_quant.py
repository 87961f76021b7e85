"""CuPy launchers of kernels/gemv_quant.cu: the dense and grouped-expert GEMVs and the row gather of the GGUF block
types other than Q8_0 (K-quants, i-quants, legacy 4/5-bit, TQ, FP4), one compiled module per type
("gemv_quant.<type>", compile.source). launch_gemv.launch_gemv, launch_moe and launch_embed.gather_rows hand these
types here after their own checks; the numpy references are theirs (ops/gemv.gemv, ops/moe.routed_experts_raw,
ops/embed.gather_rows), over model/quants.dequantize.

The GEMVs stage whole blocks of a warp's rows in shared memory with 16-byte loads and sum per scale group
(kernels/gemv_quant.cu); they need the weight's base address at the block's natural alignment (quant_decode.cuh
QAl), which every GGUF tensor and every row or expert view of one has (check_block_align says so otherwise).
The routed experts' gate and up projections of one type run as one launch (launch_gateup_quant). The grouped expert
GEMVs have two kernel families: the CUDA-core qgemv_expert_* / qgemv_gateup_* and the tensor-core qtc_expert_* /
qtc_gateup_* (mma.sync over the exact folded q-form, cp.async stage rings); launch_util.expert_tensor_cores(T), the
window's WindowPath, picks one per T.

Legend: T window rows, n_in / n_out GEMV widths, J (row, slot) entries of the MoE, N gathered rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

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
QTC_MT4_BYTES = 8192  # a warp takes 4 m tiles of 16 rows where a 64-row stage fits this, else 2 (QTC_MT)
SMEM_DEFAULT = 48 * 1024  # dynamic shared memory a launch gets without raising the kernel's limit
_raised_smem: set = set()


@dataclass(frozen=True)
class QtcTune:
    """The tensor-core grouped expert GEMVs' tunables (kernels/gemv_quant.cu QTC_*: what a block holds and how many
    bytes each warp keeps in flight) and the launcher's split-K target. The defaults are the kernels'; another value
    of a compiled one goes into the type's module as a define (defines(type)), so each variant is its own module.
    bench/quant_gemv_bench.py --tune times TUNE_GRID; the winner becomes the one default and the rest goes."""

    warps: int = 4  # QTC_WARPS: warps per block (2, 4, 8)
    mt: int = 0  # QTC_MT: m tiles of 16 rows per warp (2, 4); 0: 4 where a 64-row stage fits QTC_MT4_BYTES
    ring_bytes: int = 12288  # QTC_RING_BYTES: shared memory per warp the stage ring aims at (2 .. 4 stages)
    target_warps: int = 2048  # split K until a launch has about this many warps, one step each at least
    probe: bool = False  # QTC_PROBE: stream the weights through the rings but decode nothing (wrong sums: a probe
    # of what the grid and the rings alone reach, so the bench shows how much of the time the decode takes)

    def defines(self, ggml_type: int) -> tuple[str, ...]:
        """The defines of the type's module: the compiled tunables whose value for the type differs from the
        kernel's default (none for the default tune: the module it has always been)."""
        out = []
        if self.warps != 4:
            out.append(f"QTC_WARPS={self.warps}")
        if qtc_mt(ggml_type, self) != qtc_mt(ggml_type, QtcTune()):
            out.append(f"QTC_MT={self.mt}")
        if self.ring_bytes != 12288:
            out.append(f"QTC_RING_BYTES={self.ring_bytes}")
        if self.probe:
            out.append("QTC_PROBE=1")
        return tuple(out)

    def label(self) -> str:
        base = QtcTune()
        diff = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                if getattr(self, f.name) != getattr(base, f.name)]
        return ",".join(diff) or "default"


TUNE = QtcTune()  # what every launch uses (the bench's sweep replaces it while it times a variant)
# The sweep of bench/quant_gemv_bench.py --tune (kernels/gemv_quant.cu: the T = 1 occupancy math it spans). 8 warps
# a block go with 2 m tiles: 16 warps an SM at <= 128 registers (4 m tiles need ~168: 1 block of 8 warps an SM).
# Shared memory a block (stages), Q2_K / Q4_0, of an SM's 228 KiB: default 56 (2) / 40 KiB (2); mt=2 42 (3) / as
# default; warps=8 with mt=2 84 (3) / 80 (2); ring_bytes=24576 84 (3) / 80 (4); mt=2 with it 56 (4) / 80 (4).
TUNE_GRID = (
    QtcTune(),
    QtcTune(target_warps=8192),  # launcher only: more split-K at T >= 2 (T = 1 is at ksplit = QTC_WARPS already)
    QtcTune(mt=2),  # 2-bit types: twice the row sets of half the rows (T = 1 Q2_K gate/up: 1600 warps, 400 blocks)
    QtcTune(warps=8, mt=2, target_warps=8192),  # and split K 8 ways (T = 1: 3200 warps, 1-2 steps each)
    QtcTune(ring_bytes=24576),  # one or two more stages in flight per warp
    QtcTune(mt=2, ring_bytes=24576),  # T = 1: a warp's whole slice (2-3 steps) in flight at once
    QtcTune(probe=True),  # the probes: the same grids and rings decoding nothing (rel_err ~1 by design)
    QtcTune(warps=8, mt=2, target_warps=8192, probe=True),
)


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


def qtc_mt(ggml_type: int, tune: QtcTune | None = None) -> int:
    """m tiles of 16 rows per warp (QTC_MT): the expert kernel's warp takes 16 qtc_mt rows, the gate/up kernel's
    8 qtc_mt rows of each matrix."""
    tune = tune or TUNE
    return tune.mt or (4 if 64 * _qtc_chunks(ggml_type) * 16 <= QTC_MT4_BYTES else 2)


def qtc_smem_bytes(ggml_type: int, tune: QtcTune | None = None) -> int:
    """Dynamic shared memory of a qtc_* block: QTC_WARPS rings of QTC_NSTAGE stages of 16 qtc_mt row units, each
    unit QCHUNKS 16-byte chunks (QTC_SMEM_BYTES)."""
    tune = tune or TUNE
    stage = 16 * qtc_mt(ggml_type, tune) * 16 * _qtc_chunks(ggml_type)
    return tune.warps * min(4, max(2, tune.ring_bytes // stage)) * stage


def qtc_split(n_sets: int, n_in: int, tune: QtcTune | None = None) -> int:
    """ksplit of the qtc_* kernels: warps of a block sharing one row set's input axis (interleaved steps), for
    n_sets row sets (rows per warp x groups) in the launch."""
    tune = tune or TUNE
    steps = -(-n_in // QSTEP)
    ksplit = 1
    while ksplit < tune.warps and n_sets * ksplit < tune.target_warps and steps >= 2 * ksplit:
        ksplit *= 2
    return ksplit


def qtc_grid(ggml_type: int, gateup: bool, n_out: int, n_groups: int, n_in: int,
             tune: QtcTune | None = None) -> tuple[tuple[int, int, int], int, int]:
    """(grid, ksplit, dynamic shared bytes) of a qtc_* launch over n_groups expert groups: a warp takes 16 qtc_mt
    rows (gate/up: 8 qtc_mt of each matrix), QTC_WARPS / ksplit row sets a block, grid (row blocks, groups)."""
    tune = tune or TUNE
    rows = (8 if gateup else 16) * qtc_mt(ggml_type, tune)
    ksplit = qtc_split(-(-n_out // rows) * n_groups, n_in, tune)
    if n_groups > U.MAX_GRID_Y:
        raise ValueError(f"ids: {n_groups} (row, slot) entries exceed {U.MAX_GRID_Y}")
    return (-(-n_out // (rows * (tune.warps // ksplit))), n_groups, 1), ksplit, qtc_smem_bytes(ggml_type, tune)


def _launch_qtc(ggml_type: int, function: str, n_out: int, n_groups: int, n_in: int, args) -> None:
    """A qtc_* kernel over n_groups expert groups (qtc_grid); args(ksplit) gives its arguments for the ksplit
    qtc_split chose."""
    tune = TUNE
    grid, ksplit, smem = qtc_grid(ggml_type, function.startswith("qtc_gateup"), n_out, n_groups, n_in, tune)
    defines = tune.defines(ggml_type)
    kernel = _kernel(ggml_type, function, defines)
    if smem > SMEM_DEFAULT and (ggml_type, function, defines) not in _raised_smem:
        kernel.max_dynamic_shared_size_bytes = smem  # (the kernel writes NaN rows if it gets less)
        _raised_smem.add((ggml_type, function, defines))
    kernel(grid, (tune.warps * 32, 1, 1), args(np.int32(ksplit)), shared_mem=smem)


def launch_expert_gemv_quant(w, ggml_type: int, expert_stride: int, n_expert: int, groups, n_groups: int, T: int, x,
                             x_div: int, n_in: int, y, *, act: int = U.ACT_NONE, mul=None,
                             mul_strides: tuple[int, int] = (0, 0)) -> None:
    """y [*, n_out]: entry j of the n_groups groups = its group's expert applied to x row j // x_div (groups from
    moe_group or tier_group); arguments checked by launch_moe."""
    J, n_out = n_groups, y.shape[1]
    U.check_vector_rows("x", x)
    check_block_align("w", ggml_type, w, expert_stride)
    g_expert, g_count, g_entries = groups
    if U.expert_tensor_cores(T):
        _launch_qtc(ggml_type, f"qtc_expert_t{U.nt_bucket(T)}", n_out, J, n_in, lambda ksplit: (
            w, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert,
            g_count, g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), ksplit, np.int32(act),
            np.float32(1.0), U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1])))
        return
    ksplit, _ = quant_split(n_out, n_in, T, n_matrices=J)
    grid, block = U.expert_grid(n_out, J, ksplit, rpw=QROWS[U.nt_bucket(T)])
    _kernel(ggml_type, f"qgemv_expert_t{U.nt_bucket(T)}")(grid, block, (
        w, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert, g_count,
        g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), np.int32(ksplit), np.int32(act),
        np.float32(1.0), U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1])))


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
    if U.expert_tensor_cores(T):
        _launch_qtc(ggml_type, f"qtc_gateup_t{U.nt_bucket(T)}", n_out, J, n_in, lambda ksplit: (
            gate, up, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert,
            g_count, g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), ksplit))
        return
    ksplit, _ = quant_split(n_out, n_in, T, n_matrices=2 * J)  # a warp holds half its rows of each matrix
    grid, block = U.expert_grid(n_out, J, ksplit, rpw=QROWS[U.nt_bucket(T)] // 2)
    _kernel(ggml_type, f"qgemv_gateup_t{U.nt_bucket(T)}")(grid, block, (
        gate, up, np.int64(expert_stride), np.int64(U.row_stride(ggml_type, n_in)), np.int32(n_expert), g_expert,
        g_count, g_entries, x, np.int32(x_div), np.int32(n_in), y, np.int32(n_out), np.int32(ksplit)))


def launch_gather_quant(rows, table, ggml_type: int, row_len: int, out) -> None:
    """out [N, row_len]: table rows rows [N] (int64) dequantized exactly; arguments checked by gather_rows."""
    _kernel(ggml_type, "qgather_rows")((int(rows.size), 1, 1), (GATHER_BLOCK, 1, 1), (
        rows, table, np.int64(U.row_stride(ggml_type, row_len)), out, np.int32(row_len)))
