"""Ids from logits: greedy (argmax_rows) and temperature sampling keyed by absolute position (Gumbel-max over
Philox4x32-10 draws); the references of gpu/launch_sampling.py.

Row t of a window at pos0 draws with counter (token id, pos0 + t) under key `seed`, so a sampled text does not
depend on how drafts cut the windows, and the GPU kernel (kernels/sampling.cu) draws the very same numbers.
"""

from __future__ import annotations

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x32-10 (Salmon et al., SC'11) of counters (c0, c1, c2, c3) under the 64-bit key (k0 = low word),
    vectorised over the counter words (uint32 arrays or scalars): the four output words."""
    x0, x1, x2, x3 = (np.asarray(c, dtype=np.uint64).astype(np.uint32) for c in (c0, c1, c2, c3))
    x0, x1, x2, x3 = np.broadcast_arrays(x0, x1, x2, x3)
    k0, k1 = np.uint32(key & 0xFFFFFFFF), np.uint32((key >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        p0 = x0.astype(np.uint64) * M0
        p1 = x2.astype(np.uint64) * M1
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & MASK32).astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & MASK32).astype(np.uint32)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        k0, k1 = np.uint32((int(k0) + int(W0)) & 0xFFFFFFFF), np.uint32((int(k1) + int(W1)) & 0xFFFFFFFF)
    return x0, x1, x2, x3


def philox4x32(c0: np.ndarray, c1: np.ndarray, key: int) -> np.ndarray:
    """First 32-bit output of Philox4x32-10 for counters (c0, c1, 0, 0), vectorised over c0/c1 (uint32)."""
    return philox4x32_10(c0, c1, 0, 0, key)[0]


def gumbel(seed: int, position: int, vocab: int) -> np.ndarray:
    """Gumbel(0,1) noise [vocab] in float64 for one absolute position."""
    ids = np.arange(vocab, dtype=np.uint32)
    bits = philox4x32(ids, np.full(vocab, position & 0xFFFFFFFF, np.uint32), seed)
    u = (bits.astype(np.float64) + 0.5) / 4294967296.0
    return -np.log(-np.log(u))


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """logits [T, V] -> greedy ids [T] int32, ties -> lower id."""
    return logits.argmax(axis=1).astype(np.int32)


def nonfinite_rows(logits: np.ndarray) -> np.ndarray:
    """logits [T, V] -> [T] int32: 1 where the row holds a NaN or +-Inf (the flag kernels/sampling.cu's argmax
    pass writes), else 0."""
    return (~np.isfinite(logits)).any(axis=1).astype(np.int32)


def sample_rows(logits: np.ndarray, positions: np.ndarray, temperature: float, seed: int) -> np.ndarray:
    """logits [T, V] -> ids [T]: argmax(logits / temperature + gumbel(seed, pos)); greedy when temperature <= 0."""
    if temperature <= 0:
        return argmax_rows(logits)
    out = np.empty(len(logits), dtype=np.int32)
    for t, pos in enumerate(positions):
        score = logits[t].astype(np.float64) / temperature + gumbel(seed, int(pos), logits.shape[1])
        out[t] = int(np.argmax(score))
    return out
