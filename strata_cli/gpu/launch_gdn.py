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
    """T, Ch and the taps K of a GDN conv's checked operands (qkv [T, Ch] rows already checked)."""
    T, Ch = qkv.shape
    U.check_array("conv_w", conv_w, np.float32, (Ch, None))
    K = conv_w.shape[1]
    if K < 2:
        raise ValueError(f"conv_w: {K} taps, expected >= 2 (the state holds K-1 rows)")
    U.check_array("conv_state", conv_state, np.float32, (K - 1, Ch))
    return T, Ch, K


def gdn_conv_commit(conv_state, qkv, n_keep, n_keep_dev=None, stream=None):
    """conv_state [K-1, Ch] <- rows [n_keep, n_keep+K-1) of [conv_state | qkv [T, Ch]], in place."""
    with U.on_stream(stream):
        grid, block, args = S.rolling_commit("conv_state", conv_state, "qkv", qkv, n_keep, n_keep_dev, GDN_BLOCK)
        nvrtc.kernel("gdn", "gdn_conv_commit")(grid, block, args)
    return conv_state


AB_TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)  # alpha/beta types gdn_mix decodes (raw_at)
GDN_GATE_ROWS = 4  # kernels/gdn.cu: gdn_mix's static shared memory holds [16 warps][2 * GDN_GATE_ROWS] gate sums
GDN_MIX_SMEM = 48 * 1024 - 4 * (GDN_REC_THREADS // 32) * 2 * GDN_GATE_ROWS  # dynamic + static in the default 48 KiB


def gdn_mix(qkv, conv_state, conv_w, state, x, dt_bias, ssm_a, z, norm_w, eps: float, nk: int, dk: int, nv: int,
            dv: int, ab_raw=None, ab_proj=None, q=None, k=None, v=None, g=None, beta=None, out=None, r0: int = 0,
            stream=None):
    """The GDN mixer between its projections in one launch (kernels/gdn.cu gdn_mix; reference ops/gdn.gdn_mix_raw):
    the conv + q/k/v split, the gates, the delta rule from the saved state and the gated norm. Returns y [n, Hv, dv] of rows [r0, T) (n = T - r0).

    qkv [T, Ch] (rows of a wider buffer allowed) and conv_state [K-1, Ch], conv_w [Ch, K]; state [Hv, dk, dv] (not
    written); x [n, n_in] the group's mixed rows; z [n, Hv, dv], or [n, Hv*dv] rows of a wider buffer (qkv and z as
    one GEMV's output rows [qkv | z]); norm_w [dv]. The gates come from ab_raw = (alpha_raw, alpha_type, beta_raw,
    beta_type) (raw [Hv, n_in] rows of AB_TYPES, projected in the kernel) or ab_proj = (alpha, beta_in) [n, Hv]
    (the projections, for other types). Written for the commit: q, k [T, Hk, dk], v [T, Hv, dv], and rows [r0, T)
    of g, beta [T, Hv]; r0 > 0 (the second token group of a split window) reads rows [0, r0) of g and beta."""
    with U.on_stream(stream):
        (qkv_ld,) = S.check_rows_view("qkv", qkv, 2, (None, 2 * nk * dk + nv * dv))
        T, Ch, K = _conv_operands(qkv, conv_w, conv_state)
        if not 0 <= r0 < T:
            raise ValueError(f"r0: {r0} outside 0..{T - 1} (the window's rows)")
        n = T - r0
        if nv < nk:
            raise ValueError(f"nv: {nv} value heads < {nk} key heads (value head h writes key head h for the commit)")
        U.check_array("state", state, np.float32, (nv, dk, dv))
        U.check_array("x", x, np.float32, (n, None))
        n_in = x.shape[1]
        if getattr(z, "ndim", 0) == 3:
            z_ld = np.int64(nv * dv)
            U.check_array("z", z, np.float32, (n, nv, dv))
        else:  # rows of [qkv | z] (the window's one GEMV of both)
            (z_ld,) = S.check_rows_view("z", z, 2, (n, nv * dv))
        U.check_array("norm_w", norm_w, np.float32, (dv,))
        U.check_array("dt_bias", dt_bias, np.float32, (nv,))
        U.check_array("ssm_a", ssm_a, np.float32, (nv,))
        if (ab_raw is None) == (ab_proj is None):
            raise ValueError("ab_raw, ab_proj: give exactly one (raw alpha/beta weights or their projections)")
        if ab_raw is not None:
            alpha_raw, alpha_type, beta_raw, beta_type = ab_raw
            for name, t in (("alpha_raw", alpha_type), ("beta_raw", beta_type)):
                if t not in AB_TYPES:
                    raise ValueError(f"{name}: type {U.type_name(t)} is not one of F32, F16, BF16, Q8_0 "
                                     "(gdn_mix decodes only these; pass their projections as ab_proj)")
            U.weight_rows("alpha_raw", alpha_raw, alpha_type, n_in, n_out=nv)
            U.weight_rows("beta_raw", beta_raw, beta_type, n_in, n_out=nv)
            ab = (alpha_raw, np.int64(U.row_stride(alpha_type, n_in)), np.int32(alpha_type), beta_raw,
                  np.int64(U.row_stride(beta_type, n_in)), np.int32(beta_type), U.null_or(None), U.null_or(None))
        else:
            alpha, beta_in = ab_proj
            U.check_array("alpha", alpha, np.float32, (n, nv))
            U.check_array("beta_in", beta_in, np.float32, (n, nv))
            ab = (U.null_or(None), np.int64(0), np.int32(0), U.null_or(None), np.int64(0), np.int32(0), alpha,
                  beta_in)
        P = -(-dk // GDN_RPT)
        if dv * P > GDN_REC_THREADS:
            raise ValueError(f"state: dk {dk} x dv {dv} needs {dv * P} threads per head, gdn_mix takes at most "
                             f"{GDN_REC_THREADS} (dv * ceil(dk / {GDN_RPT}))")
        threads = -(-dv * P // 32) * 32  # whole warps (the norms and the gates go one warp per row)
        smem = (T * (2 * dk + 2 * dv) + 2 * T + P * dv) * 4
        if smem > GDN_MIX_SMEM:
            raise ValueError(f"qkv: {T} rows need {smem} bytes of shared memory in gdn_mix (at most {GDN_MIX_SMEM})")
        q = U.out_array("q", q, (T, nk, dk), np.float32, empty)
        k = U.out_array("k", k, (T, nk, dk), np.float32, empty)
        v = U.out_array("v", v, (T, nv, dv), np.float32, empty)
        g = U.out_array("g", g, (T, nv), np.float32, empty)
        beta = U.out_array("beta", beta, (T, nv), np.float32, empty)
        out = U.out_array("out", out, (n, nv, dv), np.float32, empty)
        nvrtc.kernel("gdn", "gdn_mix")((nv, 1, 1), (threads, 1, 1), (
            qkv, conv_state, conv_w, np.int32(Ch), np.int32(qkv_ld), np.int32(K), state, x, np.int32(n_in), *ab,
            dt_bias, ssm_a, z, np.int32(z_ld), norm_w, np.float32(eps), q, k, v, g, beta, out, np.int32(T),
            np.int32(r0), np.int32(nk), np.int32(nv), np.int32(dk), np.int32(dv), np.float32(dk ** -0.5), np.float32(1e-6)), shared_mem=smem)
    return out


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
