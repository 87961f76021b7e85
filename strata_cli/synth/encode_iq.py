"""strata's own encoders of the i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS)
and NVFP4, which gguf.quants can decode but not encode. Vectorized over blocks; valid blocks and a low error, not
llama-quantize's bytes (its i-quant searches use importance weights and neighbour lists; these do not).

Table types (IQ4_NL, IQ4_XS, NVFP4): per (sub-)block a scale that maps the largest magnitude onto the table's end,
refined once by least squares, then the nearest of the 16 values. Grid types: per sub-block a scale, then per group
of 8 (4 for IQ3_*) weights the nearest grid entry of gguf.quants' grid (one matrix product over the whole grid) for
the magnitudes, the signs stored apart (IQ2_XXS, IQ2_XS, IQ3_XXS keep an even number of minus signs per 8, so an odd
group gives up the sign of its smallest weight, as llama.cpp does); IQ1_S / IQ1_M search their signed grid with both
deltas. The sub-block scale is fitted by least squares on a first search, quantized to the type's 3/4-bit scale
against the fp16 block scale, and the grid searched again with the scale as stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..model import quants as Q
from .encode_k import f16_round, pack, safe_inverse, signed_scale_codes

NEIGHBOURS = 8  # grid entries scored per group of weights: the nearest to its rounded lattice point
SEARCH_GROUPS = 1 << 15  # groups searched at once (IQ1: 16 MB of candidate vectors)


# --- the 16-value table types -------------------------------------------------------------------------------------

def _nearest(t: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index into `table` (16 values) of the value nearest to each of t."""
    order = np.argsort(table, kind="stable")
    ranked = table[order].astype(np.float32)
    return order[np.searchsorted((ranked[1:] + ranked[:-1]) * np.float32(0.5), t)]


def _fit_table(x: np.ndarray, table: np.ndarray, end: float) -> np.ndarray:
    """x (m, k) -> scale per row with x ~ scale * table[code]: the largest magnitude maps to `end` (a table value),
    then one least-squares refit on the codes."""
    at = np.abs(x).argmax(axis=1)
    scale = np.take_along_axis(x, at[:, None], axis=1)[:, 0] / np.float32(end)
    v = table[_nearest(x * safe_inverse(scale)[:, None], table)]
    vv = (v * v).sum(axis=1)
    return np.where(vv > 0, (v * x).sum(axis=1) / np.where(vv > 0, vv, 1), scale)


@lru_cache(maxsize=None)
def _table(name: str) -> np.ndarray:
    from gguf import quants as gq

    return np.array(getattr(gq, name).kvalues, np.float32)


def _nibbles(codes: np.ndarray, width: int) -> np.ndarray:
    """Codes (n, k) -> bytes: per `width` codes, the first half in the low nibbles, the second in the high ones."""
    return pack(codes, (codes.shape[1] // width, 2, width // 2), (0, 4))


def encode_iq4_nl(x: np.ndarray) -> np.ndarray:
    table = _table("IQ4_NL")
    d_bytes, d = f16_round(_fit_table(x, table, table[0]))
    return np.concatenate([d_bytes, _nibbles(_nearest(x * safe_inverse(d)[:, None], table), 32)], axis=1)


def encode_iq4_xs(x: np.ndarray) -> np.ndarray:
    n, table = x.shape[0], _table("IQ4_NL")
    sub = x.reshape(n, 8, 32)
    scale = _fit_table(sub.reshape(n * 8, 32), table, table[0]).reshape(n, 8)
    d_bytes, d, ls = signed_scale_codes(scale, -32, 31)
    codes = _nearest(sub * safe_inverse(d[:, None] * ls.astype(np.float32))[..., None], table).reshape(n, -1)
    stored = ls + 32
    high = ((stored >> 4).astype(np.uint16) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    return np.concatenate([d_bytes, high.view(np.uint8).reshape(n, 2), pack(stored & 0xF, (4, 2, 1), (0, 4)),
                           _nibbles(codes, 32)], axis=1)


def encode_nvfp4(x: np.ndarray) -> np.ndarray:
    from gguf.quants import NVFP4

    n, table = x.shape[0], _table("NVFP4")
    sub = x.reshape(n, 4, 16)
    # w = ue4m3_to_fp32(u) * k with k up to 12 and the decoder's factor 1/2: the largest magnitude -> 12
    u = NVFP4.fp32_to_ue4m3(np.abs(sub).max(axis=2) / np.float32(6.0)).astype(np.uint8)
    step = NVFP4.ue4m3_to_fp32(u).astype(np.float32)
    codes = _nearest(sub * safe_inverse(step)[..., None], table).reshape(n, -1)
    return np.concatenate([u, _nibbles(codes, 16)], axis=1)


# --- the grid types -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GridSpec:
    """How one grid type stores a sub-block: w = d * a * (s + b) * grid value (+ delta for IQ1), s in 0..s_max."""

    name: str
    group: int      # weights per grid entry
    sub: int        # weights per sub-block scale
    a: float
    b: float
    s_max: int
    signs: str      # "parity": 7 sign bits per 8 (an even count of minus signs); "bits": 8 per 8; "": signed grid


GRIDS = {
    Q.IQ2_XXS: GridSpec("IQ2_XXS", 8, 32, 0.25, 0.5, 15, "parity"),
    Q.IQ2_XS: GridSpec("IQ2_XS", 8, 16, 0.25, 0.5, 15, "parity"),
    Q.IQ2_S: GridSpec("IQ2_S", 8, 16, 0.25, 0.5, 15, "bits"),
    Q.IQ3_XXS: GridSpec("IQ3_XXS", 4, 32, 0.5, 0.5, 15, "parity"),
    Q.IQ3_S: GridSpec("IQ3_S", 4, 32, 2.0, 0.5, 15, "bits"),
    Q.IQ1_S: GridSpec("IQ1_S", 8, 32, 2.0, 0.5, 7, ""),
    Q.IQ1_M: GridSpec("IQ1_M", 8, 16, 2.0, 0.5, 7, ""),
}


@lru_cache(maxsize=None)
def _grid(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(grid entries [entries, group] float32, half their squared norms): IQ1's doubled, +delta then -delta."""
    from gguf import quants as gq

    cls = getattr(gq, name)
    cls.init_grid()
    grid = cls.grid.reshape(cls.grid_shape).astype(np.float32)
    if name.startswith("IQ1"):
        grid = np.concatenate([grid + cls.delta, grid - cls.delta])
    return grid, np.float32(0.5) * (grid * grid).sum(axis=1)


@lru_cache(maxsize=None)
def _lattice(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The grid's value levels' midpoints, and for every point of the lattice those levels span (levels^group
    points) the NEIGHBOURS nearest grid entries per half (IQ1: per delta), [points, halves, NEIGHBOURS], with their
    vectors and half squared norms laid out per point (one contiguous row to fetch per target): a search scores only
    the neighbours of its target's rounded point (llama.cpp's kneighbors idea)."""
    from gguf import quants as gq

    grid, half_norm = _grid(name)
    levels = np.array(sorted(getattr(gq, name).grid_map), np.float32)
    group = grid.shape[1]
    digits = np.indices((len(levels),) * group).reshape(group, -1)[::-1].T  # point p: digit i = (p // L^i) % L
    points = levels[digits]
    halves = 2 if name.startswith("IQ1") else 1
    score = (points @ grid.T - half_norm).reshape(len(points), halves, -1)
    near = np.argpartition(-score, NEIGHBOURS, axis=2)[..., :NEIGHBOURS]
    near += (np.arange(halves) * (grid.shape[0] // halves))[None, :, None]
    mids = (levels[1:] + levels[:-1]) * np.float32(0.5)
    return mids, near.astype(np.int32), grid[near], half_norm[near]


def _search(t: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Targets (m, group) -> per target and grid half (IQ1: the two deltas), the best entry (an index into the whole
    grid) and its score (t.g - |g|^2 / 2: larger is nearer), [m, halves] each."""
    mids, near, vectors, half_norm = _lattice(name)
    powers = (len(mids) + 1) ** np.arange(t.shape[1], dtype=np.int32)
    entries = np.empty((t.shape[0], near.shape[1]), np.int32)
    best = np.empty((t.shape[0], near.shape[1]), np.float32)
    for start in range(0, t.shape[0], SEARCH_GROUPS):
        part = t[start:start + SEARCH_GROUPS]
        point = (np.searchsorted(mids, part).astype(np.int32) * powers).sum(axis=1)
        score = np.einsum("mhkg,mg->mhk", vectors[point], part) - half_norm[point]  # [m, halves, NEIGHBOURS]
        at = score.argmax(axis=2)[..., None]
        entries[start:start + SEARCH_GROUPS] = np.take_along_axis(near[point], at, axis=2)[..., 0]
        best[start:start + SEARCH_GROUPS] = np.take_along_axis(score, at, axis=2)[..., 0]
    return entries, best


def _targets(x: np.ndarray, spec: GridSpec) -> tuple[np.ndarray, np.ndarray]:
    """x (n, 256) -> (what the grid values should approach, minus-sign bits per weight)."""
    if not spec.signs:
        return x, np.zeros(x.shape, bool)
    magnitude, negative = np.abs(x), x < 0
    if spec.signs == "parity":
        eights = negative.reshape(-1, 8)
        odd = eights.sum(axis=1) % 2 == 1
        flip = np.zeros_like(eights)
        flip[np.arange(flip.shape[0]), magnitude.reshape(-1, 8).argmin(axis=1)] = True
        flip &= odd[:, None]
        negative = (eights ^ flip).reshape(x.shape)
        magnitude = np.where(flip.reshape(x.shape), -magnitude, magnitude)  # the flipped weight wants -|x|
    return magnitude, negative


def _codes(t: np.ndarray, scale: np.ndarray, spec: GridSpec, delta_per_sub: bool):
    """Targets (n, 256), per sub-block scales (n, subs) -> (grid ids [n, groups], delta-negative bits, grid values)."""
    grid, _ = _grid(spec.name)
    n, groups = t.shape[0], t.shape[1] // spec.group
    scaled = (t.reshape(n, -1, spec.sub) * safe_inverse(scale)[..., None]).reshape(-1, spec.group)
    entries, best = _search(scaled, spec.name)
    if entries.shape[1] == 1:
        neg_delta = np.zeros((n, groups), np.int32)
        entries = entries[:, 0].reshape(n, groups)
    else:
        per = spec.sub // spec.group if delta_per_sub else 1
        pick = best.reshape(n, -1, per, 2).sum(axis=2).argmax(axis=2)  # the delta of the sub-block (IQ1_S) or group
        neg_delta = np.repeat(pick, per, axis=1).astype(np.int32)
        entries = np.take_along_axis(entries.reshape(n, groups, 2), neg_delta[..., None], axis=2)[..., 0]
    values = grid[entries].reshape(n, -1)
    return entries - neg_delta * (grid.shape[0] // 2), neg_delta, values


def _grid_encode(x: np.ndarray, spec: GridSpec, delta_per_sub: bool = False):
    """x (n, 256) -> (fp16 d bytes, d, scale codes [n, subs], grid ids [n, groups], delta bits, sign bits [n, 256])."""
    n = x.shape[0]
    t, negative = _targets(x, spec)
    grid, _ = _grid(spec.name)
    first = np.abs(t).reshape(n, -1, spec.sub).max(axis=2) / np.abs(grid).max()
    _, _, values = _codes(t, first, spec, delta_per_sub)
    tv = (t * values).reshape(n, -1, spec.sub).sum(axis=2)
    vv = (values * values).reshape(n, -1, spec.sub).sum(axis=2)
    fitted = np.where((vv > 0) & (tv > 0), tv / np.where(vv > 0, vv, 1), first)
    d_bytes, d = f16_round(fitted.max(axis=1) / np.float32(spec.a * (spec.s_max + spec.b)))
    s = np.clip(np.rint(fitted * safe_inverse(d * np.float32(spec.a))[:, None] - spec.b), 0, spec.s_max)
    s = s.astype(np.int32)
    ids, neg_delta, _ = _codes(t, d[:, None] * np.float32(spec.a) * (s.astype(np.float32) + np.float32(spec.b)), spec,
                                 delta_per_sub)
    return d_bytes, d, s, ids, neg_delta, negative


def _sign_bytes(negative: np.ndarray) -> np.ndarray:
    """Minus-sign bits (n, 256) -> one byte per 8 weights (bit i: weight i negative)."""
    return pack(negative.astype(np.uint8), (32, 8, 1), tuple(range(8)))


def _scale_nibbles(s: np.ndarray) -> np.ndarray:
    return pack(s, (s.shape[1] // 2, 2, 1), (0, 4))


def _words(*fields: tuple[np.ndarray, int]) -> np.ndarray:
    """u32 words OR-ed from (field, shift) pairs of equal shapes, as bytes (n, -1)."""
    word = sum(field.astype(np.uint32) << np.uint32(shift) for field, shift in fields)
    return np.ascontiguousarray(word, dtype=np.uint32).view(np.uint8).reshape(word.shape[0], -1)


def _sign_ids(negative: np.ndarray, n: int) -> np.ndarray:
    """The 7-bit ksigns index of every 8 weights: their first 7 sign bits (the 8th is the parity), [n, 32]."""
    return _sign_bytes(negative).reshape(n, 32) & 0x7F


def encode_iq2_xxs(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d_bytes, _, s, ids, _, negative = _grid_encode(x, GRIDS[Q.IQ2_XXS])
    signs = _sign_ids(negative, n).reshape(n, 8, 4)
    grid_word = _words(*((ids.reshape(n, 8, 4)[..., j], 8 * j) for j in range(4))).reshape(n, 8, 4)
    sign_word = _words(*((signs[..., j], 7 * j) for j in range(4)), (s, 28)).reshape(n, 8, 4)
    return np.concatenate([d_bytes, np.concatenate([grid_word, sign_word], axis=2).reshape(n, -1)], axis=1)


def encode_iq2_xs(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d_bytes, _, s, ids, _, negative = _grid_encode(x, GRIDS[Q.IQ2_XS])
    qs = (ids.astype(np.uint16) | (_sign_ids(negative, n).astype(np.uint16) << 9)).view(np.uint8).reshape(n, -1)
    return np.concatenate([d_bytes, qs, _scale_nibbles(s)], axis=1)


def encode_iq2_s(x: np.ndarray) -> np.ndarray:
    d_bytes, _, s, ids, _, negative = _grid_encode(x, GRIDS[Q.IQ2_S])
    high = pack(ids >> 8, (8, 4, 1), (0, 2, 4, 6))
    return np.concatenate([d_bytes, (ids & 0xFF).astype(np.uint8), _sign_bytes(negative), high, _scale_nibbles(s)],
                          axis=1)


def encode_iq3_xxs(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d_bytes, _, s, ids, _, negative = _grid_encode(x, GRIDS[Q.IQ3_XXS])
    signs = _sign_ids(negative, n).reshape(n, 8, 4)
    sign_word = _words(*((signs[..., j], 7 * j) for j in range(4)), (s, 28))
    return np.concatenate([d_bytes, ids.astype(np.uint8), sign_word], axis=1)


def encode_iq3_s(x: np.ndarray) -> np.ndarray:
    d_bytes, _, s, ids, _, negative = _grid_encode(x, GRIDS[Q.IQ3_S])
    high = pack(ids >> 8, (8, 8, 1), tuple(range(8)))
    return np.concatenate([d_bytes, (ids & 0xFF).astype(np.uint8), high, _sign_bytes(negative), _scale_nibbles(s)],
                          axis=1)


def encode_iq1_s(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d_bytes, _, s, ids, neg_delta, _ = _grid_encode(x, GRIDS[Q.IQ1_S], delta_per_sub=True)
    high = (ids >> 8).reshape(n, 8, 4)
    qh = sum((high[..., j].astype(np.uint16) << np.uint16(3 * j)) for j in range(4))
    qh = qh | (s.astype(np.uint16) << np.uint16(12)) | (neg_delta[:, ::4].astype(np.uint16) << np.uint16(15))
    return np.concatenate([d_bytes, (ids & 0xFF).astype(np.uint8), qh.astype(np.uint16).view(np.uint8)], axis=1)


def encode_iq1_m(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d_bytes, _, s, ids, neg_delta, _ = _grid_encode(x, GRIDS[Q.IQ1_M])
    nibble = ((ids >> 8) | (neg_delta << 3)).reshape(n, 16, 2)
    qh = (nibble[..., 0] | (nibble[..., 1] << 4)).astype(np.uint8)
    d_bits = d_bytes.copy().view(np.uint16).reshape(n)
    four = s.reshape(n, 4, 4).astype(np.uint16)
    words = sum(four[..., j] << np.uint16(3 * j) for j in range(4))
    words = words | (((d_bits[:, None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF) << np.uint16(12))
    return np.concatenate([(ids & 0xFF).astype(np.uint8), qh, words.astype(np.uint16).view(np.uint8)], axis=1)


ENCODERS = {Q.IQ4_NL: encode_iq4_nl, Q.IQ4_XS: encode_iq4_xs, Q.NVFP4: encode_nvfp4, Q.IQ2_XXS: encode_iq2_xxs,
            Q.IQ2_XS: encode_iq2_xs, Q.IQ2_S: encode_iq2_s, Q.IQ3_XXS: encode_iq3_xxs, Q.IQ3_S: encode_iq3_s,
            Q.IQ1_S: encode_iq1_s, Q.IQ1_M: encode_iq1_m}
