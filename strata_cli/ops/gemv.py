"""The GEMV over GGUF raw weights (the reference of gpu/launch_gemv.py) and the dequantization of raw rows that
every raw-weight reference uses (ops.hyper.hc_read_raw, ops.moe.*_raw, ops.embed.gather_rows).

Matrices dequantize to float64, so the GEMMs accumulate like ops.basic.linear. Raw weights come in numpy order:
typed F32/F16 arrays or byte rows (uint8, also accepted for F32/F16), as GGUF memmaps and model.quants.quantize
give them, or the GPU's repacked Q8_0 (model/packed.py).
"""

from __future__ import annotations

import numpy as np

from ..model import packed, quants
from .basic import linear

_TYPED = {quants.F32: np.float32, quants.F16: np.float16}


def dequant_rows(w_raw: np.ndarray, ggml_type: int, n_in: int) -> np.ndarray:
    """Raw weight holding whole rows of n_in values -> float64 [rows, n_in]."""
    raw = np.ascontiguousarray(w_raw)
    if ggml_type == packed.Q8_0_R32:  # the GPU's repacked Q8_0: same bytes, rows grouped by 32
        raw, ggml_type = packed.unpack_q8_0(raw, n_in), quants.Q8_0
    if ggml_type in _TYPED and raw.dtype == np.uint8:
        raw = raw.view(_TYPED[ggml_type])
    if ggml_type == quants.BF16 and raw.dtype == np.uint16:
        raw = raw.view(np.uint8)
    return quants.dequantize(raw.reshape(-1, raw.shape[-1]), ggml_type).reshape(-1, n_in).astype(np.float64)


def gemv(w_raw: np.ndarray, ggml_type: int, n_in: int, x: np.ndarray) -> np.ndarray:
    """y [T, n_out] = x [T, n_in] @ dequantize(w_raw).T."""
    return linear(x, dequant_rows(w_raw, ggml_type, n_in))
