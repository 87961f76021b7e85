"""kernels/ple.cu against strata_cli/ops/ple.py: the n-gram hash with EOS cuts and int64 wrapping, and ple_mix with
its conv history carried across windows and commits (the table row gathers: tests/test_gpu_embed.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_seq as G
from strata_cli.model import quants
from strata_cli.ops import ple as ref

pytestmark = pytest.mark.gpu

EOS, EPS = 509, 1e-6
MULT = np.array([23703573157769, 20109073645365, 8052911324071, 6100451423017], dtype=np.int64)


@pytest.fixture(scope="module")
def L():
    from strata_cli.gpu import launch_ple

    return launch_ple


def hash_tables(n, hpn):
    sizes = np.array([20000003 + 20 * i for i in range((n - 1) * hpn)], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return MULT[:n].copy(), sizes, offsets


def ref_rows(tokens, prev, mult, hpn, sizes, offsets):
    """engine/reference.py's per-token loop."""
    rows = []
    for tok in tokens:
        ctx = ref.ngram_context(int(tok), prev[::-1], EOS)
        rows.append(ref.ngram_rows(ctx, mult, hpn, sizes, offsets))
        prev = np.concatenate([prev[1:], [tok]])
    return np.stack(rows)


@pytest.mark.parametrize("n,hpn", [(3, 4), (4, 3), (2, 1)])
def test_ngram_rows_windows_with_commits(L, n, hpn):
    cp = G.cupy()
    rng = np.random.default_rng(n * 10 + hpn)
    mult, sizes, offsets = hash_tables(n, hpn)
    d_mult, d_sizes, d_offsets = cp.asarray(mult), cp.asarray(sizes), cp.asarray(offsets)
    prev = np.full(n - 1, EOS, np.int64)
    d_prev = cp.asarray(prev)
    for T, n_keep in [(7, 4), (16, 16), (3, 0), (1, 1), (16, 9)]:
        tokens = rng.integers(0, 1 << 20, T).astype(np.int64)  # products past 2^63 wrap
        tokens[rng.random(T) < 0.25] = EOS
        want = ref_rows(tokens, prev, mult, hpn, sizes, offsets)
        d_tok = cp.asarray(tokens)
        got = L.ngram_rows(d_tok, d_prev, EOS, d_mult, hpn, d_sizes, d_offsets,
                           out=G.nan_out((T, (n - 1) * hpn), np.int64))
        G.exact(got, want, f"rows, window of {T}")
        prev = np.concatenate([prev, tokens[:n_keep]])[-(n - 1):]
        L.ple_prev_commit(d_prev, d_tok, n_keep)
        G.exact(d_prev, prev, f"predecessors after commit({n_keep})")


@pytest.mark.parametrize("table_type", [quants.F32, quants.F16, quants.BF16, quants.Q8_0, quants.Q4_0])
@pytest.mark.parametrize("n,hpn,T", [(3, 4, 1), (4, 3, 7), (2, 1, 16)])
def test_ngram_gather_is_the_rows_then_their_gather(L, table_type, n, hpn, T):
    """ngram_gather: the hashed rows' table rows (ple_gather: hash and gather in one launch for the element-wise
    types; a block type (Q4_0) through ngram_rows + its gather) against the numpy reference (the per-token hash of
    engine/reference.py, then the dequantized table rows), EOS cuts, NaN-poisoned output, eager against graph
    replay."""
    from kernel_helpers import assert_replay_equals_eager

    cp = G.cupy()
    rng = np.random.default_rng(n * 100 + hpn * 10 + T + table_type)
    mult, sizes, offsets = hash_tables(n, hpn)
    hd = 64
    sizes = (sizes % 13 + 5).astype(np.int64)  # a small table: rows = hash mod size + offset
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    n_rows = int(offsets[-1] + sizes[-1])
    if table_type in L.GATHER_TYPES:
        table_raw = quants.quantize(G.f32(rng, n_rows, hd), table_type)
    else:  # random valid blocks of the block type (its gather is gemv_quant.cu's)
        from strata_cli.synth.blocks import random_tensor

        table_raw = random_tensor(rng, table_type, (n_rows, hd), 1.0)
    table = quants.dequantize(table_raw, table_type).reshape(n_rows, hd)
    prev = rng.integers(0, 1 << 20, n - 1).astype(np.int64)
    tokens = rng.integers(0, 1 << 20, T).astype(np.int64)
    tokens[rng.random(T) < 0.25] = EOS
    rows = ref_rows(tokens, prev, mult, hpn, sizes, offsets)
    want = table[rows].reshape(T, -1)
    dev = [cp.asarray(a) for a in (tokens, prev, mult, sizes, offsets, table_raw)]
    out, rows_buf = G.nan_out((T, rows.shape[1] * hd)), G.nan_out((T, rows.shape[1]), np.int64)

    def record(stream):
        L.ngram_gather(*dev[:2], EOS, dev[2], hpn, dev[3], dev[4], dev[5], table_type, hd, out=out, rows=rows_buf,
                       stream=stream)

    got = assert_replay_equals_eager(record, [out])[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("key_type", [quants.F32, quants.BF16])
@pytest.mark.parametrize("Kc,dilation", [(4, 3), (3, 1), (2, 2)])
def test_ple_mix_windows_with_commits(L, Kc, dilation, key_type):
    cp = G.cupy()
    C, D, P = 3, 40, 96
    CD, Hh = C * D, (Kc - 1) * dilation
    rng = np.random.default_rng(Kc * 10 + dilation + key_type)
    w_key_raw = quants.quantize(G.f32(rng, CD, P, scale=P ** -0.5), key_type)
    w_key = quants.dequantize(w_key_raw, key_type)  # what the reference multiplies by
    w_value = G.f32(rng, D, P, scale=P ** -0.5)
    norms = [1 + G.f32(rng, CD, scale=0.1) for _ in range(3)]
    conv_w = G.f32(rng, CD, Kc, scale=0.3)
    d_norms = [cp.asarray(a) for a in norms]
    d_w = dict(w_key=cp.asarray(w_key_raw), w_value=cp.asarray(w_value), conv_w=cp.asarray(conv_w))
    history = G.f32(rng, Hh, CD)
    d_hist = cp.asarray(history)
    work = L.PLEWork.empty(16, C, D)  # sized for the largest window, as a captured graph would hold it
    for T, n_keep, in_place in [(7, 4, False), (16, 16, True), (3, 0, False), (1, 1, True), (16, 5, False)]:
        R, emb = G.f32(rng, T, C, D), G.f32(rng, T, P)
        want, seq = ref.ple_mix(R, emb, history, w_key, w_value, *norms, conv_w, dilation, EPS)
        d_R, hist_before = cp.asarray(R), d_hist.get()
        got, normed = L.ple_mix(d_R, cp.asarray(emb), d_hist, d_w["w_key"], d_w["w_value"], *d_norms, d_w["conv_w"],
                                dilation, EPS, key_type=key_type, out=d_R if in_place else G.nan_out((T, C, D)),
                                normed=G.nan_out((T, CD)), work=work)
        G.check(got, want, what=f"R after PLE, window of {T}")
        G.check(normed, seq[Hh:], what="normed rows")
        G.exact(d_hist, hist_before, "history after the window")
        history = seq[n_keep:n_keep + Hh]
        L.ple_history_commit(d_hist, normed, None, n_keep_dev=cp.asarray([n_keep], dtype=np.int32))
        G.check(d_hist, history, what=f"history after commit({n_keep})")


@pytest.mark.parametrize("T,C,D,P", [(1, 4, 64, 96), (5, 3, 40, 64), (16, 2, 48, 160)])
@pytest.mark.parametrize("kv_type", [quants.F32, quants.Q8_0])
@pytest.mark.parametrize("pending", ["block_out", "combine", None])
def test_ple_mix_stacked_after_the_pending_write(L, T, C, D, P, kv_type, pending):
    """ple_mix as the window launches it: key and value one GEMV over the stacked [w_key; w_value] (raw rows of
    one type), the previous block's write (block_out, or the experts' combine) applied to R by the gate kernel;
    against ops.ple.ple_mix_after_write (the write, then ple_mix), NaN-poisoned outputs and scratch, eager
    against graph replay."""
    from kernel_helpers import assert_replay_equals_eager, raw_weight

    from strata_cli.gpu import launch_gemv, launch_hyper
    from strata_cli.ops import moe as ref_moe
    from strata_cli.ops.gemv import dequant_rows

    cp = G.cupy()
    Kc, dilation = 3, 2
    CD, Hh = C * D, (Kc - 1) * dilation
    rng = np.random.default_rng(T * 31 + C + D + kv_type + len(pending or ""))
    kv_raw = raw_weight(rng, (CD + D, P), kv_type, P ** -0.5)
    w_kv = dequant_rows(kv_raw, kv_type, P)
    norms = [1 + G.f32(rng, CD, scale=0.1) for _ in range(3)]
    conv_w, history = G.f32(rng, CD, Kc, scale=0.3), G.f32(rng, Hh, CD)
    R, emb = G.f32(rng, T, C, D), G.f32(rng, T, P)
    inj = (2.0 * rng.random((T, C))).astype(np.float32)
    K = 3
    parts, route_w = G.f32(rng, T * K + 2, D), rng.random((T, K)).astype(np.float32)
    bo = G.f32(rng, T, D) if pending == "block_out" else ref_moe.combine(parts, route_w)
    want_R, want, seq = ref.ple_mix_after_write(R, None if pending is None else (bo, inj), emb, history, w_kv,
                                                *norms, conv_w, dilation, EPS)

    dev = {name: cp.asarray(a) for name, a in dict(R=R, emb=emb, hist=history, kv=kv_raw, conv_w=conv_w, bo=bo,
                                                      inj=inj, parts=parts, route_w=route_w).items()}
    d_norms = [cp.asarray(a) for a in norms]
    write = {None: None, "block_out": (dev["bo"], dev["inj"]),
             "combine": launch_hyper.CombineWrite(dev["parts"], dev["route_w"], None, dev["inj"])}[pending]
    R_work, out, normed = cp.empty_like(dev["R"]), G.nan_out((T, C, D)), G.nan_out((T, CD))
    work = L.PLEWork(G.nan_out((T + 3, CD + D)), None, G.nan_out((T + 3, CD)))  # more rows than the window
    split = launch_gemv.SplitK.empty()

    def record(stream):
        with stream:
            cp.copyto(R_work, dev["R"])
        L.ple_mix(R_work, dev["emb"], dev["hist"], None, None, *d_norms, dev["conv_w"], dilation, EPS,
                  kv=(dev["kv"], kv_type), pending=write, out=out, normed=normed, work=work, split=split,
                  stream=stream)

    got_R, got, got_normed = assert_replay_equals_eager(record, [R_work, out, normed])
    np.testing.assert_allclose(got_R, want_R, rtol=1e-6, atol=1e-6)  # the combine's products may be FMAs
    G.check(got, want, rtol=2e-4, what="R after PLE")
    G.check(got_normed, seq[Hh:], rtol=2e-4, what="normed rows")


@pytest.mark.parametrize("T,C,D", [(1, 4, 64), (5, 3, 40), (16, 2, 96)])
def test_read_applies_the_ple_conv_step(L, T, C, D):
    """ple_mix_write, then the layer's hyper-connection read with its PleWrite pending (hc_write_norm adds the
    PLE's conv step: no ple_conv_out launch): R, mixed and inj those of ple_mix (ple_conv_out) and a plain read,
    both against the numpy reference (ops.ple.ple_mix, then ops.hyper.hc_write_read_raw);
    NaN-poisoned outputs, eager against graph replay."""
    from kernel_helpers import assert_close, assert_replay_equals_eager, hc_weights, raw_weight

    from strata_cli.gpu import launch_gemv, launch_hyper
    from strata_cli.ops import hyper

    cp = G.cupy()
    P, Kc, dilation, Lr = 64, 3, 2, 32
    CD, Hh = C * D, (Kc - 1) * dilation
    rng = np.random.default_rng(T * 17 + C + D)
    w_key, w_value = G.f32(rng, CD, P, scale=P ** -0.5), G.f32(rng, D, P, scale=P ** -0.5)
    norms = [1 + G.f32(rng, CD, scale=0.1) for _ in range(3)]
    conv_w, history = G.f32(rng, CD, Kc, scale=0.3), G.f32(rng, Hh, CD)
    R, emb = G.f32(rng, T, C, D), G.f32(rng, T, P)
    norm_w = (1.0 + 0.1 * rng.standard_normal(CD)).astype(np.float32)
    # Q8_0 rows hold whole 32-value blocks: a C*D that is not a multiple of 32 reads F16 weights instead
    w_type = quants.Q8_0 if CD % 32 == 0 else quants.F16
    down, up = raw_weight(rng, (Lr, CD), w_type, 0.2), raw_weight(rng, (CD, Lr), w_type, 0.3)
    inj_w = raw_weight(rng, (C, CD), w_type, 0.2)
    want_ple, _ = ref.ple_mix(R, emb, history, w_key, w_value, *norms, conv_w, dilation, EPS)
    want_R, want_mixed, want_inj = hyper.hc_write_read_raw(want_ple, None, norm_w, down, w_type, up,
                                                           w_type, inj_w, w_type, EPS)
    hc = hc_weights(norm_w, down, w_type, up, w_type, inj_w, w_type, pack=True)
    d = {name: cp.asarray(a) for name, a in dict(R=R, emb=emb, hist=history, wk=w_key, wv=w_value,
                                                    conv_w=conv_w).items()}
    d_norms = [cp.asarray(a) for a in norms]
    split = launch_gemv.SplitK.empty()
    runs = {}
    for fused in (True, False):
        R_work, normed = cp.empty_like(d["R"]), G.nan_out((T, CD))
        mixed, inj = G.nan_out((T, D)), G.nan_out((T, C))
        work = L.PLEWork.empty(T, C, D)
        scratch = launch_hyper.HcScratch.empty(T, C, D, hc.dn_raw.shape[0])

        def record(stream, fused=fused, R_work=R_work, normed=normed, mixed=mixed, inj=inj, work=work,
                   scratch=scratch):
            with stream:
                cp.copyto(R_work, d["R"])
            args = (R_work, d["emb"], d["hist"], d["wk"], d["wv"], *d_norms, d["conv_w"], dilation, EPS)
            if fused:
                write, _ = L.ple_mix_write(*args, normed=normed, work=work, split=split, stream=stream)
            else:
                L.ple_mix(*args, out=R_work, normed=normed, work=work, split=split, stream=stream)
                write = None
            launch_hyper.hc_read(R_work, hc, EPS, pending=write, out_mixed=mixed, out_inj=inj, scratch=scratch,
                                 split=split, stream=stream)

        runs[fused] = assert_replay_equals_eager(record, [R_work, mixed, inj, normed])
    for got_fused, got_plain in zip(runs[True], runs[False]):  # one arithmetic (PleConv); contractions may differ
        np.testing.assert_allclose(got_fused, got_plain, rtol=1e-6, atol=1e-6 * float(np.abs(got_plain).max()))
    got_R, got_mixed, got_inj, _ = runs[True]
    assert_close("R", want_R, got_R)
    assert_close("mixed", want_mixed, got_mixed)
    assert_close("inj", want_inj, got_inj)
