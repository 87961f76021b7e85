"""kernels/gdn.cu against strata_cli/ops/gdn.py on odd shapes, with state carried across windows and commits: gdn_mix
(the window's one GDN launch between its projections), the recurrence and the commits."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_seq as G
from kernel_helpers import TYPE_IDS, TYPES, assert_replay_equals_eager, raw_weight

from strata_cli.model import quants
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
def test_conv_commit(L, T, K):
    cp = G.cupy()
    rng = np.random.default_rng(10 * T + K)
    Ch = 101
    qkv, state, w = G.f32(rng, T, Ch), G.f32(rng, K - 1, Ch), G.f32(rng, Ch, K, scale=0.5)
    _, seq = ref.gdn_conv(qkv, state, w)
    d_qkv = cp.asarray(qkv)
    for n_keep in sorted({0, 1, T // 2, T}):
        s = cp.asarray(state)
        L.gdn_conv_commit(s, d_qkv, n_keep)
        G.exact(s, seq[n_keep:n_keep + K - 1], f"conv_state after commit({n_keep})")
    s = cp.asarray(state)
    L.gdn_conv_commit(s, d_qkv, None, n_keep_dev=cp.asarray([T - 1], dtype=np.int32))
    G.exact(s, seq[T - 1:T - 1 + K - 1], "conv_state after a device-count commit")


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


def mix_operands(rng, T, nk, nv, dk, dv, K, n_in, p, ab_type, r0=0):
    """Inputs of gdn_mix for a T-row window whose group starts at row r0: (numpy args, device args, ab) with ab
    the raw alpha/beta weights of ab_type (None: their projections)."""
    cp = G.cupy()
    Ch = 2 * nk * dk + nv * dv
    n = T - r0
    qkv, conv, S = G.f32(rng, T, Ch), G.f32(rng, K - 1, Ch), G.f32(rng, nv, dk, dv, scale=0.1)
    x, z = G.f32(rng, n, n_in), G.f32(rng, n, nv, dv, scale=3.0)
    if ab_type is None:
        ab = dict(ab_proj=(G.f32(rng, n, nv, scale=3.0), G.f32(rng, n, nv, scale=3.0)))
        ab_d = dict(ab_proj=tuple(cp.asarray(a) for a in ab["ab_proj"]))
    else:
        w_a, w_b = raw_weight(rng, (nv, n_in), ab_type, 0.2), raw_weight(rng, (nv, n_in), ab_type, 0.2)
        ab = dict(ab_raw=(w_a, ab_type, w_b, ab_type))
        ab_d = dict(ab_raw=(cp.asarray(w_a), ab_type, cp.asarray(w_b), ab_type))
    args = [qkv, conv, p["conv_w"], S, x, p["dt_bias"], p["ssm_a"], z, p["norm_w"]]
    return args, [cp.asarray(a) for a in args], ab, ab_d


AB_TYPES = [None, *TYPES]  # None: the alpha/beta projections given (types gdn_mix does not decode)
AB_IDS = ["proj", *TYPE_IDS]


@pytest.mark.parametrize("ab_type", AB_TYPES, ids=AB_IDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("T,r0", [(1, 0), (3, 0), (16, 0), (5, 2), (16, 9)])
@pytest.mark.parametrize("n_in", [96, 2560])  # 2560: past 6 x elements a thread of 64 threads (the gates' tail)
def test_gdn_mix_matches_reference(L, shape, T, r0, ab_type, n_in):
    """conv + split, gates, recurrence and gated norm in one launch against the composition of the references;
    r0 > 0: the second token group of a split window (rows [0, r0) of g and beta come from the first)."""
    cp = G.cupy()
    nk, nv, dk, dv = shape
    rng = np.random.default_rng(T * 7 + r0 + dk + (ab_type or 0))
    K = 4
    p = layer_params(rng, nk, nv, dk, dv, K)
    args, args_d, ab, ab_d = mix_operands(rng, T, nk, nv, dk, dv, K, n_in, p, ab_type, r0)
    before = (G.f32(rng, r0, nv, scale=0.1) - 0.5, 1 / (1 + np.exp(-G.f32(rng, r0, nv)))) if r0 else None
    want = ref.gdn_mix_raw(*args, EPS, nk, dk, nv, dv, **ab, gates_before=before)
    outs = [G.nan_out(s) for s in [(T, nk, dk), (T, nk, dk), (T, nv, dv), (T, nv), (T, nv), (T - r0, nv, dv)]]
    if r0:
        outs[3][:r0], outs[4][:r0] = cp.asarray(before[0]), cp.asarray(before[1].astype(np.float32))
    y = L.gdn_mix(*args_d, EPS, nk, dk, nv, dv, **ab_d, q=outs[0], k=outs[1], v=outs[2], g=outs[3], beta=outs[4],
                  out=outs[5], r0=r0)
    assert y is outs[5]
    for name, got, w in zip(("q", "k", "v", "g", "beta"), outs, want[1:]):
        G.check(got, w, what=name)
    G.check(y, want[0], rtol=2e-4, what="y")
    G.exact(args_d[3], args[3], "saved state after the window")


def test_gdn_mix_replays_eager():
    """gdn_mix captured in a graph writes the eager bits (the real head size, projected gates)."""
    nk, nv, dk, dv = SHAPES[2]
    rng = np.random.default_rng(5)
    p = layer_params(rng, nk, nv, dk, dv, 4)
    _, args_d, _, ab_d = mix_operands(rng, 8, nk, nv, dk, dv, 4, 64, p, quants.BF16)
    outs = [G.nan_out(s) for s in [(8, nk, dk), (8, nk, dk), (8, nv, dv), (8, nv), (8, nv), (8, nv, dv)]]

    def record(stream):
        from strata_cli.gpu import launch_gdn

        launch_gdn.gdn_mix(*args_d, EPS, nk, dk, nv, dv, **ab_d, q=outs[0], k=outs[1], v=outs[2], g=outs[3],
                           beta=outs[4], out=outs[5], stream=stream)

    assert_replay_equals_eager(record, outs)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("T,r0", [(1, 0), (7, 0), (16, 9)])
def test_gdn_mix_and_conv_commit_read_rows_of_qkv_then_z(L, shape, T, r0):
    """The window's one GEMV of qkv and z: gdn_mix and gdn_conv_commit read qkv and z as views of rows [qkv | z]
    (row stride Ch + Hv*dv, here with a pad column more) and give the bits of contiguous operands; the commit of
    strided rows equals the reference's."""
    cp = G.cupy()
    nk, nv, dk, dv = shape
    rng = np.random.default_rng(T * 3 + r0 + dv)
    K, n_in = 4, 64
    p = layer_params(rng, nk, nv, dk, dv, K)
    args, args_d, _, ab_d = mix_operands(rng, T, nk, nv, dk, dv, K, n_in, p, quants.Q8_0, r0)
    Ch, Zd = 2 * nk * dk + nv * dv, nv * dv
    rows = cp.full((T, Ch + Zd + 1), np.nan, dtype=cp.float32)  # [qkv | z | pad]
    rows[:, :Ch] = args_d[0]
    rows[r0:, Ch:Ch + Zd] = args_d[7].reshape(T - r0, Zd)
    before = (G.f32(rng, r0, nv, scale=0.1) - 0.5, 1 / (1 + np.exp(-G.f32(rng, r0, nv)))) if r0 else None
    runs = []
    for qkv, z in ((args_d[0], args_d[7]), (rows[:, :Ch], rows[r0:, Ch:Ch + Zd])):
        outs = [G.nan_out(s) for s in [(T, nk, dk), (T, nk, dk), (T, nv, dv), (T, nv), (T, nv), (T - r0, nv, dv)]]
        if r0:
            outs[3][:r0], outs[4][:r0] = cp.asarray(before[0]), cp.asarray(before[1].astype(np.float32))
        operands = list(args_d)
        operands[0], operands[7] = qkv, z
        L.gdn_mix(*operands, EPS, nk, dk, nv, dv, **ab_d, q=outs[0], k=outs[1], v=outs[2], g=outs[3],
                  beta=outs[4], out=outs[5], r0=r0)
        runs.append([o.get() for o in outs])
    for name, a, b in zip(("q", "k", "v", "g", "beta", "y"), *runs):
        np.testing.assert_array_equal(b, a, err_msg=name)
    assert not np.isnan(runs[1][5]).any()
    _, seq = ref.gdn_conv(args[0], args[1], p["conv_w"])
    for n_keep in sorted({0, 1, T}):
        state = cp.asarray(args[1])
        L.gdn_conv_commit(state, rows[:, :Ch], n_keep)
        G.exact(state, seq[n_keep:n_keep + K - 1], f"conv_state after commit({n_keep}) of strided rows")


def test_gdn_mix_checks_its_operands(L):
    cp = G.cupy()
    nk, nv, dk, dv = SHAPES[0]
    rng = np.random.default_rng(3)
    p = layer_params(rng, nk, nv, dk, dv, 4)
    _, args_d, _, ab_d = mix_operands(rng, 3, nk, nv, dk, dv, 4, 256, p, None)
    with pytest.raises(ValueError, match="give exactly one"):
        L.gdn_mix(*args_d, EPS, nk, dk, nv, dv)
    w = cp.zeros((nv, 144), np.uint8)
    with pytest.raises(ValueError, match="alpha_raw: type Q4_K"):
        L.gdn_mix(*args_d, EPS, nk, dk, nv, dv, ab_raw=(w, quants.Q4_K, w, quants.Q4_K))
    with pytest.raises(ValueError, match="r0: 3 outside"):
        L.gdn_mix(*args_d, EPS, nk, dk, nv, dv, **ab_d, r0=3)


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_layer_windows_with_commits(L, shape, K):
    """gdn_mix over three windows, committing between them (gdn_conv_commit, gdn_commit_state from what it kept)."""
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
        x = G.f32(rng, T, 32)  # unused: the projections are given
        y, q, k, v, g, beta = ref.gdn_mix_raw(qkv, conv_np, p["conv_w"], S_np, x, p["dt_bias"], p["ssm_a"], z,
                                              p["norm_w"], EPS, nk, dk, nv, dv, ab_proj=(alpha, beta_in))
        _, seq = ref.gdn_conv(qkv, conv_np, p["conv_w"])

        qkv_d = cp.asarray(qkv)
        q_d, k_d, v_d = G.nan_out((T, nk, dk)), G.nan_out((T, nk, dk)), G.nan_out((T, nv, dv))
        g_d, beta_d = G.nan_out((T, nv)), G.nan_out((T, nv))
        y_d = L.gdn_mix(qkv_d, conv_d, w_d["conv_w"], S_d, cp.asarray(x), w_d["dt_bias"], w_d["ssm_a"],
                        cp.asarray(z), w_d["norm_w"], EPS, nk, dk, nv, dv,
                        ab_proj=(cp.asarray(alpha), cp.asarray(beta_in)), q=q_d, k=k_d, v=v_d, g=g_d, beta=beta_d,
                        out=G.nan_out((T, nv, dv)))
        G.check(y_d, y, rtol=2e-4, what=f"y, window of {T}")

        conv_np = seq[n_keep:n_keep + K - 1]
        _, S_np = ref.gdn_recurrence(S_np, q[:n_keep], k[:n_keep], v[:n_keep], g[:n_keep], beta[:n_keep])
        n_dev = cp.asarray([n_keep], dtype=np.int32)
        L.gdn_conv_commit(conv_d, qkv_d, None, n_keep_dev=n_dev)
        L.gdn_commit_state(S_d, q_d, k_d, v_d, g_d, beta_d, None, n_keep_dev=n_dev)
        G.exact(conv_d, conv_np, f"conv state after commit({n_keep})")
        G.check(S_d, S_np, what=f"state after commit({n_keep})")
