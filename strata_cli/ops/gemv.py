"""Numpy references over GGUF raw weights: the exact signatures of the GPU launchers in strata_cli/gpu/launch_*.py.

Each dequantizes its raw weights (float64 matrices, so the GEMMs accumulate like ops.basic.linear) and calls the
float reference in ops.hyper / ops.moe. Raw weights come in numpy order: typed F32/F16 arrays or byte rows
(uint8, also accepted for F32/F16), as GGUF memmaps and model.quants.quantize give them.

Shape letters as in ops/__init__: T rows, D hidden, C streams, L low rank, E experts, K top-k, F expert width.
"""

from __future__ import annotations

import numpy as np

from ..model import packed, quants
from . import hyper, moe
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


def hc_read_raw(R, norm_w, down_raw, down_type, up_raw, up_type, inject_raw, inject_type, eps):
    """ops.hyper.hc_read over raw weights: down [L, C*D], up [C*D, L], inject [C, C*D] or None."""
    T, C, D = R.shape
    w_down = dequant_rows(down_raw, down_type, C * D)
    w_up = dequant_rows(up_raw, up_type, w_down.shape[0])
    w_inject = None if inject_raw is None else dequant_rows(inject_raw, inject_type, C * D)
    return hyper.hc_read(R, norm_w, w_down, w_up, w_inject, eps)


def routed_experts_raw(x, ids, weights, gate_raw, up_raw, down_raw, ggml_types):
    """ops.moe.routed_experts over raw [E, F, D] gate/up and [E, D, F] down tensors; ggml_types = (gate, up, down)."""
    gt, ut, dt = ggml_types
    E, D = gate_raw.shape[0], x.shape[1]
    w_gate = dequant_rows(gate_raw, gt, D).reshape(E, -1, D)
    w_up = dequant_rows(up_raw, ut, D).reshape(E, -1, D)
    w_down = dequant_rows(down_raw, dt, w_gate.shape[1]).reshape(E, D, -1)
    return moe.routed_experts(x, ids, weights, lambda e: (w_gate[e], w_up[e], w_down[e]))


def shared_expert_raw(x, gate_raw, up_raw, down_raw, scalar_gate_raw, ggml_types):
    """ops.moe.shared_expert over raw gate/up [F, D], down [D, F], scalar gate [D]; types (gate, up, down, sg)."""
    gt, ut, dt, st = ggml_types
    D = x.shape[1]
    w_gate = dequant_rows(gate_raw, gt, D)
    w_down = dequant_rows(down_raw, dt, w_gate.shape[0])
    w_sg = dequant_rows(scalar_gate_raw, st, D).reshape(-1).astype(np.float32)  # 1-D weights stay float32
    return moe.shared_expert(x, w_gate, dequant_rows(up_raw, ut, D), w_down, w_sg)


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """logits [T, V] -> greedy ids [T] int32, ties -> lower id."""
    return logits.argmax(axis=1).astype(np.int32)
