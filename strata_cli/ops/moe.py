"""Mixture of experts: softmax router with top-k renormalised, SwiGLU experts, gated shared expert."""

from __future__ import annotations

import numpy as np

from .basic import linear, sigmoid, silu
from .gemv import dequant_rows


def router_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits [T, E] -> ids [T, k] (descending probability, ties -> lower id), weights [T, k] summing to 1."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    return ids.astype(np.int32), (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """x [T, D]; w_gate, w_up [F, D]; w_down [D, F] -> [T, D]."""
    return linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)


def routed_experts(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, expert_weights) -> np.ndarray:
    """x [T, D]; ids, weights [T, K]; expert_weights(e) -> (w_gate [F, D], w_up [F, D], w_down [D, F]).
    Each used expert runs once over all rows routed to it. Returns sum_j weights_j * expert_{ids_j}(x) [T, D]."""
    out = np.zeros_like(x, dtype=np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        y = swiglu(x[rows], *expert_weights(int(e)))
        np.add.at(out, rows, y * weights[rows, slots][:, None])
    return out


def combine(parts: np.ndarray, weights: np.ndarray, shared: np.ndarray | None = None) -> np.ndarray:
    """parts [>= T*K, D] (entry t*K + k: expert ids[t, k]'s unweighted output), weights [T, K] -> [T, D] summed in
    slot order in float32 (+ shared [T, D]): the reference of kernels/moe.cu moe_combine and of the combine the
    hyper-connection write computes (kernels/hyper.cu Pending)."""
    T, K = weights.shape
    p = parts[:T * K].reshape(T, K, -1).astype(np.float32)
    acc = np.zeros((T, p.shape[2]), np.float32)
    for k in range(K):
        acc = acc + weights[:, k:k + 1].astype(np.float32) * p[:, k]
    return acc if shared is None else (acc + shared).astype(np.float32)


def shared_expert(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
                  w_scalar_gate: np.ndarray) -> np.ndarray:
    """SwiGLU shared expert scaled by sigmoid(w_scalar_gate . x); w_scalar_gate [D]."""
    return swiglu(x, w_gate, w_up, w_down) * sigmoid(x @ w_scalar_gate)[:, None]


def routed_experts_raw(x, ids, weights, gate_raw, up_raw, down_raw, ggml_types):
    """routed_experts over raw [E, F, D] gate/up and [E, D, F] down tensors (gpu/launch_moe's signature);
    ggml_types = (gate, up, down)."""
    gt, ut, dt = ggml_types
    E, D = gate_raw.shape[0], x.shape[1]
    w_gate = dequant_rows(gate_raw, gt, D).reshape(E, -1, D)
    w_up = dequant_rows(up_raw, ut, D).reshape(E, -1, D)
    w_down = dequant_rows(down_raw, dt, w_gate.shape[1]).reshape(E, D, -1)
    return routed_experts(x, ids, weights, lambda e: (w_gate[e], w_up[e], w_down[e]))


def shared_expert_raw(x, gate_raw, up_raw, down_raw, scalar_gate_raw, ggml_types):
    """shared_expert over raw gate/up [F, D], down [D, F], scalar gate [D]; types (gate, up, down, sg)."""
    gt, ut, dt, st = ggml_types
    D = x.shape[1]
    w_gate = dequant_rows(gate_raw, gt, D)
    w_down = dequant_rows(down_raw, dt, w_gate.shape[0])
    w_sg = dequant_rows(scalar_gate_raw, st, D).reshape(-1).astype(np.float32)  # 1-D weights stay float32
    return shared_expert(x, w_gate, dequant_rows(up_raw, ut, D), w_down, w_sg)
