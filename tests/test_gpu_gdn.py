"""kernels/gdn.cu against strata_cli/ops/gdn.py on odd shapes, with state carried across windows and commits."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_seq as G
from strata_cli.ops import gdn as ref

pytestmark = pytest.mark.gpu

EPS = 1e-6
# (Hk, Hv, dk, dv): one register slice per thread (dk 24), two slices with a ragged one (dk 40), the real head
# size (dk = dv = 128: four slices, 512 threads).
SHAPES = [(3, 6, 24, 40), (2, 6, 40, 24), (1, 2, 128, 128)]


@pytest.fixture(scope="module")
def L():
    from strata_cli.gpu import launch_gdn

    return launch_gdn


def layer_params(rng, nk, nv, dk, dv, K):
    Ch = 2 * nk * dk + nv * dv
    return dict(conv_w=G.f32(rng, Ch, K, scale=0.3), dt_bias=1 + G.f32(rng, nv, scale=0.3),
                ssm_a=-np.exp(rng.uniform(np.log(0.5), np.log(8), nv)).astype(np.float32),
                norm_w=1 + G.f32(rng, dv, scale=0.1))


def recurrence_inputs(rng, T, nk, nv, dk, dv, p):
    """q, k, v, g, beta of T rows as the engine makes them (normed q/k, real gates)."""
    h = G.f32(rng, T, 2 * nk * dk + nv * dv)
    q, k, v = ref.gdn_split(h, nk, dk, nv, dv)
    g, beta = ref.gdn_gates(G.f32(rng, T, nv), G.f32(rng, T, nv), p["dt_bias"], p["ssm_a"])
    return q, k, v, g, beta


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("T", [1, 3, 7, 16])
def test_conv_and_conv_commit(L, T, K):
    cp = G.cupy()
    rng = np.random.default_rng(10 * T + K)
    Ch = 101
    qkv, state, w = G.f32(rng, T, Ch), G.f32(rng, K - 1, Ch), G.f32(rng, Ch, K, scale=0.5)
    want, seq = ref.gdn_conv(qkv, state, w)
    d_state, d_qkv = cp.asarray(state), cp.asarray(qkv)
    G.check(L.gdn_conv(d_qkv, d_state, cp.asarray(w), out=G.nan_out((T, Ch))), want, what="h")
    G.exact(d_state, state, "conv_state after the window")
    for n_keep in sorted({0, 1, T // 2, T}):
        s = cp.asarray(state)
        L.gdn_conv_commit(s, d_qkv, n_keep)
        G.exact(s, seq[n_keep:n_keep + K - 1], f"conv_state after commit({n_keep})")
    s = cp.asarray(state)
    L.gdn_conv_commit(s, d_qkv, None, n_keep_dev=cp.asarray([T - 1], dtype=np.int32))
    G.exact(s, seq[T - 1:T - 1 + K - 1], "conv_state after a device-count commit")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("T", [1, 7, 16])
def test_split_gates_gated_norm(L, shape, T):
    cp = G.cupy()
    nk, nv, dk, dv = shape
    rng = np.random.default_rng(T + dk)
    h = G.f32(rng, T, 2 * nk * dk + nv * dv)
    outs = L.gdn_split(cp.asarray(h), nk, dk, nv, dv, q=G.nan_out((T, nk, dk)), k=G.nan_out((T, nk, dk)),
                       v=G.nan_out((T, nv, dv)))
    for name, got, want in zip("qkv", outs, ref.gdn_split(h, nk, dk, nv, dv)):
        G.check(got, want, what=name)

    p = layer_params(rng, nk, nv, dk, dv, 4)
    alpha, beta_in = G.f32(rng, T, nv, scale=10.0), G.f32(rng, T, nv, scale=10.0)  # both softplus branches
    got = L.gdn_gates(cp.asarray(alpha), cp.asarray(beta_in), cp.asarray(p["dt_bias"]), cp.asarray(p["ssm_a"]),
                      g=G.nan_out((T, nv)), beta=G.nan_out((T, nv)))
    for name, g, w in zip(("g", "beta"), got, ref.gdn_gates(alpha, beta_in, p["dt_bias"], p["ssm_a"])):
        G.check(g, w, what=name)

    o, z = G.f32(rng, T, nv, dv), G.f32(rng, T, nv, dv, scale=3.0)
    got = L.gdn_gated_norm(cp.asarray(o), cp.asarray(z), cp.asarray(p["norm_w"]), EPS, out=G.nan_out((T, nv, dv)))
    G.check(got, ref.gdn_gated_norm(o, z, p["norm_w"], EPS), what="y")


@pytest.mark.parametrize("device_count", [False, True])
@pytest.mark.parametrize("T,n_keep", [(1, 1), (3, 0), (7, 4), (16, 11)])
@pytest.mark.parametrize("shape", SHAPES)
def test_recurrence_window_commit_window(L, shape, T, n_keep, device_count):
    cp = G.cupy()
    nk, nv, dk, dv = shape
    rng = np.random.default_rng(T * 100 + n_keep + dk)
    p = layer_params(rng, nk, nv, dk, dv, 4)
    state = G.f32(rng, nv, dk, dv, scale=0.1)
    d_state = cp.asarray(state)

    w1 = recurrence_inputs(rng, T, nk, nv, dk, dv, p)
    d_w1 = [cp.asarray(a) for a in w1]
    o1, s1 = ref.gdn_recurrence(state, *w1)
    got_o, got_s = L.gdn_recurrence(d_state, *d_w1, out=G.nan_out((T, nv, dv)), state_out=G.nan_out((nv, dk, dv)))
    G.check(got_o, o1, what="o, window 1")
    G.check(got_s, s1, what="state after the window's rows")
    G.exact(d_state, state, "saved state after the window")
    _, want = ref.gdn_recurrence(state, *(a[:n_keep] for a in w1))
    _, got_s = L.gdn_recurrence(d_state, *d_w1, state_out=G.nan_out((nv, dk, dv)), n_state=n_keep)
    G.check(got_s, want, what="state after n_state rows")

    if device_count:
        L.gdn_commit_state(d_state, *d_w1, None, n_keep_dev=cp.asarray([n_keep], dtype=np.int32))
    else:
        L.gdn_commit_state(d_state, *d_w1, n_keep)
    G.check(d_state, want, what="state after commit")

    T2 = max(1, T // 2)
    w2 = recurrence_inputs(rng, T2, nk, nv, dk, dv, p)
    o2, _ = ref.gdn_recurrence(want, *w2)
    got_o, none = L.gdn_recurrence(d_state, *(cp.asarray(a) for a in w2), out=G.nan_out((T2, nv, dv)),
                                   with_state=False)
    assert none is None
    G.check(got_o, o2, what="o, window 2")


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_layer_windows_with_commits(L, shape, K):
    """conv -> split -> gates -> recurrence -> gated norm over three windows, committing between them."""
    cp = G.cupy()
    nk, nv, dk, dv = shape
    Ch = 2 * nk * dk + nv * dv
    rng = np.random.default_rng(K + dv)
    p = layer_params(rng, nk, nv, dk, dv, K)
    conv_np, S_np = G.f32(rng, K - 1, Ch), G.f32(rng, nv, dk, dv, scale=0.1)
    conv_d, S_d = cp.asarray(conv_np), cp.asarray(S_np)
    w_d = {k: cp.asarray(v) for k, v in p.items()}
    for T, n_keep in [(7, 5), (16, 0), (3, 3), (1, 1)]:
        qkv, alpha, beta_in, z = G.f32(rng, T, Ch), G.f32(rng, T, nv), G.f32(rng, T, nv), G.f32(rng, T, nv, dv)
        h, seq = ref.gdn_conv(qkv, conv_np, p["conv_w"])
        q, k, v = ref.gdn_split(h, nk, dk, nv, dv)
        g, beta = ref.gdn_gates(alpha, beta_in, p["dt_bias"], p["ssm_a"])
        o, _ = ref.gdn_recurrence(S_np, q, k, v, g, beta)
        y = ref.gdn_gated_norm(o, z, p["norm_w"], EPS)

        qkv_d = cp.asarray(qkv)
        h_d = L.gdn_conv(qkv_d, conv_d, w_d["conv_w"], out=G.nan_out((T, Ch)))
        q_d, k_d, v_d = L.gdn_split(h_d, nk, dk, nv, dv)
        g_d, beta_d = L.gdn_gates(cp.asarray(alpha), cp.asarray(beta_in), w_d["dt_bias"], w_d["ssm_a"])
        o_d, _ = L.gdn_recurrence(S_d, q_d, k_d, v_d, g_d, beta_d, with_state=False)
        y_d = L.gdn_gated_norm(o_d, cp.asarray(z), w_d["norm_w"], EPS, out=G.nan_out((T, nv, dv)))
        G.check(y_d, y, what=f"y, window of {T}")

        conv_np = seq[n_keep:n_keep + K - 1]
        _, S_np = ref.gdn_recurrence(S_np, q[:n_keep], k[:n_keep], v[:n_keep], g[:n_keep], beta[:n_keep])
        n_dev = cp.asarray([n_keep], dtype=np.int32)
        L.gdn_conv_commit(conv_d, qkv_d, None, n_keep_dev=n_dev)
        L.gdn_commit_state(S_d, q_d, k_d, v_d, g_d, beta_d, None, n_keep_dev=n_dev)
        G.exact(conv_d, conv_np, f"conv state after commit({n_keep})")
        G.check(S_d, S_np, what=f"state after commit({n_keep})")
