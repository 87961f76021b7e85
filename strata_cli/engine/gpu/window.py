"""The launches of one verify window and of the commit, in the order of ReferenceEngine._layer.

Both recorders only launch kernels on preallocated buffers, so the same calls run eagerly or under capture.
Per-window values (tokens, positions, n_keep) are read by the kernels from device buffers that the recorded
graph fills from mapped staging first; nothing window-specific is baked into a graph except T.

Profiling: `stamp(e, layer, stage, stream)` marks the end of each stage (names in strata_cli/engine/stage_timing.py).
It launches a stamp only while the engine records its profiling variant (e.stamper set); the normal graph has
no stamp node.
"""

from __future__ import annotations

from ... import settings
from ...gpu import launch_embed as embed
from ...gpu import launch_gdn as gdn
from ...gpu import launch_gemv
from ...gpu import launch_hyper as hyper
from ...gpu import launch_moe as moe
from ...gpu import launch_ple as ple
from ...gpu import launch_qsa as qsa
from ...gpu import launch_sampling as sampling
from ...gpu.runtime import check, cudart
from ...model.names import PLE_TABLE
from .buffers import argmax_scratch, split_k


def _copy(dst, src, nbytes: int, stream) -> None:
    rt = cudart()
    check(rt.cudaMemcpyAsync(dst.data.ptr, src.data.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyDefault,
                             stream.ptr), "cudaMemcpyAsync")


# ---- profiling stamps: no-ops unless e.stamper is set (the profiling variant of the window graph)
def stamp(e, layer: int, stage: str, stream) -> None:
    if e.stamper is not None:
        e.stamper(layer, stage, stream)


def _marks(e, layer: int, prefix: str, stream):
    """A launcher's mark(part) hook stamping stage f"{prefix}{part}" of `layer`, or None when not profiling."""
    if e.stamper is None:
        return None
    return lambda part: e.stamper(layer, prefix + part, stream)


def _hc(e, prefix: str, T: int, inject: bool, stream, r0: int = 0, mark=None):
    """HC read of rows [r0, T) (r0 > 0 only for the second token group of a split window, split.py)."""
    b, w = e.buf, e.w
    down, up = w.raw(f"{prefix}_down.weight"), w.raw(f"{prefix}_up.weight")
    inj = w.raw(f"{prefix}_inject.weight") if inject else (None, None)
    scratch = hyper.HcScratch(b["hc_xn"], b["hc_low"], b["hc_gates"])
    return hyper.hc_read(b["R"][r0:T], w.f32(f"{prefix}_norm.weight"), *down, *up, *inj, e.g.eps,
                         out_mixed=b["mixed"][r0:T], out_inj=b["inj"][r0:T] if inject else None, scratch=scratch,
                         split=split_k(b), stream=stream, mark=mark)


def fused_hc() -> bool:
    """STRATA_FUSED_HC=1: the hyper-connection reads take launch_hyper.hc_read_fused, which also applies the
    previous block's residual write (4 nodes per read, no write node); 0 or unset: hc_read + hc_write (6)."""
    return settings.FUSED_HC.value()


def fused_gdn() -> bool:
    """STRATA_FUSED_GDN=1: a GDN layer's conv and q/k/v split are one launch (launch_gdn.gdn_conv_split), and its
    alpha and beta projections with their gates one more (launch_gdn.gdn_ab_gates): 2 launches instead of 5."""
    return settings.FUSED_GDN.value()


def _hc_fused(e, prefix: str, T: int, inject: bool, pending: bool, stream, mark=None):
    """The fused HC read of rows [0, T), after the pending write of block_out with the last read's inj when
    `pending` (the write goes into R in place first)."""
    b, w = e.buf, e.w
    down, up = w.raw(f"{prefix}_down.weight"), w.raw(f"{prefix}_up.weight")
    inj = w.raw(f"{prefix}_inject.weight") if inject else (None, None)
    scratch = hyper.HcScratch(b["hc_xn"], b["hc_low"], b["hc_gates"], b["hc_inj_part"])
    return hyper.hc_read_fused(b["R"][:T], w.f32(f"{prefix}_norm.weight"), *down, *up, *inj, e.g.eps,
                               pending=(b["block_out"][:T], b["inj"][:T]) if pending else None,
                               out_mixed=b["mixed"][:T], out_inj=b["inj"][:T] if inject else None, scratch=scratch,
                               split=split_k(b), stream=stream, mark=mark)


def _gemv(e, name: str, x, out, stream):
    raw, ggml_type = e.w.raw(name)
    return launch_gemv.gemv(raw, ggml_type, x.shape[1], x, out=out, split=split_k(e.buf), stream=stream)


def _gdn(e, layer: int, x, T: int, stream, r0: int = 0):
    """GDN of rows [r0, T), x = their mixed rows. r0 > 0 (split.py): the conv and the recurrence run again from the
    saved state over rows [0, T); the earlier group's rows come out as they did (outputs land in scratch only)."""
    b, w, g = e.buf, e.w, e.g
    blk, n = f"blk.{layer}.", T - r0
    qkv = b[f"qkv.{layer}"][:T]
    _gemv(e, blk + "attn_qkv.weight", x, qkv[r0:], stream)
    stamp(e, layer, "qkv", stream)
    q, k, v = b[f"q.{layer}"][:T], b[f"k.{layer}"][:T], b[f"v.{layer}"][:T]
    if fused_gdn():
        gdn.gdn_conv_split(qkv, b[f"conv.{layer}"], w.blk_f32(layer, "ssm_conv1d"), g.ssm_nk, g.ssm_dk, g.ssm_nv,
                           g.ssm_dv, q=q, k=k, v=v, stream=stream)
    else:
        gdn.gdn_conv(qkv, b[f"conv.{layer}"], w.blk_f32(layer, "ssm_conv1d"), out=b["gdn_h"][:T], stream=stream)
        gdn.gdn_split(b["gdn_h"][:T], g.ssm_nk, g.ssm_dk, g.ssm_nv, g.ssm_dv, q=q, k=k, v=v, stream=stream)
    stamp(e, layer, "conv", stream)
    decay, beta = b[f"g.{layer}"][:T], b[f"beta.{layer}"][:T]
    alpha_w, beta_w = w.raw(blk + "ssm_alpha.weight"), w.raw(blk + "ssm_beta.weight")
    if fused_gdn() and alpha_w[1] in gdn.AB_TYPES and beta_w[1] in gdn.AB_TYPES:
        gdn.gdn_ab_gates(x, *alpha_w, *beta_w, w.blk_f32(layer, "ssm_dt.bias"), w.blk_f32(layer, "ssm_a"),
                         g=decay[r0:], beta=beta[r0:], stream=stream)
    else:
        _gemv(e, blk + "ssm_alpha.weight", x, b["gdn_alpha"][r0:T], stream)
        _gemv(e, blk + "ssm_beta.weight", x, b["gdn_beta_in"][r0:T], stream)
        gdn.gdn_gates(b["gdn_alpha"][r0:T], b["gdn_beta_in"][r0:T], w.blk_f32(layer, "ssm_dt.bias"),
                      w.blk_f32(layer, "ssm_a"), g=decay[r0:], beta=beta[r0:], stream=stream)
    stamp(e, layer, "ab", stream)
    gdn.gdn_recurrence(b[f"S.{layer}"], q, k, v, decay, beta, out=b["gdn_o"][:T], with_state=False, stream=stream)
    stamp(e, layer, "rec", stream)
    _gemv(e, blk + "attn_gate.weight", x, b["gdn_z"][r0:T], stream)
    stamp(e, layer, "z", stream)
    y = gdn.gdn_gated_norm(b["gdn_o"][r0:T], b["gdn_z"][r0:T].reshape(n, g.ssm_nv, g.ssm_dv),
                           w.blk_f32(layer, "ssm_norm"), g.eps, out=b["gdn_y"][r0:T], stream=stream)
    stamp(e, layer, "gate", stream)
    _gemv(e, blk + "ssm_out.weight", y.reshape(n, -1), b["block_out"][r0:T], stream)
    stamp(e, layer, "out-proj", stream)


def _qsa(e, layer: int, x, T: int, stream, r0: int = 0):
    """QSA of rows [r0, T), x = their mixed rows (r0 > 0: split.py; the earlier group's K/V cells are in the cache,
    and the indexer appends rows [0, T) again from the restored tail)."""
    b, w, g = e.buf, e.w, e.g
    blk, d, pos, n = f"blk.{layer}.", g.head_dim, b["positions"][r0:T], T - r0
    cos, sin = b["cos"], b["sin"]
    _gemv(e, blk + "attn_k.weight", x, b["qa_k"][r0:T], stream)
    kn = qsa.norm_rope(b["qa_k"][r0:T].reshape(n, g.n_head_kv, d), w.blk_f32(layer, "attn_k_norm"), g.eps, cos, sin,
                       positions=pos, out=b["qa_kn"][r0:T], stream=stream)
    _gemv(e, blk + "attn_v.weight", x, b["qa_v"][r0:T], stream)
    stamp(e, layer, "k/v+norm-rope", stream)
    qsa.kv_append(b[f"kc.{layer}"], b[f"vc.{layer}"], kn, b["qa_v"][r0:T].reshape(n, g.n_head_kv, d), pos,
                  stream=stream)
    stamp(e, layer, "kv append", stream)
    _gemv(e, blk + "attn_q.weight", x, b["qa_qg"][r0:T], stream)
    qg = b["qa_qg"][r0:T].reshape(n, g.n_head, 2 * d)
    qn = qsa.norm_rope(qg[:, :, :d], w.blk_f32(layer, "attn_q_norm"), g.eps, cos, sin, positions=pos,
                       out=b["qa_qn"][r0:T], stream=stream)
    stamp(e, layer, "q+norm-rope", stream)
    cells = counts = None
    ratio = g.compress_ratios[layer]
    if ratio:
        raw = b[f"idx_raw.{layer}"][:T]
        _gemv(e, blk + "indexer.k_proj.weight", x, raw[r0:], stream)
        tail, snap = b[f"tail.{layer}"], b[f"snap.{layer}"]
        qsa.indexer_append(tail, b[f"pooled.{layer}"], raw, b["positions"][:T], w.blk_f32(layer, "indexer.k_norm"),
                           g.eps, cos, sin, snapshot=snap, stream=stream)
        # a run writes no committed state (engine/state.py): the tail goes back to its snapshot at once, since a
        # window longer than ratio - n_past % ratio rows wraps over slots of committed positions
        _copy(tail, snap, snap.nbytes, stream)
        stamp(e, layer, "idx append", stream)
        qi_raw = b["qi_raw"][r0:T]
        _gemv(e, blk + "indexer.q_proj.weight", x, qi_raw, stream)
        qi = qsa.norm_rope(qi_raw.reshape(n, g.idx_heads, g.idx_dim), w.blk_f32(layer, "indexer.q_norm"), g.eps,
                           cos, sin, positions=pos, out=b["qi"][r0:T], stream=stream)
        stamp(e, layer, "idx-q", stream)
        nb = b[f"pooled.{layer}"].shape[0]
        scores = qsa.block_scores(qi, b[f"pooled.{layer}"], pos, ratio, out=_rows(b["scores"], n, nb),
                                  stream=stream)
        scratch = qsa.SelectScratch(_rows(b["sel_keys"], n, nb), _rows(b["sel_idx"], n, nb),
                                    _rows(b["sel_flags"], n, nb))
        cap = qsa.cell_capacity(ratio, g.idx_budget)
        cells, counts = qsa.select_cells(scores, pos, ratio, g.idx_budget, cells=_rows(b["cells"], n, cap),
                                         counts=b["counts"][:n], scratch=scratch, stream=stream)
        stamp(e, layer, "scores+topk", stream)
    att = qsa.attend_selected(qn, qg[:, :, d:], b[f"kc.{layer}"], b[f"vc.{layer}"], pos, cells=cells,
                              counts=counts, out=b["qa_att"][r0:T], stream=stream)
    stamp(e, layer, "attention", stream)
    _gemv(e, blk + "attn_output.weight", att, b["block_out"][r0:T], stream)
    stamp(e, layer, "out-proj", stream)


def _rows(buf, T: int, width: int):
    """A contiguous [T, width] view at the start of a [M, W >= width] buffer (layers may use fewer columns)."""
    flat = buf.reshape(-1)[:T * width]
    return flat.reshape(T, width)


def _moe(e, layer: int, x, T: int, stream):
    if e.tiers is not None:  # expert tiers (tiers.py): doorbell, VRAM/PCIe/CPU shares, combine
        e.tiers.record_moe(layer, T, stream)
        stamp(e, layer, "moe-tiers", stream)
        return
    b, w, g = e.buf, e.w, e.g
    blk = f"blk.{layer}."
    _gemv(e, blk + "ffn_gate_inp.weight", x, b["router"][:T], stream)
    ids, weights = moe.router_topk(b["router"][:T], g.n_expert_used, out_ids=b["route_ids"][:T],
                                   out_w=b["route_w"][:T], stream=stream)
    stamp(e, layer, "router", stream)
    names = [blk + f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")] + [blk + "ffn_gate_inp_shexp.weight"]
    raws = [w.raw(n) for n in names]
    moe.shared_expert(x, raws[0][0], raws[1][0], raws[2][0], raws[3][0], [r[1] for r in raws],
                      out=b["shared"][:T], scratch=moe.SharedScratch(b["sh_h"], b["sh_sg"]), split=split_k(b),
                      stream=stream)
    stamp(e, layer, "shared", stream)
    exps = [w.raw(blk + f"ffn_{p}_exps.weight") for p in ("gate", "up", "down")]
    moe.routed_experts(x, ids, weights, exps[0][0], exps[1][0], exps[2][0], [t for _, t in exps],
                       out=b["block_out"][:T], shared=b["shared"][:T],
                       scratch=moe.MoeScratch(b["moe_h"], b["moe_parts"], b["moe_gexp"], b["moe_gcnt"],
                                              b["moe_gent"]), stream=stream, mark=_marks(e, layer, "", stream))
    stamp(e, layer, "combine", stream)


def _ple(e, T: int, stream):
    b, w, g = e.buf, e.w, e.g
    p, layer = g.ple, g.ple.layer
    rows = ple.ngram_rows(b["tokens"][:T], b["ple_prev"], p.eos_token_id, b["ple_mult"], p.heads_per_ngram,
                          b["ple_sizes"], b["ple_offsets"], out=b["ple_rows"][:T], stream=stream)
    table, table_type = w.raw(PLE_TABLE)
    emb = embed.gather_rows(rows, table, table_type, p.head_dim, out=b["ple_emb"][:T], stream=stream)
    wk, kt = w.blk_raw(layer, "ple_key")
    wv, vt = w.blk_raw(layer, "ple_value")
    ple.ple_mix(b["R"][:T], emb, b["ple_history"], wk, wv, w.blk_f32(layer, "ple_norm_key"),
                w.blk_f32(layer, "ple_norm_query"), w.blk_f32(layer, "ple_norm_conv"), w.blk_f32(layer, "ple_conv1d"),
                p.dilation, g.eps, key_type=kt, value_type=vt, out=b["R"][:T], normed=b["ple_normed"][:T],
                work=ple.PLEWork(b["ple_key"], b["ple_value"], b["ple_gated"]), split=split_k(b), stream=stream)
    stamp(e, layer, "ple", stream)


def record_window(e, T: int, stream) -> None:
    b, g = e.buf, e.g
    head = g.n_layers  # the stamps' window row
    stamp(e, head, "begin", stream)
    tiers = e.tiers
    if tiers is not None and tiers.n_groups(T) == 2:  # --split: two token groups (split.py)
        from .split import record_split_window

        # stamped as a whole: per-stage stamps of interleaved groups would not be stages (the seed profiles
        # single-group windows only)
        stamper, e.stamper = e.stamper, None
        try:
            record_split_window(e, T, stream)
        finally:
            e.stamper = stamper
        stamp(e, head, "split-window", stream)
        return
    _inputs(e, T, stream)
    stamp(e, head, "embed", stream)
    if fused_hc():
        _record_layers_fused(e, T, stream)
        return
    for layer in range(g.n_layers):
        if layer:
            stamp(e, layer - 1, "gap", stream)
        if g.ple is not None and g.ple.layer == layer:
            _ple(e, T, stream)
        mixed, inj = _hc(e, f"blk.{layer}.hc_attn", T, True, stream, mark=_marks(e, layer, "hc0-", stream))
        stamp(e, layer, "hc-read0", stream)
        (_qsa if g.layer_is_attn[layer] else _gdn)(e, layer, mixed, T, stream)
        hyper.hc_write(b["R"][:T], b["block_out"][:T], inj, out=b["R"][:T], stream=stream)
        stamp(e, layer, "hc-write0", stream)
        mixed, inj = _hc(e, f"blk.{layer}.hc_ffn", T, True, stream, mark=_marks(e, layer, "hc1-", stream))
        stamp(e, layer, "hc-read1", stream)
        _moe(e, layer, mixed, T, stream)
        hyper.hc_write(b["R"][:T], b["block_out"][:T], inj, out=b["R"][:T], stream=stream)
        stamp(e, layer, "hc-write1", stream)
    if g.n_layers:
        stamp(e, g.n_layers - 1, "gap", stream)
    _head(e, T, stream)


def _record_layers_fused(e, T: int, stream) -> None:
    """The layers and the head with fused HC reads: each block's residual write (block_out weighted by the inj of
    the read before it) is applied by the next read's first kernel, except before the PLE layer, whose mix reads R
    (the write is launched on its own there)."""
    b, g = e.buf, e.g
    pending = False  # a block's write awaits the next read
    for layer in range(g.n_layers):
        if layer:
            stamp(e, layer - 1, "gap", stream)
        if g.ple is not None and g.ple.layer == layer:
            if pending:
                hyper.hc_write(b["R"][:T], b["block_out"][:T], b["inj"][:T], out=b["R"][:T], stream=stream)
                pending = False
            _ple(e, T, stream)
        mark = _marks(e, layer, "hc0-", stream)
        mixed, _ = _hc_fused(e, f"blk.{layer}.hc_attn", T, True, pending, stream, mark=mark)
        stamp(e, layer, "hc-read0", stream)
        (_qsa if g.layer_is_attn[layer] else _gdn)(e, layer, mixed, T, stream)
        mixed, _ = _hc_fused(e, f"blk.{layer}.hc_ffn", T, True, True, stream, mark=_marks(e, layer, "hc1-", stream))
        stamp(e, layer, "hc-read1", stream)
        _moe(e, layer, mixed, T, stream)
        pending = True
    if g.n_layers:
        stamp(e, g.n_layers - 1, "gap", stream)
    mixed, _ = _hc_fused(e, "output_hc", T, False, pending, stream)
    stamp(e, e.g.n_layers, "hc-out", stream)
    _head_after_read(e, mixed, T, stream)


def _inputs(e, T: int, stream) -> None:
    """Tokens and positions from mapped staging, the embedding, broadcast to the HC streams."""
    b, g = e.buf, e.g
    _copy(b["tokens"], e.stage.tokens.device, T * 8, stream)
    _copy(b["positions"], e.stage.positions.device, T * 4, stream)
    table, table_type = e.w.raw("token_embd.weight")
    embed.gather_rows(b["tokens"][:T].reshape(T, 1), table, table_type, g.n_embd, out=b["emb"][:T], stream=stream)
    hyper.broadcast_streams(b["emb"][:T], g.hc, out=b["R"][:T], stream=stream)


def _head(e, T: int, stream) -> None:
    """Final HC read, head GEMV, greedy ids into mapped staging."""
    mixed, _ = _hc(e, "output_hc", T, False, stream)
    stamp(e, e.g.n_layers, "hc-out", stream)
    _head_after_read(e, mixed, T, stream)


def _head_after_read(e, mixed, T: int, stream) -> None:
    """Head GEMV of the final HC read's rows, greedy ids into mapped staging."""
    b = e.buf
    _gemv(e, "output.weight", mixed, b["logits"][:T], stream)
    stamp(e, e.g.n_layers, "lm-head", stream)
    # the argmax pass also flags rows holding NaN/Inf, straight into mapped host memory (no extra node)
    sampling.argmax_rows(b["logits"][:T], out=b["ids"][:T], scratch=argmax_scratch(b), stream=stream,
                         nonfinite=e.stage.out_nonfinite.device[:T])
    _copy(e.stage.out_ids.device, b["ids"], T * 4, stream)
    stamp(e, e.g.n_layers, "argmax", stream)  # the window's end stamp (last node)


def record_commit(e, stream) -> None:
    """Advance every state to the first n_keep rows of the last window (n_keep staged by the host)."""
    b, w, g = e.buf, e.w, e.g
    _copy(b["n_keep"], e.stage.n_keep.device, 4, stream)
    n_keep = b["n_keep"]
    for layer in g.gdn_layers:
        gdn.gdn_conv_commit(b[f"conv.{layer}"], b[f"qkv.{layer}"], None, n_keep_dev=n_keep, stream=stream)
        gdn.gdn_commit_state(b[f"S.{layer}"], b[f"q.{layer}"], b[f"k.{layer}"], b[f"v.{layer}"], b[f"g.{layer}"],
                             b[f"beta.{layer}"], None, n_keep_dev=n_keep, stream=stream)
    for layer in g.attn_layers:
        if g.compress_ratios[layer]:
            qsa.indexer_commit(b[f"tail.{layer}"], b[f"pooled.{layer}"], b[f"snap.{layer}"], b[f"idx_raw.{layer}"],
                               b["positions"], None, w.blk_f32(layer, "indexer.k_norm"), g.eps, b["cos"], b["sin"],
                               n_keep_dev=n_keep, stream=stream)
    if g.ple is not None:
        ple.ple_history_commit(b["ple_history"], b["ple_normed"], None, n_keep_dev=n_keep, stream=stream)
        ple.ple_prev_commit(b["ple_prev"], b["tokens"], None, n_keep_dev=n_keep, stream=stream)
