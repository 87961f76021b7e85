"""Sequence state of the verify engine and the per-window record that commit(n_keep) consumes.

The window contract, the same for every engine:
- run(tokens) reads the committed state and writes none of it; commit(n_keep) is its only writer and leaves
  exactly the state of a sequence that fed the window's first n_keep tokens and nothing else.
- A run that is never committed leaves no trace, whatever comes next: another run (which drops it), a commit
  of a later window, or nothing at all. Logits, greedy ids and the committed state afterwards equal those of an
  engine that never ran it.
- Committed state: n_past, GDN recurrent and conv state, KV cells and pooled indexer blocks of positions below
  n_past, the indexer tail (raw keys of the block being filled), PLE history and n-gram predecessors.

What a window writes beyond that:
- KV cells of its own positions (>= n_past), live, and in the numpy engine the pooled blocks they complete: a
  query never reads a cell or block past its own position, and the next window rewrites them before any of its
  queries can see them (the GPU window pools the blocks it completes where it scores them, kernels/qsa.cu qsa_mix).
- The indexer tail is only read: the numpy window fills a copy, the GPU window reads the committed slots and its
  own keys (a window of more than ratio - n_past % ratio rows wraps over the slots of committed positions); the
  commit appends the kept keys.
- GDN state/conv and PLE history/predecessors are only read; commit replays or shifts in the kept rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, OptionError
from ..model.geometry import Geometry


@dataclass
class SequenceState:
    n_past: int
    gdn_state: dict[int, np.ndarray]    # layer -> S [Hv, dk, dv]
    gdn_conv: dict[int, np.ndarray]     # layer -> raw qkv rows [K-1, Ch], oldest first
    k_cache: dict[int, np.ndarray]      # layer -> [N, Hk, d] (normed, rotated)
    v_cache: dict[int, np.ndarray]      # layer -> [N, Hk, d]
    idx_tail: dict[int, np.ndarray]     # layer -> raw keys of the block being filled [ratio, d]
    idx_pooled: dict[int, np.ndarray]   # layer -> pooled block keys [N / ratio + 1, d]
    ple_history: np.ndarray | None      # [(Kc-1)*dilation, C*D] conv inputs, oldest first
    ple_prev: np.ndarray | None         # n-gram predecessors, oldest first, EOS-padded [n-1]

    @classmethod
    def fresh(cls, g: Geometry, n_ctx: int, layers: tuple[int, int] | None = None) -> "SequenceState":
        """layers [a, b): the state of those layers only (a stage of the layer split, engine/layer_split.py)."""
        f32 = np.float32
        a, b = layers if layers is not None else (0, g.n_layers)
        st = cls(0, {}, {}, {}, {}, {}, {}, None, None)
        for layer in (lay for lay in g.gdn_layers if a <= lay < b):
            st.gdn_state[layer] = np.zeros((g.ssm_nv, g.ssm_dk, g.ssm_dv), f32)
            st.gdn_conv[layer] = np.zeros((g.conv_kernel - 1, g.conv_dim), f32)
        for layer in (lay for lay in g.attn_layers if a <= lay < b):
            st.k_cache[layer] = np.zeros((n_ctx, g.n_head_kv, g.head_dim), f32)
            st.v_cache[layer] = np.zeros((n_ctx, g.n_head_kv, g.head_dim), f32)
            ratio = g.compress_ratios[layer]
            if ratio:
                st.idx_tail[layer] = np.zeros((ratio, g.idx_dim), f32)
                st.idx_pooled[layer] = np.zeros((n_ctx // ratio + 1, g.idx_dim), f32)
        if g.ple is not None and a <= g.ple.layer < b:
            st.ple_history = np.zeros((g.ple.history, g.hc_dim), f32)
            st.ple_prev = np.full(g.ple.ngram_size - 1, g.ple.eos_token_id, np.int64)
        return st


@dataclass
class GDNRecord:
    conv_seq: np.ndarray   # [K-1+T, Ch]
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray


@dataclass
class WindowRecord:
    """What run() leaves for commit(): enough to advance every state to any accepted prefix."""

    pos0: int
    tokens: np.ndarray
    gdn: dict[int, GDNRecord] = field(default_factory=dict)
    idx_raw: dict[int, np.ndarray] = field(default_factory=dict)   # layer -> raw indexer keys [T, d]
    ple_seq: np.ndarray | None = None                               # [Hh+T, C*D]

    @property
    def T(self) -> int:
        return len(self.tokens)


DEFAULT_CTX = 4096


def resolve_ctx(g: Geometry, n_ctx: int | None) -> int:
    """Context cells an engine allocates: min(model context, DEFAULT_CTX) unless given, within the model's."""
    n_ctx = min(g.n_ctx, DEFAULT_CTX) if n_ctx is None else int(n_ctx)
    if not 1 <= n_ctx <= g.n_ctx:
        raise OptionError(f"context {n_ctx} outside 1..{g.n_ctx} (the model's context_length)")
    return n_ctx


def state_bytes(g: Geometry, n_ctx: int) -> int:
    """Bytes SequenceState.fresh allocates for n_ctx cells (arithmetic only, nothing allocated): the KV cache and
    pooled indexer keys grow with n_ctx, the recurrent states do not."""
    f32 = 4
    total = len(g.gdn_layers) * (g.ssm_nv * g.ssm_dk * g.ssm_dv + (g.conv_kernel - 1) * g.conv_dim) * f32
    for layer in g.attn_layers:
        total += 2 * n_ctx * g.n_head_kv * g.head_dim * f32
        ratio = g.compress_ratios[layer]
        if ratio:
            total += (ratio + n_ctx // ratio + 1) * g.idx_dim * f32
    if g.ple is not None:
        total += g.ple.history * g.hc_dim * f32
    return total


def check_memory(what: str, need: int, n_ctx: int, available: int | None, where: str = "the host") -> None:
    """Refuse in one line, before allocating, a context whose buffers cannot fit (available None: unknown)."""
    if available is not None and need > available:
        raise InputError(f"--ctx {n_ctx}: {what} needs {need / 2**30:.2f} GiB, {where} has {available / 2**30:.2f} "
                         "GiB available (give a smaller --ctx)")


def check_window(tokens, pos0: int | None, n_past: int, n_vocab: int, n_ctx: int, max_t: int | None) -> np.ndarray:
    """The verify contract's input checks, shared by every engine: one-line InputErrors."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if tokens.size == 0:
        raise InputError("empty window: no tokens")
    if max_t is not None and tokens.size > max_t:
        raise InputError(f"window of {tokens.size} tokens exceeds max_t {max_t}")
    bad = tokens[(tokens < 0) | (tokens >= n_vocab)]
    if bad.size:
        raise InputError(f"token id {int(bad[0])} out of range 0..{n_vocab - 1}")
    if pos0 is not None and pos0 != n_past:
        raise InputError(f"window starts at position {pos0} but the sequence holds {n_past} tokens")
    if n_past + tokens.size > n_ctx:
        raise InputError(f"window past the context: positions {n_past}..{n_past + tokens.size - 1}"
                         f" exceed context {n_ctx}")
    return tokens


def check_n_keep(n_keep: int, T: int) -> None:
    if not 0 <= n_keep <= T:
        raise InputError(f"n_keep {n_keep} outside 0..{T} (the window's rows)")
