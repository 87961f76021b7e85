"""kernels/qsa.cu and qsa_select.cu against strata_cli/ops/qsa.py: odd heads (3 query / 1 kv), d 40, n_rot 8,
ratio 3, budgets that make the selection sparse, exact-tie score rows, and state carried across windows."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_seq as G
from strata_cli.ops import qsa as ref
from strata_cli.ops.basic import rms_norm

pytestmark = pytest.mark.gpu

H, HK, D, N_ROT, BASE, EPS = 3, 1, 40, 8, 1e4, 1e-6
HI, RATIO, BUDGET, N_CTX = 2, 3, 9, 72
NB = N_CTX // RATIO + 1


@pytest.fixture(scope="module")
def L():
    from strata_cli.gpu import launch_qsa

    return launch_qsa


@pytest.fixture(scope="module")
def tables(L):
    cos, sin = ref.rope_tables(np.arange(N_CTX), N_ROT, BASE)
    return cos, sin, G.cupy().asarray(cos), G.cupy().asarray(sin)


def positions_of(pos0, T):
    return pos0 + np.arange(T), G.cupy().asarray(pos0 + np.arange(T), dtype=np.int32)


@pytest.mark.parametrize("T,pos0", [(1, 0), (3, 5), (7, 30), (16, 50)])
def test_norm_rope_on_views(L, tables, T, pos0):
    cp = G.cupy()
    cos, sin, d_cos, d_sin = tables
    rng = np.random.default_rng(T + pos0)
    pos, d_pos = positions_of(pos0, T)
    qg, w = G.f32(rng, T, H, 2 * D), 1 + G.f32(rng, D, scale=0.1)
    want = ref.rope_neox(rms_norm(qg[..., :D], w, EPS), cos[pos], sin[pos])
    d_qg = cp.asarray(qg)
    G.check(L.norm_rope(d_qg[..., :D], cp.asarray(w), EPS, d_cos, d_sin, d_pos, out=G.nan_out((T, H, D))), want,
            what="q from the attn_q view")
    got = L.norm_rope(cp.ascontiguousarray(d_qg[..., :D]), cp.asarray(w), EPS, cp.asarray(cos[pos]),
                      cp.asarray(sin[pos]), out=G.nan_out((T, H, D)))
    G.check(got, want, what="q with per-row tables")


@pytest.mark.parametrize("T,pos0,Hk,Hi,DI", [(1, 0, 1, 2, 24), (3, 5, 3, 0, 0), (7, 30, 1, 3, 40), (16, 50, 3, 1, 16)])
def test_prep_window(L, tables, T, pos0, Hk, Hi, DI):
    """qsa_prep (k, v into the caches, q and the indexer query normed and roped, one launch) against
    ops.qsa.prep_window, its inputs views of one GEMV's rows [k | v | q, gate | indexer q | NaN pad] as the window
    passes them; odd head counts, an indexer head dim unlike d (or no indexer), NaN-poisoned outputs, the caches'
    other cells untouched, eager against graph replay."""
    from kernel_helpers import assert_replay_equals_eager

    cp = G.cupy()
    cos, sin, d_cos, d_sin = tables
    rng = np.random.default_rng(T * 11 + Hk + Hi)
    pos, d_pos = positions_of(pos0, T)
    kv, qw, iw = Hk * D, H * 2 * D, Hi * DI
    rows = np.full((T, 2 * kv + qw + iw + 5), np.nan, np.float32)
    rows[:, :2 * kv + qw + iw] = G.f32(rng, T, 2 * kv + qw + iw)
    k, v = rows[:, :kv].reshape(T, Hk, D), rows[:, kv:2 * kv].reshape(T, Hk, D)
    qg = rows[:, 2 * kv:2 * kv + qw].reshape(T, H, 2 * D)
    qr = rows[:, 2 * kv + qw:2 * kv + qw + iw].reshape(T, Hi, DI) if Hi else None
    k_w, q_w = 1 + G.f32(rng, D, scale=0.1), 1 + G.f32(rng, D, scale=0.1)
    qi_w = 1 + G.f32(rng, DI, scale=0.1) if Hi else None
    k_cache, v_cache = G.f32(rng, N_CTX, Hk, D), G.f32(rng, N_CTX, Hk, D)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    want_qn, want_qi = ref.prep_window(k, v, qg[..., :D], k_w, q_w, cos[pos], sin[pos], want_k, want_v, pos, EPS,
                                       qr=qr, qi_w=qi_w)

    d_rows = cp.asarray(rows)
    dk, dv = d_rows[:, :kv].reshape(T, Hk, D), d_rows[:, kv:2 * kv].reshape(T, Hk, D)
    dq = d_rows[:, 2 * kv:2 * kv + qw].reshape(T, H, 2 * D)[..., :D]
    dqr = d_rows[:, 2 * kv + qw:2 * kv + qw + iw].reshape(T, Hi, DI) if Hi else None
    kc0, vc0 = cp.asarray(k_cache), cp.asarray(v_cache)
    kc, vc, qn = cp.empty_like(kc0), cp.empty_like(vc0), G.nan_out((T, H, D))
    qi = G.nan_out((T, Hi, DI)) if Hi else None
    weights = [cp.asarray(a) for a in (k_w, q_w)] + [cp.asarray(qi_w) if Hi else None]

    def record(stream):
        with stream:
            cp.copyto(kc, kc0)
            cp.copyto(vc, vc0)
        L.prep(dk, dv, dq, weights[0], weights[1], kc, vc, d_cos, d_sin, d_pos, EPS, out_qn=qn, qr=dqr,
               qi_w=weights[2], out_qi=qi, stream=stream)

    got = assert_replay_equals_eager(record, [kc, vc, qn] + ([qi] if Hi else []))
    G.check(got[0], want_k, what="k_cache")
    G.exact(got[1], want_v, "v_cache")
    G.check(got[2], want_qn, what="qn")
    if Hi:
        G.check(got[3], want_qi, what="qi")
    else:
        assert want_qi is None


@pytest.mark.parametrize("T,pos0,r0", [(1, 0, 0), (4, 5, 0), (7, 29, 2), (2, 40, 5)])
def test_prep_appends_the_indexer_keys(L, tables, T, pos0, r0):
    """qsa_prep with the indexer's keys in the stacked GEMV's rows (IndexerKeys): its extra block copies them into
    the layer's raw-key rows [r0, r0 + T) (r0 > 0: group B of a split window, rows [0, r0) group A's) and appends
    rows [0, r0 + T) from the snapshot it takes, leaving the tail at it; against ops.qsa.prep_window(indexer=),
    NaN-poisoned outputs, eager against graph replay."""
    from kernel_helpers import assert_replay_equals_eager

    cp = G.cupy()
    cos, sin, d_cos, d_sin = tables
    rng = np.random.default_rng(T * 7 + pos0 + r0)
    Hk, Hi, DI = 1, 2, 24
    kv, qw, iw = Hk * D, H * 2 * D, Hi * DI
    width = 2 * kv + qw + iw + DI
    rows = np.full((T, width + 3), np.nan, np.float32)
    rows[:, :width] = G.f32(rng, T, width)
    k, v = rows[:, :kv].reshape(T, Hk, D), rows[:, kv:2 * kv].reshape(T, Hk, D)
    q = rows[:, 2 * kv:2 * kv + qw].reshape(T, H, 2 * D)[..., :D]
    qr = rows[:, 2 * kv + qw:width - DI].reshape(T, Hi, DI)
    keys = rows[:, width - DI:width]
    k_w, q_w, qi_w, ik_w = (1 + G.f32(rng, n, scale=0.1) for n in (D, D, DI, DI))
    pos, d_pos = positions_of(pos0 + r0, T)
    key_pos, d_key_pos = positions_of(pos0, r0 + T)
    raw0 = G.f32(rng, r0 + T, DI)  # rows [0, r0): group A's keys; the rest stale, overwritten
    tail0, pooled0 = G.f32(rng, RATIO, DI), G.f32(rng, NB, DI)
    k_cache0, v_cache0 = G.f32(rng, N_CTX, Hk, D), G.f32(rng, N_CTX, Hk, D)
    want_raw = np.concatenate([raw0[:r0], keys])
    want_k, want_v, want_tail, want_pooled = k_cache0.copy(), v_cache0.copy(), tail0.copy(), pooled0.copy()
    want_qn, want_qi = ref.prep_window(k, v, q, k_w, q_w, cos[pos], sin[pos], want_k, want_v, pos, EPS, qr=qr,
                                       qi_w=qi_w, indexer=(want_tail, want_pooled, want_raw, key_pos, ik_w, N_ROT,
                                                           BASE))

    d_rows = cp.asarray(rows)
    dk, dv = d_rows[:, :kv].reshape(T, Hk, D), d_rows[:, kv:2 * kv].reshape(T, Hk, D)
    dq = d_rows[:, 2 * kv:2 * kv + qw].reshape(T, H, 2 * D)[..., :D]
    dqr, dkeys = d_rows[:, 2 * kv + qw:width - DI].reshape(T, Hi, DI), d_rows[:, width - DI:width]
    init = {name: cp.asarray(a) for name, a in dict(kc=k_cache0, vc=v_cache0, raw=raw0, tail=tail0,
                                                     pooled=pooled0).items()}
    work = {name: cp.empty_like(a) for name, a in init.items()}
    qn, qi, snap = G.nan_out((T, H, D)), G.nan_out((T, Hi, DI)), G.nan_out((RATIO, DI))
    dw = [cp.asarray(a) for a in (k_w, q_w, qi_w, ik_w)]
    keys_arg = L.IndexerKeys(dkeys, work["raw"], r0, d_key_pos, work["tail"], snap, work["pooled"], dw[3])

    def record(stream):
        with stream:
            for name, a in init.items():
                cp.copyto(work[name], a)
        L.prep(dk, dv, dq, dw[0], dw[1], work["kc"], work["vc"], d_cos, d_sin, d_pos, EPS, out_qn=qn, qr=dqr,
               qi_w=dw[2], out_qi=qi, indexer=keys_arg, stream=stream)

    names = ["kc", "vc", "raw", "tail", "pooled"]
    got = dict(zip(names + ["qn", "qi", "snap"],
                   assert_replay_equals_eager(record, [work[n] for n in names] + [qn, qi, snap])))
    G.check(got["kc"], want_k, what="k_cache")
    G.exact(got["vc"], want_v, "v_cache")
    G.check(got["qn"], want_qn, what="qn")
    G.check(got["qi"], want_qi, what="qi")
    G.exact(got["raw"], want_raw, "raw keys (group A's kept, this group's copied)")
    G.exact(got["snap"], tail0, "snapshot")
    G.exact(got["tail"], tail0, "tail back at its snapshot")
    G.check(got["pooled"], want_pooled, what="pooled after the window")
    assert not np.array_equal(want_pooled, pooled0) or T + r0 < RATIO  # a block completes in most cases


def test_indexer_windows_with_commits(L, tables):
    cp = G.cupy()
    _, _, d_cos, d_sin = tables
    rng = np.random.default_rng(1)
    k_norm_w = 1 + G.f32(rng, D, scale=0.1)
    tail, pooled = np.zeros((RATIO, D), np.float32), np.zeros((NB, D), np.float32)
    d_tail, d_pooled, d_knw = cp.asarray(tail), cp.asarray(pooled), cp.asarray(k_norm_w)
    n_past = 0
    for T, n_keep, device_count in [(7, 4, False), (16, 16, True), (3, 0, False), (5, 2, True), (1, 1, False)]:
        raw = G.f32(rng, T, D)
        pos, d_pos = positions_of(n_past, T)
        snap = tail.copy()
        ref.indexer_append(tail, pooled, raw, pos, k_norm_w, EPS, N_ROT, BASE)
        d_snap, d_raw = G.nan_out((RATIO, D)), cp.asarray(raw)
        L.indexer_append(d_tail, d_pooled, d_raw, d_pos, d_knw, EPS, d_cos, d_sin, snapshot=d_snap)
        G.exact(d_snap, snap, "snapshot")
        G.exact(d_tail, snap, "tail back at its snapshot after the window")
        G.check(d_pooled, pooled, what="pooled after the window")

        tail = snap.copy()
        ref.indexer_append(tail, pooled, raw[:n_keep], pos[:n_keep], k_norm_w, EPS, N_ROT, BASE)
        if device_count:
            n_dev = cp.asarray([n_keep], dtype=np.int32)
            L.indexer_commit(d_tail, d_pooled, d_snap, d_raw, d_pos, None, d_knw, EPS, d_cos, d_sin, n_keep_dev=n_dev)
        else:
            L.indexer_commit(d_tail, d_pooled, d_snap, d_raw, d_pos, n_keep, d_knw, EPS, d_cos, d_sin)
        G.exact(d_tail, tail, f"tail after commit({n_keep})")
        G.check(d_pooled, pooled, what=f"pooled after commit({n_keep})")
        n_past += n_keep


def tie_rows(rng):
    """(n_cells, budget, block scores) rows built to straddle the k-th place with exact ties."""
    rows = []
    for n_cells, budget in [(5, 9), (11, 9), (12, 9), (40, 9), (62, 15), (212, 3), (300, 3), (1000, 60), (50, 0)]:
        nb = n_cells // RATIO
        rows.append((n_cells, budget, rng.standard_normal(nb).astype(np.float32)))      # distinct
        rows.append((n_cells, budget, np.zeros(nb, np.float32)))                         # one big tie
        levels = rng.integers(0, 3, nb).astype(np.float32)                               # few levels, signed zeros
        levels[rng.random(nb) < 0.3] = -0.0
        rows.append((n_cells, budget, levels))
        top = rng.random(nb).astype(np.float32)                                          # tied maxima
        top[rng.choice(nb, size=min(nb, 5), replace=False)] = 2.0
        rows.append((n_cells, budget, top))
        tiny = np.where(rng.random(nb) < 0.5, np.float32(1e-40), np.float32(0)).astype(np.float32)  # denormals
        rows.append((n_cells, budget, tiny))
    return rows


def test_score_select_ties_exact(L):
    """qsa_score_select's selection on exact ties straddling the k-th place: one head of one dim with query 1, so
    a row's scores are relu(pooled) exactly; pooled past the row's completed blocks NaN (never read); rows of up to
    333 blocks span 42 blocks of the launch, the last of them selecting. Cells exact against ops.qsa.select_cells
    on the scores the launch wrote."""
    cp = G.cupy()
    for n_cells, budget, s in tie_rows(np.random.default_rng(2)):
        nb = len(s)
        pooled = np.full((nb + 9, 1), np.nan, np.float32)
        pooled[:nb, 0] = s
        d_pos = cp.asarray([n_cells - 1], dtype=np.int32)
        C = L.cell_capacity(RATIO, budget)
        scores, cells, counts = L.score_select(cp.ones((1, 1, 1), np.float32), cp.asarray(pooled), d_pos, RATIO,
                                               budget, scores=G.nan_out((1, nb + 9)),
                                               cells=G.nan_out((1, C), np.int32), counts=G.nan_out((1,), np.int32))
        scores, cells, counts = scores.get()[0], cells.get()[0], counts.get()[0]
        assert np.isneginf(scores[nb:]).all() and not np.isnan(scores[:nb]).any()
        want = ref.select_cells(scores[:nb], n_cells, RATIO, budget)
        G.exact(cells[:counts], want, f"cells, {n_cells} cells, budget {budget}, scores {s[:12]}...")


@pytest.mark.parametrize("T,Hi,d,pos0,budget", [(1, 4, 128, 900, 2048), (1, 4, 128, 3000, 2048),
                                                 (3, 2, 40, 40, 9), (5, 3, 300, 40, 30), (8, 1, 7, 200, 0)])
def test_score_select_matches_reference(L, T, Hi, d, pos0, budget):
    """qsa_score_select: scores against ops.qsa.block_scores (odd head counts and dims; d 300: past the 8 key
    values a lane holds in registers; Flash-Next's 4 x 128 with its 2048 budget at ratio 4, below and above it),
    rows whose completed blocks end at different places, the capacity past them -inf; cells exact against
    ops.qsa.select_cells of the launch's scores and of the reference's; NaN-poisoned outputs; eager against graph
    replay (each replay finds the row counters back at zero)."""
    from kernel_helpers import assert_replay_equals_eager

    cp = G.cupy()
    rng = np.random.default_rng(T * 13 + Hi + d + pos0)
    ratio = 4 if d == 128 else 3
    pos = pos0 + 7 * np.arange(T)
    nb = (pos[-1] + 1) // ratio + 5
    qi, pooled = G.f32(rng, T, Hi, d), G.f32(rng, nb, d)
    qi[-1] = 0  # all of the last row's scores exactly 0: a full tie, the replay decides
    d_qi, d_pooled, d_pos = cp.asarray(qi), cp.asarray(pooled), cp.asarray(pos, dtype=np.int32)
    C = L.cell_capacity(ratio, budget)
    outs = [G.nan_out((T, nb)), G.nan_out((T, C), np.int32), G.nan_out((T,), np.int32)]
    scratch = L.SelectScratch.empty(T, nb)

    def record(stream):
        L.score_select(d_qi, d_pooled, d_pos, ratio, budget, scores=outs[0], cells=outs[1], counts=outs[2],
                       scratch=scratch, stream=stream)

    got, cells, counts = assert_replay_equals_eager(record, outs)
    G.exact(scratch.done, np.zeros(T, np.int32), "row counters after the replays")
    want = np.full((T, nb), -np.inf, np.float32)
    for t in range(T):
        n = (pos[t] + 1) // ratio
        want[t, :n] = ref.block_scores(qi[t], pooled[:n])
        G.exact(cells[t, :counts[t]], ref.select_cells(got[t, :n], pos[t] + 1, ratio, budget),
                f"row {t}: cells of the launch's scores")
        G.exact(cells[t, :counts[t]], ref.select_cells(want[t, :n], pos[t] + 1, ratio, budget),
                f"row {t}: cells of the reference's scores")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    G.check(np.where(np.isneginf(want), 0, got), np.where(np.isneginf(want), 0, want), what="scores")


def window_inputs(rng, T, zero_rows=(0,)):
    k, v, qg, raw, qi = (G.f32(rng, T, HK, D), G.f32(rng, T, HK, D), G.f32(rng, T, H, 2 * D), G.f32(rng, T, D),
                         G.f32(rng, T, HI, D))
    for r in zero_rows:
        if r < T:
            qi[r] = 0  # all block scores exactly 0: a full tie, the replay decides
    return k, v, qg, raw, qi


@pytest.mark.parametrize("ratio", [RATIO, 0])
def test_attention_windows_with_commits(L, tables, ratio):
    """Norm/rope and K/V append (qsa_prep), indexer, scores, selection and attention over windows, as the engine
    does."""
    cp = G.cupy()
    cos, sin, d_cos, d_sin = tables
    rng = np.random.default_rng(3 + ratio)
    w = {n: 1 + G.f32(rng, D, scale=0.1) for n in ("q", "k", "iq", "ik")}
    kc, vc = np.zeros((N_CTX, HK, D), np.float32), np.zeros((N_CTX, HK, D), np.float32)
    tail, pooled = np.zeros((max(ratio, 1), D), np.float32), np.zeros((NB, D), np.float32)
    d = {n: cp.asarray(a) for n, a in dict(kc=kc, vc=vc, tail=tail, pooled=pooled, **w).items()}
    n_past = 0
    for T, n_keep in [(16, 16), (16, 9), (7, 3), (5, 5), (16, 2)]:
        k_raw, v, qg, raw, qi_raw = window_inputs(rng, T, zero_rows=(0, T - 1))
        pos, d_pos = positions_of(n_past, T)
        kc[pos] = ref.rope_neox(rms_norm(k_raw, w["k"], EPS), cos[pos], sin[pos])
        vc[pos] = v
        q = ref.rope_neox(rms_norm(qg[..., :D], w["q"], EPS), cos[pos], sin[pos])
        want = np.empty((T, H * D), np.float32)
        if ratio:
            snap = tail.copy()
            ref.indexer_append(tail, pooled, raw, pos, w["ik"], EPS, N_ROT, BASE)
            qi = ref.rope_neox(rms_norm(qi_raw, w["iq"], EPS), cos[pos], sin[pos])
        for t, p in enumerate(pos):
            cells = np.arange(p + 1)
            if ratio:
                cells = ref.select_cells(ref.block_scores(qi[t], pooled[:(p + 1) // ratio]), p + 1, ratio, BUDGET)
            want[t] = ref.attend_selected(q[t], qg[t, :, D:], kc, vc, cells)

        d_qg = cp.asarray(qg)
        q_d, _ = L.prep(cp.asarray(k_raw), cp.asarray(v), d_qg[..., :D], d["k"], d["q"], d["kc"], d["vc"], d_cos,
                        d_sin, d_pos, EPS, out_qn=G.nan_out((T, H, D)))
        cells_d = counts_d = None
        if ratio:
            d_snap = G.nan_out((ratio, D))
            L.indexer_append(d["tail"], d["pooled"], cp.asarray(raw), d_pos, d["ik"], EPS, d_cos, d_sin, d_snap)
            qi_d = L.norm_rope(cp.asarray(qi_raw), d["iq"], EPS, d_cos, d_sin, d_pos)
            scores, cells_d, counts_d = L.score_select(qi_d, d["pooled"], d_pos, ratio, BUDGET,
                                                       scores=G.nan_out((T, NB)))
            assert not np.isnan(scores.get()).any()
        got = L.attend_selected(q_d, d_qg[..., D:], d["kc"], d["vc"], d_pos, cells_d, counts_d,
                                out=G.nan_out((T, H * D)))
        G.check(got, want, what=f"attention output, window of {T} at {n_past}")
        G.check(d["kc"], kc, what="k_cache")

        if ratio:
            tail = snap.copy()
            ref.indexer_append(tail, pooled, raw[:n_keep], pos[:n_keep], w["ik"], EPS, N_ROT, BASE)
            L.indexer_commit(d["tail"], d["pooled"], d_snap, cp.asarray(raw), d_pos, n_keep, d["ik"], EPS, d_cos,
                             d_sin)
            G.exact(d["tail"], tail, "tail after commit")
            G.check(d["pooled"], pooled, what="pooled after commit")
        n_past += n_keep
