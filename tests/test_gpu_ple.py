"""kernels/ple.cu against strata_cli/ops/ple.py: the n-gram hash with EOS cuts and int64 wrapping, the hash and
gather in one launch, and the PLE layer's mix with its read's norm (ple_mix_norm, the first kernel of the PLE
layer's first hyper-connection read) with its conv history carried across windows and commits."""

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


def _read_weights(rng, C, D, Lr=32):
    """A hyper-connection read's weights (norm_w, down, up, inject raw, their type): Q8_0 where C*D holds whole
    blocks, else F16."""
    from kernel_helpers import raw_weight

    CD = C * D
    w_type = quants.Q8_0 if CD % 32 == 0 else quants.F16
    norm_w = (1.0 + 0.1 * rng.standard_normal(CD)).astype(np.float32)
    return (norm_w, raw_weight(rng, (Lr, CD), w_type, 0.2), raw_weight(rng, (CD, Lr), w_type, 0.3),
            raw_weight(rng, (C, CD), w_type, 0.2), w_type)


@pytest.mark.parametrize("key_type", [quants.F32, quants.BF16])
@pytest.mark.parametrize("Kc,dilation", [(4, 3), (3, 1), (2, 2)])
def test_ple_read_windows_with_commits(L, Kc, dilation, key_type):
    """The PLE layer's first read as the window runs it: ple_kv (key and value two GEMVs, of key_type and F32),
    then launch_hyper.hc_read with the PleMix pending (its first kernel ple_mix_norm), windows of odd sizes with
    commits between them: R, mixed, inj and the read's xn against ops.ple.ple_mix then ops.hyper.hc_write_read_raw,
    the normed rows against the reference's sequence, the history carried across windows (the window never writes
    it, ple_history_commit advances it), the sync words zero after every window; NaN-poisoned outputs."""
    from kernel_helpers import hc_weights

    from strata_cli.gpu import launch_gemv, launch_hyper
    from strata_cli.ops import hyper
    from strata_cli.ops.basic import grouped_rms_norm

    cp = G.cupy()
    C, D, P = 3, 40, 96
    CD, Hh = C * D, (Kc - 1) * dilation
    rng = np.random.default_rng(Kc * 10 + dilation + key_type)
    w_key_raw = quants.quantize(G.f32(rng, CD, P, scale=P ** -0.5), key_type)
    w_key = quants.dequantize(w_key_raw, key_type)  # what the reference multiplies by
    w_value = G.f32(rng, D, P, scale=P ** -0.5)
    norms = [1 + G.f32(rng, CD, scale=0.1) for _ in range(3)]
    conv_w = G.f32(rng, CD, Kc, scale=0.3)
    norm_w, down, up, inj_w, w_type = _read_weights(rng, C, D)
    hc = hc_weights(norm_w, down, w_type, up, w_type, inj_w, w_type, pack=True)
    d_norms = [cp.asarray(a) for a in norms]
    d_wk, d_wv, d_conv = cp.asarray(w_key_raw), cp.asarray(w_value), cp.asarray(conv_w)
    history = G.f32(rng, Hh, CD)
    d_hist = cp.asarray(history)
    work = L.PLEWork.empty(16, C, D)  # sized for the largest window, as a captured graph would hold it
    sync = cp.zeros(L.sync_words(16, C), dtype=np.uint32)
    scratch = launch_hyper.HcScratch.empty(16, C, D, hc.dn_raw.shape[0])
    split = launch_gemv.SplitK.empty()
    for T, n_keep in [(7, 4), (16, 16), (3, 0), (1, 1), (16, 5), (8, 8)]:
        R, emb = G.f32(rng, T, C, D), G.f32(rng, T, P)
        want, seq = ref.ple_mix(R, emb, history, w_key, w_value, *norms, conv_w, dilation, EPS)
        want_R, want_mixed, want_inj = hyper.hc_write_read_raw(want, None, norm_w, down, w_type, up, w_type, inj_w,
                                                               w_type, EPS)
        d_R, hist_before = cp.asarray(R), d_hist.get()
        scratch.xn.fill(np.nan)
        key, value = L.ple_kv(cp.asarray(emb), C, d_wk, d_wv, key_type=key_type, work=work, split=split)
        normed = G.nan_out((T, CD))
        mix = L.PleMix(key, value, d_hist, *d_norms, d_conv, dilation, normed, sync=sync)
        mixed, inj = launch_hyper.hc_read(d_R, hc, EPS, pending=mix, out_mixed=G.nan_out((T, D)),
                                          out_inj=G.nan_out((T, C)), scratch=scratch, split=split)
        G.check(d_R, want_R, rtol=2e-4, what=f"R after PLE, window of {T}")
        G.check(scratch.xn[:T], grouped_rms_norm(want.reshape(T, CD), norm_w, D, EPS), rtol=2e-4, what="xn")
        G.check(mixed, want_mixed, rtol=2e-4, what="mixed")
        G.check(inj, want_inj, rtol=2e-4, what="inj")
        G.check(normed, seq[Hh:], rtol=2e-4, what="normed rows")
        G.exact(d_hist, hist_before, "history after the window")
        assert not sync.get().any(), f"sync words left set after a window of {T}"
        history = seq[n_keep:n_keep + Hh]
        L.ple_history_commit(d_hist, normed, None, n_keep_dev=cp.asarray([n_keep], dtype=np.int32))
        G.check(d_hist, history, what=f"history after commit({n_keep})")


# T = 1 (no row reads another's: no sync), 3, 8 and 16 (the conv reads earlier rows: flags); the model's stream
# (D = 2560: one pass of 5 x 512 elements) with its 11 combine slots, a wider one (D = 2600: ple_mix_norm_passes)
@pytest.mark.parametrize("T,C,D,P", [(1, 4, 64, 96), (3, 3, 40, 64), (8, 4, 2560, 64), (16, 2, 48, 160),
                                     (16, 2, 2600, 32)])
@pytest.mark.parametrize("kv_type", [quants.F32, quants.Q8_0])
@pytest.mark.parametrize("pending", ["block_out", "combine", None])
def test_ple_mix_norm_after_the_pending_write(L, T, C, D, P, kv_type, pending):
    """ple.cu ple_mix_norm as the window launches it: key and value rows of one GEMV over the stacked
    [w_key; w_value] (raw rows of one type), the previous block's write (block_out, or the experts' combine of 11
    slots with the shared expert) applied to R first; R, normed and xn against ops.ple.ple_mix_after_write then
    grouped_rms_norm, NaN-poisoned outputs, eager against graph replay (three replays: the flags are zero again
    after each, as the sync words are after the last)."""
    from kernel_helpers import assert_replay_equals_eager, raw_weight

    from strata_cli.gpu import launch_gemv, launch_hyper
    from strata_cli.ops import moe as ref_moe
    from strata_cli.ops.basic import grouped_rms_norm
    from strata_cli.ops.gemv import dequant_rows

    cp = G.cupy()
    Kc, dilation = 3, 2
    CD, Hh = C * D, (Kc - 1) * dilation
    rng = np.random.default_rng(T * 31 + C + D + kv_type + len(pending or ""))
    kv_raw = raw_weight(rng, (CD + D, P), kv_type, P ** -0.5)
    w_kv = dequant_rows(kv_raw, kv_type, P)
    norms = [1 + G.f32(rng, CD, scale=0.1) for _ in range(3)]
    norm_w = 1 + G.f32(rng, CD, scale=0.1)
    conv_w, history = G.f32(rng, CD, Kc, scale=0.3), G.f32(rng, Hh, CD)
    R, emb = G.f32(rng, T, C, D), G.f32(rng, T, P)
    inj = (2.0 * rng.random((T, C))).astype(np.float32)
    K = 11
    parts, route_w = G.f32(rng, T * K + 2, D), rng.random((T, K)).astype(np.float32)
    shared = G.f32(rng, T, D)
    bo = G.f32(rng, T, D) if pending == "block_out" else ref_moe.combine(parts, route_w, shared)
    _, want, seq = ref.ple_mix_after_write(R, None if pending is None else (bo, inj), emb, history, w_kv, *norms,
                                           conv_w, dilation, EPS)
    want_xn = grouped_rms_norm(want.reshape(T, CD), norm_w, D, EPS)

    dev = {name: cp.asarray(a) for name, a in dict(R=R, emb=emb, hist=history, kv=kv_raw, conv_w=conv_w, bo=bo,
                                                      inj=inj, parts=parts, route_w=route_w, shared=shared,
                                                      norm_w=norm_w).items()}
    d_norms = [cp.asarray(a) for a in norms]
    write = {None: None, "block_out": (dev["bo"], dev["inj"]),
             "combine": launch_hyper.CombineWrite(dev["parts"], dev["route_w"], dev["shared"], dev["inj"])}[pending]
    R_work, normed, xn = cp.empty_like(dev["R"]), G.nan_out((T, CD)), G.nan_out((T, CD))
    work = L.PLEWork(G.nan_out((T + 3, CD + D)), None)  # more rows than the window
    sync = cp.zeros(L.sync_words(T, C) + 5, dtype=np.uint32)  # more words than the window
    split = launch_gemv.SplitK.empty()

    def record(stream):
        with stream:
            cp.copyto(R_work, dev["R"])
        key, value = L.ple_kv(dev["emb"], C, kv=(dev["kv"], kv_type), work=work, split=split, stream=stream)
        mix = L.PleMix(key, value, dev["hist"], *d_norms, dev["conv_w"], dilation, normed, pending=write, sync=sync)
        L.ple_mix_norm(R_work, mix, dev["norm_w"], xn, EPS, stream=stream)

    got_R, got_normed, got_xn = assert_replay_equals_eager(record, [R_work, normed, xn])
    G.check(got_R, want, rtol=2e-4, what="R after the write and the PLE")
    G.check(got_normed, seq[Hh:], rtol=2e-4, what="normed rows")
    G.check(got_xn, want_xn, rtol=2e-4, what="xn")
    assert not sync.get().any(), "sync words left set"
