"""Float32 values -> the raw bytes of any GGML type strata reads: by gguf.quants where it quantizes the type (the
converter's and the Python reference's encoder, bit-identical to ggml's reference quantizers), by strata's own
encoders where it does not.

Both `strata quantize` and `make-model` encode through `encode`, so a synthetic model of any type is the F32 model of
the same seed quantized. gguf.quants encodes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0 and MXFP4;
strata encodes the K-quants (synth/encode_k.py: llama.cpp's reference structure, least-squares scales), the i-quants
and NVFP4 (synth/encode_iq.py: a scale per sub-block, the nearest grid entry or table value): valid blocks with a low
error, not llama-quantize's bytes.
"""

from __future__ import annotations

import numpy as np

from ..model import quants as Q
from . import encode_iq, encode_k

BY_GGUF = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ1_0, Q.TQ2_0, Q.MXFP4)
BY_STRATA = {**encode_k.ENCODERS, **encode_iq.ENCODERS}  # ggml type -> encoder of float32 [blocks, block elements]
GGUF_ROW_ELEMENTS = 4096  # about this many values per row handed to gguf.quants


def encoder_of(ggml_type: int) -> str:
    """Which encoder writes this type: "gguf.quants" or "strata"."""
    return "strata" if ggml_type in BY_STRATA else "gguf.quants"


def encode(values: np.ndarray, ggml_type: int) -> np.ndarray:
    """Flat float32 values (a whole number of the type's blocks, never spanning a row) -> flat uint8 bytes."""
    import gguf
    from gguf import quants as gq

    if ggml_type == Q.F32:
        return np.ascontiguousarray(values, dtype=np.float32).view(np.uint8).reshape(-1)
    if ggml_type == Q.F16:
        return np.ascontiguousarray(values, dtype=np.float16).view(np.uint8).reshape(-1)
    if ggml_type not in BY_GGUF and ggml_type not in BY_STRATA:
        raise ValueError(f"{Q.TYPE_NAMES.get(ggml_type, ggml_type)}: no encoder for this type")
    elems = Q.BLOCK[ggml_type][0]
    rows = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, elems)
    if ggml_type in BY_STRATA:
        return np.ascontiguousarray(BY_STRATA[ggml_type](rows), dtype=np.uint8).reshape(-1)
    # gguf.quants works row by row: rows of one block made BF16 (a block of 1) ~180x and Q8_0 ~8x slower than rows
    # of ~4096 elements, so blocks go in wide rows (every block is encoded alone either way: the bytes are the same)
    per_row = max(1, GGUF_ROW_ELEMENTS // elems)
    whole = rows.shape[0] // per_row * per_row
    qtype = gguf.GGMLQuantizationType(ggml_type)
    parts = [gq.quantize(rows[:whole].reshape(-1, per_row * elems), qtype)] if whole else []
    if whole < rows.shape[0]:
        parts.append(gq.quantize(rows[whole:], qtype))
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(-1) for p in parts])


def decode(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """Flat uint8 bytes of an F32, F16 or BF16 tensor -> flat float32 values (the inputs `quantize` reads)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if ggml_type == Q.F32:
        return raw.view(np.float32)
    if ggml_type == Q.F16:
        return raw.view(np.float16).astype(np.float32)
    if ggml_type == Q.BF16:
        return Q.dequant_bf16(raw)
    raise ValueError(f"{Q.TYPE_NAMES.get(ggml_type, ggml_type)}: not a float type")
