"""CuPy launchers of kernels/gemv.cu and kernels/gemv_q8r.cu (dense GEMVs), mirroring strata_cli/ops/gemv.py.

Arrays are CuPy, float32, C-contiguous. `gemv` takes `out=` (checked, never reallocated) and `split=`, the split-K
workspace (with both given nothing is allocated, so the call can be captured in a CUDA graph), and `stream=`
(None: the current stream). The expert GEMVs of the same kernel files are launched by launch_moe.

Legend: T window rows, n_in / n_out GEMV widths.
"""

from __future__ import annotations

import numpy as np

from . import compile as nvrtc
from . import launch_quant
from . import launch_util as U
from .runtime import empty
from .splitk import ZSPLIT_TILES, SplitK, zsplit_args  # noqa: F401  (ZSPLIT_TILES, SplitK: this module's API)



def launch_gemv(w, ggml_type: int, n_in: int, x, y, split: SplitK | None, *, act: int = U.ACT_NONE,
                div: float = 1.0, mul=None, mul_strides: tuple[int, int] = (0, 0),
                tensor_cores: bool | None = None) -> None:
    """y [T, n_out] = act(x [T, n_in] @ W^T / div) * mul[t*mul_st + o*mul_so]; arguments already checked.
    tensor_cores: Q8_0_R32 on the tensor-core kernels (T >= 2) or not; None: as launch_util.window_path(T) says.
    Split-K over grid z finishes inside the launch (the last block of each tile), so every GEMV is one node; a
    launch that splits over z needs `split` (None: a fresh one, outside a capture only)."""
    if launch_quant.handles(ggml_type):  # K-quants, i-quants, ...: kernels/gemv_quant.cu
        launch_quant.launch_gemv_quant(w, ggml_type, n_in, x, y, split, act=act, div=div, mul=mul,
                                       mul_strides=mul_strides)
        return
    T, n_out = y.shape
    max_z = U.GEMV_MAX_ZSPLIT if T <= U.GEMV_MAXT else 1
    if ggml_type == U.Q8_0_R32:
        U.check_vector_rows("x", x)
        # mma.sync for windows (kernels/gemv_q8r.cu says why), else CUDA cores
        tc = U.q8r_tensor_cores(T) if tensor_cores is None else tensor_cores and T >= 2
        rpw = U.Q8R_GROUP * U.Q8T_LANE_ROWS if tc else U.q8r_rows_per_warp(T)
        ksplit, zsplit = U.q8r_split(n_out, n_in, T, max_z=max_z, rpw=rpw, fill_sms=0 if tc else U.sm_count())
        grid, block = U.gemv_grid(n_out, T, ksplit, zsplit, rpw=rpw)
        name = f"gemv_q8r_{'tc_' if tc else ''}t{U.nt_bucket(T)}"
        geometry = (np.int32(n_in // 32),)
        module = "gemv_q8r"
    else:
        ksplit, zsplit = U.gemv_split(n_out, n_in, max_z=max_z)
        grid, block = U.gemv_grid(n_out, T, ksplit, zsplit)
        name = f"gemv_{U.TYPE_SUFFIX[ggml_type]}_t{U.nt_bucket(T)}"
        geometry, module = (np.int64(U.row_stride(ggml_type, n_in)),), f"gemv.{U.TYPE_SUFFIX[ggml_type]}"
    partial, tile_done = zsplit_args(grid, zsplit, split)
    nvrtc.kernel(module, name)(grid, block, (
        w, *geometry, x, np.int32(n_in), y, np.int32(n_out), np.int32(T), np.int32(ksplit), np.int32(act),
        np.float32(div), U.null_or(mul), np.int32(mul_strides[0]), np.int32(mul_strides[1]), partial, tile_done))


def gateup_fuses(ggml_types, T: int) -> bool:
    """Whether launch_q8r_gateup takes a dense gate/up pair of these (gate, up) types for a T-row window: both
    Q8_0_R32 on the CUDA-core path (kernels/gemv_q8r.cu gemv_q8r_gateup_dense_t<NT>, T <= 2; from T = 4 the dense
    GEMVs take tensor cores, two launches)."""
    return (tuple(ggml_types) == (U.Q8_0_R32, U.Q8_0_R32) and U.nt_bucket(T) in U.Q8R_DENSE_GATEUP_NT
            and not U.q8r_tensor_cores(T))


def launch_q8r_gateup(gate, up, n_in: int, x, y, split: SplitK | None) -> None:
    """y [T, F] = silu(x @ gate^T) * (x @ up^T) in one launch, gate and up raw Q8_0_R32 [F, n_in] (gateup_fuses);
    arguments already checked. The K split is launch_gemv's for either matrix alone, so y holds the bits of
    launch_gemv(up) into y, then launch_gemv(gate, act=SILU, mul=y)."""
    T, F = y.shape
    U.check_vector_rows("x", x)
    nt = U.nt_bucket(T)
    max_z = U.GEMV_MAX_ZSPLIT if 2 * F <= U.Q8R_MAX_ZROWS else 1  # the z slices hold gate and up: T x 2F floats
    ksplit, zsplit = U.q8r_split(F, n_in, T, max_z=max_z, rpw=U.q8r_rows_per_warp(T), fill_sms=U.sm_count())
    grid, block = U.gemv_grid(F, T, ksplit, zsplit, rpw=U.Q8R_GROUP * U.Q8R_GATEUP_ROWS[nt])
    partial, tile_done = zsplit_args(grid, zsplit, split)
    nvrtc.kernel("gemv_q8r", f"gemv_q8r_gateup_dense_t{nt}")(grid, block, (
        gate, up, np.int32(n_in // 32), x, np.int32(n_in), y, np.int32(F), np.int32(T), np.int32(ksplit), partial,
        tile_done))


def gemv(w_raw, ggml_type: int, n_in: int, x, out=None, split: SplitK | None = None, stream=None,
         tensor_cores: bool | None = None):
    """y [T, n_out] = x [T, n_in] @ dequantize(w_raw).T; w_raw holds n_out raw rows of ggml_type (tensor_cores:
    launch_gemv's)."""
    with U.on_stream(stream):
        n_out = U.weight_rows("w_raw", w_raw, ggml_type, n_in)
        U.check_array("x", x, np.float32, (None, n_in))
        out = U.out_array("out", out, (x.shape[0], n_out), np.float32, empty)
        launch_gemv(w_raw, ggml_type, n_in, x, out, split, tensor_cores=tensor_cores)
    return out
