"""CuPy launcher of kernels/gemv_q8r.cu's q8r_pack; numpy reference: strata_cli/model/packed.py (pack_q8_0)."""

from __future__ import annotations

import numpy as np

from ..model import packed, quants
from . import compile as nvrtc
from . import launch_util as U
from .runtime import empty


def pack_q8_0(raw, n_in: int, out=None, stream=None):
    """uint8 raw Q8_0 rows (a multiple of 32 whole rows of n_in; any shape) -> the Q8_0_R32 layout, same shape."""
    with U.on_stream(stream):
        if raw is None or not hasattr(raw, "dtype") or np.dtype(raw.dtype) != np.uint8:
            raise ValueError(f"raw: expected a uint8 array, got {getattr(raw, 'dtype', type(raw).__name__)}")
        if not raw.flags.c_contiguous:
            raise ValueError("raw: not C-contiguous")
        rows = U.weight_rows("raw", raw.reshape(-1), quants.Q8_0, n_in)
        if rows % packed.GROUP:
            raise ValueError(f"raw: {rows} rows is not a whole number of {packed.GROUP}-row groups")
        out = U.out_array("out", out, raw.shape, np.uint8, empty)
        if U.data_ptr(out) % 16:
            raise ValueError("out: data not 16-byte aligned")
        grid, block = U.elementwise_grid(rows * (n_in // 32))
        nvrtc.kernel("gemv_q8r", "q8r_pack")(grid, block, (raw, np.int64(rows), np.int32(n_in // 32), out))
    return out
