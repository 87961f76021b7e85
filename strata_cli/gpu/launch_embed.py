"""CuPy launcher of kernels/embed.cu, mirroring strata_cli/ops/embed.py: table rows gathered by id (the token
embedding of a window, the PLE n-gram table rows). `out=` preallocated for graph capture, `stream=` None for the
current stream.

Legend: T window rows, Hn rows gathered per token, row_len values per table row.
"""

from __future__ import annotations

import numpy as np

from . import compile as nvrtc
from . import launch_quant
from . import launch_util as U
from .runtime import empty

EMBED_BLOCK = 256  # kernels/embed.cu


def gather_rows(rows, table, ggml_type: int, row_len: int, out=None, stream=None):
    """emb [T, Hn*row_len] f32: the table rows rows [T, Hn] (int64) dequantized and concatenated per token.
    table holds raw rows of ggml_type (any type of model/quants.py), on the device or in mapped host memory."""
    with U.on_stream(stream):
        U.check_array("rows", rows, np.int64, (None, None))
        T, Hn = rows.shape
        U.weight_rows("table", table, ggml_type, row_len)
        out = U.out_array("out", out, (T, Hn * row_len), np.float32, empty)
        if launch_quant.handles(ggml_type):  # K-quants, i-quants, ...: kernels/gemv_quant.cu
            launch_quant.launch_gather_quant(rows, table, ggml_type, row_len, out)
            return out
        nvrtc.kernel("embed", "gather_rows")((T * Hn, 1, 1), (EMBED_BLOCK, 1, 1), (
            rows, table, np.int64(U.row_stride(ggml_type, row_len)), np.int32(ggml_type), out, np.int32(row_len)))
    return out
