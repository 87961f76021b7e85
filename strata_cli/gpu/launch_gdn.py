"""CuPy launchers of kernels/gdn.cu, mirroring strata_cli/ops/gdn.py signature for signature.

Arrays are CuPy, float32, C-contiguous. Every launcher takes `out=`-style buffers (checked, never reallocated:
with all of them given nothing is allocated, so the launches can be captured in a CUDA graph) and `stream=`
(None: the current stream). A window never writes the saved conv or recurrent state; gdn_conv_commit and
gdn_commit_state advance them in place to the first n_keep rows of the window, from what the window kept
(qkv, and q, k, v, g, beta).

Legend: T window rows, Ch conv channels, K conv taps, Hk key heads, Hv value heads, dk / dv head dims.
"""

from __future__ import annotations

import numpy as np

from ..model import quants
from . import compile as nvrtc
from . import launch_util as U
from . import seq_util as S
from .runtime import empty

GDN_BLOCK = 256  # kernels/gdn.cu
GDN_RPT = 32
GDN_REC_THREADS = 512


def _conv_operands(qkv, conv_w, conv_state) -> tuple[int, int, int]:
    """T, Ch and the taps K of a GDN conv's checked operands (qkv [T, Ch] already checked)."""
    T, Ch = qkv.shape
    U.check_array("conv_w", conv_w, np.float32, (Ch, None))
    K = conv_w.shape[1]
    if K < 2:
        raise ValueError(f"conv_w: {K} taps, expected >= 2 (the state holds K-1 rows)")
    U.check_array("conv_state", conv_state, np.float32, (K - 1, Ch))
    return T, Ch, K


def gdn_conv(qkv, conv_state, conv_w, out=None, stream=None):
    """h [T, Ch] = silu(causal depthwise conv of [conv_state (K-1 rows) | qkv (T rows)] with conv_w [Ch, K]).

    ops.gdn.gdn_conv also returns the conv input sequence; here the commit rebuilds the state from
    (conv_state, qkv, n_keep) instead (gdn_conv_commit), so nothing else is written."""
    with U.on_stream(stream):
        U.check_array("qkv", qkv, np.float32, (None, None))
        T, Ch, K = _conv_operands(qkv, conv_w, conv_state)
        out = U.out_array("out", out, (T, Ch), np.float32, empty)
        grid, block = U.elementwise_grid(T * Ch, GDN_BLOCK)
        nvrtc.kernel("gdn", "gdn_conv")(grid, block, (
            qkv, conv_state, conv_w, out, np.int32(T), np.int32(Ch), np.int32(K)))
    return out


def gdn_conv_commit(conv_state, qkv, n_keep, n_keep_dev=None, stream=None):
    """conv_state [K-1, Ch] <- rows [n_keep, n_keep+K-1) of [conv_state | qkv [T, Ch]], in place."""
    with U.on_stream(stream):
        grid, block, args = S.rolling_commit("conv_state", conv_state, "qkv", qkv, n_keep, n_keep_dev, GDN_BLOCK)
        nvrtc.kernel("gdn", "gdn_conv_commit")(grid, block, args)
    return conv_state


def gdn_split(h, nk: int, dk: int, nv: int, dv: int, q=None, k=None, v=None, stream=None):
    """h [T, Ch] -> q [T, Hk, dk] (L2-normed / sqrt(dk)), k [T, Hk, dk] (L2-normed), v [T, Hv, dv]."""
    with U.on_stream(stream):
        U.check_array("h", h, np.float32, (None, 2 * nk * dk + nv * dv))
        T, Ch = h.shape
        q = U.out_array("q", q, (T, nk, dk), np.float32, empty)
        k = U.out_array("k", k, (T, nk, dk), np.float32, empty)
        v = U.out_array("v", v, (T, nv, dv), np.float32, empty)
        nvrtc.kernel("gdn", "gdn_split")((T, 2 * nk + nv, 1), (GDN_BLOCK, 1, 1), (
            h, q, k, v, np.int32(Ch), np.int32(nk), np.int32(dk), np.int32(nv), np.int32(dv),
            np.float32(dk ** -0.5), np.float32(1e-6)))
    return q, k, v


def gdn_conv_split(qkv, conv_state, conv_w, nk: int, dk: int, nv: int, dv: int, q=None, k=None, v=None,
                   stream=None):
    """gdn_split(gdn_conv(qkv, conv_state, conv_w)) in one launch, without the h [T, Ch] intermediate: q, k, v
    equal the two launches' bit for bit."""
    with U.on_stream(stream):
        U.check_array("qkv", qkv, np.float32, (None, 2 * nk * dk + nv * dv))
        T, Ch, K = _conv_operands(qkv, conv_w, conv_state)
        q = U.out_array("q", q, (T, nk, dk), np.float32, empty)
        k = U.out_array("k", k, (T, nk, dk), np.float32, empty)
        v = U.out_array("v", v, (T, nv, dv), np.float32, empty)
        nvrtc.kernel("gdn", "gdn_conv_split")((T, 2 * nk + nv, 1), (GDN_BLOCK, 1, 1), (
            qkv, conv_state, conv_w, q, k, v, np.int32(Ch), np.int32(K), np.int32(nk), np.int32(dk), np.int32(nv),
            np.int32(dv), np.float32(dk ** -0.5), np.float32(1e-6)))
    return q, k, v


def gdn_gates(alpha, beta_in, dt_bias, ssm_a, g=None, beta=None, stream=None):
    """alpha, beta_in [T, Hv] -> (g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(beta_in)), [T, Hv] each."""
    with U.on_stream(stream):
        U.check_array("alpha", alpha, np.float32, (None, None))
        T, nv = alpha.shape
        U.check_array("beta_in", beta_in, np.float32, (T, nv))
        U.check_array("dt_bias", dt_bias, np.float32, (nv,))
        U.check_array("ssm_a", ssm_a, np.float32, (nv,))
        g = U.out_array("g", g, (T, nv), np.float32, empty)
        beta = U.out_array("beta", beta, (T, nv), np.float32, empty)
        grid, block = U.elementwise_grid(T * nv, GDN_BLOCK)
        nvrtc.kernel("gdn", "gdn_gates")(grid, block, (
            alpha, beta_in, dt_bias, ssm_a, g, beta, np.int32(T), np.int32(nv)))
    return g, beta


AB_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)  # what gdn_ab_gates decodes (common.cuh raw_at)


def gdn_ab_gates(x, alpha_raw, alpha_type: int, beta_raw, beta_type: int, dt_bias, ssm_a, g=None, beta=None,
                 stream=None):
    """x [T, n_in] -> (g, beta) [T, Hv] of gdn_gates over the projections x @ W_alpha^T and x @ W_beta^T, in one
    launch (the two GEMVs reassociated per block). alpha_raw, beta_raw: raw [Hv, n_in] rows of a type in AB_TYPES
    (others: launch_gemv + gdn_gates, as the unfused window does)."""
    with U.on_stream(stream):
        U.check_array("x", x, np.float32, (None, None))
        T, n_in = x.shape
        for name, t in (("alpha_raw", alpha_type), ("beta_raw", beta_type)):
            if t not in AB_TYPES:
                raise ValueError(f"{name}: type {U.type_name(t)} is not one of F32, F16, BF16, Q8_0 "
                                 "(gdn_ab_gates decodes only these)")
        nv = U.weight_rows("alpha_raw", alpha_raw, alpha_type, n_in)
        U.weight_rows("beta_raw", beta_raw, beta_type, n_in, n_out=nv)
        U.check_array("dt_bias", dt_bias, np.float32, (nv,))
        U.check_array("ssm_a", ssm_a, np.float32, (nv,))
        g = U.out_array("g", g, (T, nv), np.float32, empty)
        beta = U.out_array("beta", beta, (T, nv), np.float32, empty)
        nvrtc.kernel("gdn", "gdn_ab_gates")((2 * nv, 1, 1), (GDN_BLOCK, 1, 1), (
            x, np.int32(n_in), alpha_raw, np.int64(U.row_stride(alpha_type, n_in)), np.int32(alpha_type), beta_raw,
            np.int64(U.row_stride(beta_type, n_in)), np.int32(beta_type), dt_bias, ssm_a, g, beta, np.int32(T),
            np.int32(nv)))
    return g, beta


def _check_recurrence(state, q, k, v, g, beta):
    U.check_array("state", state, np.float32, (None, None, None))
    nv, dk, dv = state.shape
    U.check_array("q", q, np.float32, (None, None, dk))
    T, nk = q.shape[:2]
    U.check_array("k", k, np.float32, (T, nk, dk))
    U.check_array("v", v, np.float32, (T, nv, dv))
    U.check_array("g", g, np.float32, (T, nv))
    U.check_array("beta", beta, np.float32, (T, nv))
    P = -(-dk // GDN_RPT)
    if dv * P > GDN_REC_THREADS:
        raise ValueError(f"state: dk {dk} x dv {dv} needs {dv * P} threads per head, the kernel takes at most "
                         f"{GDN_REC_THREADS} (dv * ceil(dk / {GDN_RPT}))")
    return T, nk, nv, dk, dv, P


def _launch_recurrence(state, q, k, v, g, beta, o, state_out, n, n_dev, dims):
    T, nk, nv, dk, dv, P = dims
    nvrtc.kernel("gdn", "gdn_recurrence")((nv, 1, 1), (dv, P, 1), (
        state, q, k, v, g, beta, U.null_or(o), U.null_or(state_out), np.int32(T), n, n_dev, np.int32(nk),
        np.int32(nv), np.int32(dk), np.int32(dv)), shared_mem=(2 * dk + P * dv) * 4)


def gdn_recurrence(state, q, k, v, g, beta, out=None, state_out=None, n_state: int | None = None,
                   with_state: bool = True, stream=None):
    """Delta rule from the saved state [Hv, dk, dv], which is not modified; q, k [T, Hk, dk], v [T, Hv, dv],
    g, beta [T, Hv]. Returns (o [T, Hv, dv], S after n_state rows (default T) or None when with_state is False)."""
    with U.on_stream(stream):
        dims = _check_recurrence(state, q, k, v, g, beta)
        T, nk, nv, dk, dv, _ = dims
        out = U.out_array("out", out, (T, nv, dv), np.float32, empty)
        if with_state:
            state_out = U.out_array("state_out", state_out, (nv, dk, dv), np.float32, empty)
            n_state = T if n_state is None else int(n_state)
            if not 0 <= n_state <= T:
                raise ValueError(f"n_state: {n_state} outside 0..{T} (the window's rows)")
            n, n_dev = np.int32(n_state), U.null_or(None)
        else:
            state_out, n, n_dev = None, np.int32(0), U.null_or(None)
        _launch_recurrence(state, q, k, v, g, beta, out, state_out, n, n_dev, dims)
    return out, state_out


def gdn_commit_state(state, q, k, v, g, beta, n_keep, n_keep_dev=None, stream=None):
    """state <- the recurrence replayed over the first n_keep of the window's stored rows, in place."""
    with U.on_stream(stream):
        dims = _check_recurrence(state, q, k, v, g, beta)
        n, n_dev = S.commit_count(n_keep, n_keep_dev, dims[0])
        _launch_recurrence(state, q, k, v, g, beta, None, state, n, n_dev, dims)
    return state


def gdn_gated_norm(o, z, norm_w, eps: float, out=None, stream=None):
    """o, z [T, Hv, dv] -> rms_norm(o) * norm_w [dv] * sigmoid(z), per head."""
    with U.on_stream(stream):
        U.check_array("o", o, np.float32, (None, None, None))
        T, nv, dv = o.shape
        U.check_array("z", z, np.float32, (T, nv, dv))
        U.check_array("norm_w", norm_w, np.float32, (dv,))
        out = U.out_array("out", out, (T, nv, dv), np.float32, empty)
        nvrtc.kernel("gdn", "gdn_gated_norm")((T * nv, 1, 1), (GDN_BLOCK, 1, 1), (
            o, z, norm_w, out, np.int32(dv), np.float32(eps)))
    return out
