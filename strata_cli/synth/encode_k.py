"""strata's own encoders of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), which gguf.quants can decode but not encode.

The structure of llama.cpp's quantize_row_q*_K_ref, vectorized over blocks (no per-block Python): per sub-block a
scale (and, for Q2_K / Q4_K / Q5_K, a min) fitted to the sub-block's range and refined once by least squares on the
codes it gives; the sub-block scales quantized against one fp16 super-block scale (4-bit for Q2_K, 6-bit packed for
Q3_K / Q4_K / Q5_K, int8 for Q6_K); the codes taken again with the scales as stored. Not bit-identical to
llama-quantize (whose searches try ~20 scales per sub-block and weight the error): a plain least-squares fit, about
as good on Gaussian weights at a fraction of the cost. Layouts: strata_cli/model/quants.py.
"""

from __future__ import annotations

import numpy as np

from ..model import quants as Q


def f16_round(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 -> (fp16 bytes [..., 2], the fp16 value back as float32); beyond fp16's range saturates to its max."""
    half = np.clip(values, -65504.0, 65504.0).astype(np.float16)
    return half.view(np.uint8).reshape(*values.shape, 2), half.astype(np.float32)


def safe_inverse(values: np.ndarray) -> np.ndarray:
    """1 / values, 0 where values is 0."""
    out = np.zeros_like(values)
    np.divide(np.float32(1.0), values, out=out, where=values != 0)
    return out


def pack(codes: np.ndarray, shape: tuple[int, ...], shifts: tuple[int, ...]) -> np.ndarray:
    """Small codes (n, elements) -> bytes (n, -1): viewed as (n, *shape), axis -2 of length len(shifts) is OR-ed
    into one byte at those bit shifts (the gguf layouts' planes)."""
    planes = codes.astype(np.uint8).reshape(codes.shape[0], *shape)
    out = np.zeros((codes.shape[0], *shape[:-2], shape[-1]), np.uint8)
    for i, shift in enumerate(shifts):
        out |= planes[..., i, :] << np.uint8(shift)
    return out.reshape(codes.shape[0], -1)


def round_clip(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """rint(values) clipped to [low, high], in place (np.clip is several times slower on these sizes)."""
    np.rint(values, out=values)
    np.maximum(values, np.float32(low), out=values)
    return np.minimum(values, np.float32(high), out=values)


def row_sums(values: np.ndarray) -> np.ndarray:
    """Sums over the last, short axis (16 or 32) as one matrix-vector product: numpy's reduction is slow there."""
    return values @ np.ones(values.shape[-1], np.float32)


def _fit_with_min(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """x (m, k) -> (scale, min) per row with x ~ scale * q - min, q in 0..nmax, min >= 0 (min(x) clamped at 0 as the
    reference does): range fit, then one least-squares refit on its codes."""
    low = np.minimum(x.min(axis=1), 0.0)
    scale = (x.max(axis=1) - low) / np.float32(nmax)
    q = round_clip((x - low[:, None]) * safe_inverse(scale)[:, None], 0, nmax)
    k = np.float32(x.shape[1])
    sq, sqq, sx, sqx = row_sums(q), row_sums(q * q), row_sums(x), row_sums(q * x)
    det = k * sqq - sq * sq
    with np.errstate(divide="ignore", invalid="ignore"):
        fit_scale = (k * sqx - sq * sx) / det
        fit_low = (sqq * sx - sq * sqx) / det
    ok = (det > 0) & (fit_scale > 0) & (fit_low <= 0)
    return np.where(ok, fit_scale, scale), -np.where(ok, fit_low, low)


def fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """x (m, k) -> signed scale per row with x ~ scale * q, q in -nmax..nmax-1 (the largest magnitude maps to -nmax,
    as make_qx_quants), then one least-squares refit on its codes."""
    at = np.abs(x).argmax(axis=1)
    scale = np.take_along_axis(x, at[:, None], axis=1)[:, 0] / np.float32(-nmax)
    q = round_clip(x * safe_inverse(scale)[:, None], -nmax, nmax - 1)
    sqq = row_sums(q * q)
    fit = row_sums(q * x) / np.where(sqq > 0, sqq, 1)
    return np.where(sqq > 0, fit, scale)


def _codes(x: np.ndarray, step: np.ndarray, low: np.ndarray | float, qmin: int, qmax: int) -> np.ndarray:
    """x (n, s, k) -> integer codes of x ~ step * q - low with the stored steps (n, s)."""
    inverse = safe_inverse(np.asarray(step, np.float32))[..., None]  # float32: an int32 code times d is float64
    return round_clip((x + np.asarray(low, np.float32)) * inverse, qmin, qmax).astype(np.int32)


def _with_min(x: np.ndarray, n_sub: int, nmax: int, scale_bits: int):
    """Q2_K / Q4_K / Q5_K: (d bytes, dmin bytes, sub-block scale codes, min codes, element codes)."""
    n = x.shape[0]
    sub = x.reshape(n, n_sub, -1)
    scale, low = (v.reshape(n, n_sub) for v in _fit_with_min(sub.reshape(n * n_sub, -1), nmax))
    top = np.float32((1 << scale_bits) - 1)
    d_bytes, d = f16_round(scale.max(axis=1) / top)
    m_bytes, dmin = f16_round(low.max(axis=1) / top)
    ls = np.clip(np.rint(scale * safe_inverse(d)[:, None]), 0, top).astype(np.int32)
    lm = np.clip(np.rint(low * safe_inverse(dmin)[:, None]), 0, top)
    # a sub-block whose step is 0 (its scale, or the whole block's d, below fp16's range) decodes to -min: its mean
    constant = np.clip(np.rint(-sub.mean(axis=2) * safe_inverse(dmin)[:, None]), 0, top)
    lm = np.where(d[:, None] * ls == 0, constant, lm).astype(np.int32)
    q = _codes(sub, d[:, None] * ls, (dmin[:, None] * lm)[..., None], 0, nmax)
    return d_bytes, m_bytes, ls, lm, q.reshape(n, -1)


def _symmetric(x: np.ndarray, nmax: int, scale_min: int, scale_max: int):
    """Q3_K / Q6_K (16 sub-blocks of 16): (d bytes, signed sub-block scale codes, element codes)."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = fit_symmetric(sub.reshape(n * 16, 16), nmax).reshape(n, 16)
    d_bytes, d, ls = signed_scale_codes(scale, scale_min, scale_max)
    q = _codes(sub, d[:, None] * ls, 0.0, -nmax, nmax - 1)
    return d_bytes, ls, q.reshape(n, -1)


def signed_scale_codes(scale: np.ndarray, scale_min: int, scale_max: int):
    """Signed sub-block scales (n, s) -> (fp16 d bytes, d, codes in scale_min..scale_max) with scale ~ d * code: the
    largest magnitude maps to scale_min (negative), as the reference's iscale = scale_min / max."""
    at = np.abs(scale).argmax(axis=1)
    biggest = np.take_along_axis(scale, at[:, None], axis=1)[:, 0]
    d_bytes, d = f16_round(biggest / np.float32(scale_min))
    return d_bytes, d, np.clip(np.rint(scale * safe_inverse(d)[:, None]), scale_min, scale_max).astype(np.int32)


def _pack_scales_6bit(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 12 scale bytes from 8 scales and 8 mins (6-bit each; Q4_K.get_scale_min reversed)."""
    lo_sc = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_mn = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    mixed = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return np.concatenate([lo_sc, lo_mn, mixed], axis=1).astype(np.uint8)


def encode_q2_k(x: np.ndarray) -> np.ndarray:
    d, dmin, ls, lm, q = _with_min(x, 16, 3, 4)
    return np.concatenate([(ls | (lm << 4)).astype(np.uint8), pack(q, (2, 4, 32), (0, 2, 4, 6)), d, dmin], axis=1)


def encode_q3_k(x: np.ndarray) -> np.ndarray:
    d, ls, q = _symmetric(x, 4, -32, 31)
    stored, biased = q + 4, ls + 32
    scales = np.concatenate([pack(biased & 0xF, (2, 8), (0, 4)), pack(biased >> 4, (4, 4), (0, 2, 4, 6))], axis=1)
    return np.concatenate([pack(stored >> 2, (8, 32), tuple(range(8))), pack(stored & 3, (2, 4, 32), (0, 2, 4, 6)),
                           scales, d], axis=1)


def encode_q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, ls, lm, q = _with_min(x, 8, 15, 6)
    return np.concatenate([d, dmin, _pack_scales_6bit(ls, lm), pack(q, (4, 2, 32), (0, 4))], axis=1)


def encode_q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, ls, lm, q = _with_min(x, 8, 31, 6)
    return np.concatenate([d, dmin, _pack_scales_6bit(ls, lm), pack(q >> 4, (8, 32), tuple(range(8))),
                           pack(q & 0xF, (4, 2, 32), (0, 4))], axis=1)


def encode_q6_k(x: np.ndarray) -> np.ndarray:
    d, ls, q = _symmetric(x, 32, -128, 127)
    stored = q + 32
    return np.concatenate([pack(stored & 0xF, (2, 2, 64), (0, 4)), pack(stored >> 4, (2, 4, 32), (0, 2, 4, 6)),
                           ls.astype(np.int8).view(np.uint8), d], axis=1)


ENCODERS = {Q.Q2_K: encode_q2_k, Q.Q3_K: encode_q3_k, Q.Q4_K: encode_q4_k, Q.Q5_K: encode_q5_k, Q.Q6_K: encode_q6_k}
