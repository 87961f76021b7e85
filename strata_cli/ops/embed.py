"""Embedding rows gathered by id (the reference of gpu/launch_embed.py): the token embedding of a window and the
PLE n-gram table rows, dequantized from the GGUF's raw rows."""

from __future__ import annotations

import numpy as np

from .gemv import dequant_rows


def gather_rows(rows: np.ndarray, table_raw: np.ndarray, ggml_type: int, row_len: int) -> np.ndarray:
    """rows [T, Hn] int64 ids into table_raw (raw rows of row_len values) -> emb [T, Hn * row_len] float32."""
    picked = np.asarray(table_raw)[np.asarray(rows).reshape(-1)]
    return dequant_rows(picked, ggml_type, row_len).astype(np.float32).reshape(rows.shape[0], -1)
