"""kernels/qsa.cu (qsa_mix, with qsa_select.cuh's scores and selection; the commit's indexer append; the norm-rope)
against strata_cli/ops/qsa.py: odd heads (3 query / 1 kv, 6 / 3), d 40, n_rot 8, ratio 3, budgets that make rows
sparse, dense and both in one window, exact-tie score rows, Flash-Next's shapes past one wave of blocks, NaN-poisoned
outputs, eager against graph replay and state carried across windows."""

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


def tables_for(n_ctx, n_rot, base=BASE):
    cos, sin = ref.rope_tables(np.arange(n_ctx), n_rot, base)
    return cos, sin, G.cupy().asarray(cos), G.cupy().asarray(sin)


@pytest.fixture(scope="module")
def tables(L):
    return tables_for(N_CTX, N_ROT)


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


class Layer:
    """One QSA layer's window operands as the engine passes them: views of one GEMV's rows [k | v | q, gate per head |
    indexer q | indexer k | NaN pad], the norms' weights, and its state (caches, tail, pooled) on the host."""

    def __init__(self, rng, T, Hq, Hk, d, Hi, di, n_ctx, ratio, n_rot=N_ROT):
        self.T, self.Hq, self.Hk, self.d, self.Hi, self.di, self.ratio, self.n_rot = T, Hq, Hk, d, Hi, di, ratio, n_rot
        kv, qw, iw = Hk * d, Hq * 2 * d, (Hi * di if ratio else 0)
        width = 2 * kv + qw + (iw + di if ratio else 0)
        self.rows = np.full((T, width + 5), np.nan, np.float32)
        self.rows[:, :width] = G.f32(rng, T, width)
        self.cut = (kv, 2 * kv, 2 * kv + qw, 2 * kv + qw + iw, width)
        self.w = {n: 1 + G.f32(rng, m, scale=0.1) for n, m in (("k", d), ("q", d), ("iq", di), ("ik", di))}
        self.kc, self.vc = G.f32(rng, n_ctx, Hk, d), G.f32(rng, n_ctx, Hk, d)
        self.tail = G.f32(rng, max(ratio, 1), di)
        self.pooled = G.f32(rng, n_ctx // max(ratio, 1) + 1, di)

    def views(self, rows):
        """k, v [T, Hk, d], qg [T, H, 2d], qr [T, Hi, di], keys [T, di] (None, None without the indexer): views of
        rows (host or device)."""
        a, b, c, e, f = self.cut
        T = self.T
        qr, keys = (rows[:, c:e].reshape(T, self.Hi, self.di), rows[:, e:f]) if self.ratio else (None, None)
        return (rows[:, :a].reshape(T, self.Hk, self.d), rows[:, a:b].reshape(T, self.Hk, self.d),
                rows[:, b:c].reshape(T, self.Hq, 2 * self.d), qr, keys)

    def reference(self, pos, budget, kc, vc, pooled):
        """ops.qsa.qsa_mix writing kc, vc and pooled (the window's blocks, live) in place: the output, and the rows'
        normed and roped indexer queries (None without the indexer)."""
        k, v, qg, qr, keys = self.views(self.rows)
        ix = qi = None
        if self.ratio:
            ix = ref.WindowIndexer(qr, self.w["iq"], keys, self.w["ik"], self.tail, pooled, budget)
            cos, sin = ref.rope_tables(pos, self.n_rot, BASE)
            qi = ref.rope_neox(rms_norm(qr, self.w["iq"], EPS), cos, sin)
        return ref.qsa_mix(k, v, qg, self.w["k"], self.w["q"], kc, vc, pos, EPS, self.n_rot, BASE, ix), qi

    def launch(self, L, d_rows, d_w, kc, vc, d_cos, d_sin, d_pos, budget, tail, pooled, raw, scratch, out,
               stream=None):
        """launch_qsa.qsa_mix over views of the device rows d_rows, as the window passes them."""
        dk, dv, dqg, dqr, dkeys = self.views(d_rows)
        indexer = None
        if self.ratio:
            indexer = L.Indexer(dqr, d_w["iq"], dkeys, d_w["ik"], tail, pooled, budget, raw=raw, scratch=scratch)
        return L.qsa_mix(dk, dv, dqg[..., :self.d], dqg[..., self.d:], d_w["k"], d_w["q"], kc, vc, d_cos, d_sin, d_pos,
                         EPS, indexer=indexer, out=out, stream=stream)


COUNTERS = ("done", "ready", "seen", "ticket")


def run_window(L, layer, pos0, budget, n_ctx, tables, own_raw=True):
    """qsa_mix of `layer` at pos0 eagerly and under graph replay (caches restored before each run; outputs
    poisoned), against the reference: the output, the cache cells (the window's written, no other), tail and pooled
    only read, the raw keys copied, the sparse rows' scores and cells (exact against select_cells of the launch's
    and of the reference's scores), every counter back at zero."""
    from kernel_helpers import assert_replay_equals_eager

    cp = G.cupy()
    _, _, d_cos, d_sin = tables
    T, d, di, ratio = layer.T, layer.d, layer.di, layer.ratio
    pos, d_pos = positions_of(pos0, T)
    kc_ref, vc_ref, pooled_ref = layer.kc.copy(), layer.vc.copy(), layer.pooled.copy()
    want, qi = layer.reference(pos, budget, kc_ref, vc_ref, pooled_ref)

    d_rows = cp.asarray(layer.rows)
    d_w = {n: cp.asarray(a) for n, a in layer.w.items()}
    kc0, vc0 = cp.asarray(layer.kc), cp.asarray(layer.vc)
    kc, vc = cp.empty_like(kc0), cp.empty_like(vc0)
    tail, pooled = cp.asarray(layer.tail), cp.asarray(layer.pooled)
    out = G.nan_out((T, layer.Hq * d))
    scratch = raw = None
    if ratio:
        scratch = L.SelectScratch.empty(T, layer.pooled.shape[0], L.cell_capacity(ratio, budget))
        raw = G.nan_out((T + 2, di)) if own_raw else None

    def record(stream):
        with stream:
            cp.copyto(kc, kc0)
            cp.copyto(vc, vc0)
        layer.launch(L, d_rows, d_w, kc, vc, d_cos, d_sin, d_pos, budget, tail, pooled, raw, scratch, out, stream)

    got = assert_replay_equals_eager(record, [out, kc, vc] + ([raw[:T]] if raw is not None else []))
    G.check(got[0], want, what=f"attention output, T {T} at {pos0}, ratio {ratio}, budget {budget}")
    others = np.setdiff1d(np.arange(n_ctx), pos)
    G.check(got[1][pos], kc_ref[pos], what="k cache cells of the window")
    G.exact(got[1][others], layer.kc[others], "k cache: the other cells untouched")
    G.exact(got[2], vc_ref, "v cache")
    G.exact(tail, layer.tail, "tail: only read")
    G.exact(pooled, layer.pooled, "pooled: only read")
    if raw is not None:
        G.exact(got[3], layer.views(layer.rows)[4], "raw keys copied for the commit")
    if not ratio:
        return
    for name in COUNTERS:
        G.exact(getattr(scratch, name), np.zeros(getattr(scratch, name).shape, np.int32), f"{name} after the runs")
    scores, cells, counts = (G.host(a) for a in (scratch.scores, scratch.cells, scratch.counts))
    for t, p in enumerate(pos):
        n = (p + 1) // ratio
        if n <= budget // ratio:
            continue  # below the budget: no scores, every cell
        want_s = ref.block_scores(qi[t], pooled_ref[:n])
        G.check(scores[t, :n], want_s, what=f"row {t}: scores")
        assert np.isneginf(scores[t, n:]).all()
        G.exact(cells[t, :counts[t]], ref.select_cells(scores[t, :n], p + 1, ratio, budget),
                f"row {t}: cells of the launch's scores")
        G.exact(cells[t, :counts[t]], ref.select_cells(want_s, p + 1, ratio, budget),
                f"row {t}: cells of the reference's scores")
        assert (cells[t, counts[t]:] == -1).all()


@pytest.mark.parametrize("T,Hq,Hk,Hi,DI,pos0,budget", [
    (1, 3, 1, 2, 24, 0, BUDGET),     # the first cell: dense
    (1, 3, 1, 2, 24, 40, BUDGET),    # sparse
    (3, 6, 3, 3, 40, 5, BUDGET),     # dense rows, then sparse ones, in one window
    (8, 3, 1, 1, 16, 30, BUDGET),
    (16, 6, 3, 2, 24, 50, BUDGET),   # blocks completed inside the window selected from it
    (5, 3, 1, 2, 300, 40, 30),       # indexer keys past the 8 values a lane holds in registers
    (8, 3, 1, 2, 24, 20, 3),         # a budget of one block
    (8, 3, 1, 2, 24, 20, 1000),      # every row below the budget: no block waits
])
def test_qsa_mix_matches_reference(L, tables, T, Hq, Hk, Hi, DI, pos0, budget):
    layer = Layer(np.random.default_rng(T * 31 + Hq + Hi + pos0 + budget), T, Hq, Hk, D, Hi, DI, N_CTX, RATIO)
    layer.rows[T - 1, layer.cut[2]:layer.cut[3]] = 0  # the last row's scores exactly 0: a full tie the replay decides
    run_window(L, layer, pos0, budget, N_CTX, tables)


@pytest.mark.parametrize("T,pos0", [(1, 0), (4, 9), (16, 50)])
def test_qsa_mix_without_indexer(L, tables, T, pos0):
    """ratio 0 (no indexer): every row attends to every cell; no score blocks, no scratch."""
    run_window(L, Layer(np.random.default_rng(T + pos0), T, 6, 3, D, 0, 1, N_CTX, 0), pos0, 0, N_CTX, tables)


def test_qsa_mix_keys_already_in_the_commits_rows(L, tables):
    """raw None (the keys projected straight into the commit's rows): nothing copied, the same output."""
    layer = Layer(np.random.default_rng(4), 5, 3, 1, D, 2, 24, N_CTX, RATIO)
    run_window(L, layer, 40, BUDGET, N_CTX, tables, own_raw=False)


@pytest.mark.parametrize("T,pos0", [(1, 3000), (8, 3000), (16, 2040)])
def test_qsa_mix_flash_next_shapes(L, T, pos0):
    """Flash-Next's geometry (24 / 2 heads of 256, 64 rotated dims, indexer 4 x 128, ratio 4, budget 2048) past the
    budget (and crossing it at 2040): T * (24 + score blocks) blocks, at T = 8 and 16 more than the device holds at
    once, whose attention blocks wait for their rows' selections."""
    n_ctx = 3100
    layer = Layer(np.random.default_rng(T), T, 24, 2, 256, 4, 128, n_ctx, 4, n_rot=64)
    run_window(L, layer, pos0, 2048, n_ctx, tables_for(n_ctx, 64))


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


def test_selection_ties_exact(L):
    """The selection on exact ties straddling the k-th place: one indexer head of 2 dims whose query is (1, 0) and
    rope the identity (cos 1, sin 0), pooled keys (s, 0), so a row's scores are relu(s) times one constant: equal
    stays equal; pooled past the row's completed blocks NaN (never read); rows of up to 333 blocks over many score
    blocks, the last of them selecting while the row's attention block waits. Cells exact against
    ops.qsa.select_cells on the scores the launch wrote."""
    cp = G.cupy()
    d, n_ctx = 8, 1000
    rng = np.random.default_rng(2)
    d_cos, d_sin = cp.ones((n_ctx, 2), np.float32), cp.zeros((n_ctx, 2), np.float32)
    kc, vc = cp.asarray(G.f32(rng, n_ctx, 1, d)), cp.asarray(G.f32(rng, n_ctx, 1, d))
    k, v, q, gate = (cp.asarray(G.f32(rng, 1, 1, d)) for _ in range(4))
    w, w2 = cp.ones((d,), np.float32), cp.ones((2,), np.float32)
    qr = cp.asarray(np.array([[[1, 0]]], np.float32))
    for n_cells, budget, s in tie_rows(rng):
        nb = len(s)
        pooled = np.full((nb + 9, 2), np.nan, np.float32)
        pooled[:nb] = np.stack([s, np.zeros_like(s)], axis=1)
        d_pos = cp.asarray([n_cells - 1], dtype=np.int32)
        scratch = L.SelectScratch.empty(1, nb + 9, L.cell_capacity(RATIO, budget))
        scratch.scores.fill(np.nan)
        ix = L.Indexer(qr, w2, cp.ones((1, 2), np.float32), w2, cp.asarray(G.f32(rng, RATIO, 2)), cp.asarray(pooled),
                       budget, scratch=scratch)
        out = L.qsa_mix(k, v, q, gate, w, w, kc, vc, d_cos, d_sin, d_pos, EPS, indexer=ix, out=G.nan_out((1, d)))
        scores, cells, counts = scratch.scores.get()[0], scratch.cells.get()[0], int(scratch.counts.get()[0])
        assert not np.isnan(out.get()).any() and not any(getattr(scratch, c).any() for c in COUNTERS)
        if nb <= budget // RATIO:  # below the budget: every cell, nothing scored
            assert np.isnan(scores).all()
            continue
        assert np.isneginf(scores[nb:]).all() and not np.isnan(scores[:nb]).any()
        done = nb - 1 if n_cells % RATIO == 0 else nb  # the row's own cell completes block nb - 1: pooled by the launch
        G.check(scores[:done], np.maximum(s[:done], 0), what="scores: relu(s)")
        G.exact(cells[:counts], ref.select_cells(scores[:nb], n_cells, RATIO, budget),
                f"cells, {n_cells} cells, budget {budget}, scores {s[:12]}...")


@pytest.mark.parametrize("ratio", [RATIO, 0])
def test_attention_windows_with_commits(L, tables, ratio):
    """qsa_mix and the commit's indexer append over windows with carried state, as the engine runs them (one scratch
    for every window size): outputs, caches, tail and the committed pooled blocks against the numpy engine's sequence
    (ops.qsa.qsa_mix, then indexer_append of the kept keys); the counters back at zero after every launch."""
    cp = G.cupy()
    _, _, d_cos, d_sin = tables
    rng = np.random.default_rng(3 + ratio)
    kc, vc = np.zeros((N_CTX, HK, D), np.float32), np.zeros((N_CTX, HK, D), np.float32)
    tail, pooled = np.zeros((max(ratio, 1), D), np.float32), np.zeros((NB, D), np.float32)
    w = {n: 1 + G.f32(rng, D, scale=0.1) for n in ("q", "k", "iq", "ik")}
    dev = {n: cp.asarray(a) for n, a in dict(kc=kc, vc=vc, tail=tail, pooled=pooled).items()}
    d_w = {n: cp.asarray(a) for n, a in w.items()}
    raw = cp.zeros((16, D), np.float32)
    full = L.SelectScratch.empty(16, NB, L.cell_capacity(max(ratio, 1), BUDGET))
    n_past = 0
    for T, n_keep in [(16, 16), (16, 9), (7, 3), (5, 5), (16, 2)]:
        layer = Layer(rng, T, H, HK, D, HI, D, N_CTX, ratio)
        layer.w, layer.tail = w, tail
        if ratio:
            layer.rows[[0, T - 1], layer.cut[2]:layer.cut[3]] = 0  # full ties
        pos, d_pos = positions_of(n_past, T)
        want, _ = layer.reference(pos, BUDGET, kc, vc, pooled)
        scratch = L.SelectScratch(*(getattr(full, f)[:T] for f in ("scores", "cells", "counts", "keys", "idx",
                                                                   "flags", "done", "ready", "seen")), full.ticket)
        got = layer.launch(L, cp.asarray(layer.rows), d_w, dev["kc"], dev["vc"], d_cos, d_sin, d_pos, BUDGET,
                           dev["tail"], dev["pooled"], raw[:T], scratch, G.nan_out((T, H * D)))
        G.check(got, want, what=f"attention output, window of {T} at {n_past}")
        G.check(dev["kc"], kc, what="k_cache")
        G.exact(dev["vc"], vc, "v_cache")
        if ratio:
            keys = layer.views(layer.rows)[4]
            ref.indexer_append(tail, pooled, keys[:n_keep], pos[:n_keep], w["ik"], EPS, N_ROT, BASE)
            L.indexer_commit(dev["tail"], dev["pooled"], raw[:T], d_pos, n_keep, d_w["ik"], EPS, d_cos, d_sin)
            G.exact(dev["tail"], tail, "tail after commit")
            committed = (n_past + n_keep) // ratio  # past them the numpy run's live blocks, never read
            G.check(dev["pooled"][:committed], pooled[:committed], what="pooled after commit")
            assert not any(getattr(full, c).any() for c in COUNTERS)
        n_past += n_keep


def test_indexer_commit_appends_the_kept_keys(L, tables):
    """indexer_commit against ops.qsa.indexer_append of the kept rows, n_keep as a scalar and from the device."""
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
        ref.indexer_append(tail, pooled, raw[:n_keep], pos[:n_keep], k_norm_w, EPS, N_ROT, BASE)
        d_raw = cp.asarray(raw)
        if device_count:
            n_dev = cp.asarray([n_keep], dtype=np.int32)
            L.indexer_commit(d_tail, d_pooled, d_raw, d_pos, None, d_knw, EPS, d_cos, d_sin, n_keep_dev=n_dev)
        else:
            L.indexer_commit(d_tail, d_pooled, d_raw, d_pos, n_keep, d_knw, EPS, d_cos, d_sin)
        G.exact(d_tail, tail, f"tail after commit({n_keep})")
        G.check(d_pooled, pooled, what=f"pooled after commit({n_keep})")
        n_past += n_keep
