"""The launches of one verify window and of the commit; _LayerRecorder holds the one layer sequence (the order of
ReferenceEngine._layer) of every variant (every expert in VRAM, or expert tiers); the GEMV kernels of each T as
launch_util.window_path chooses.

Both recorders only launch kernels on preallocated buffers, so the same calls run eagerly or under capture.
Per-window values (tokens, positions, n_keep) are read by the kernels from device buffers that the recorded
graph fills from mapped staging first; nothing window-specific is baked into a graph except T.

Profiling: `stamp(e, layer, stage, stream)` marks the end of each stage (names in strata_cli/engine/stage_timing.py).
It launches a stamp only while the engine records its profiling variant (e.stamper set); the normal graph has
no stamp node. What each stage reads is tallied meanwhile from the launches' arguments (stamps.record_profiled,
engine/stage_bytes.py): nothing here names a weight's bytes.
"""

from __future__ import annotations

from ...gpu import launch_embed as embed
from ...gpu import launch_gdn as gdn
from ...gpu import launch_gemv
from ...gpu import launch_hyper as hyper
from ...gpu import launch_moe as moe
from ...gpu import launch_ple as ple
from ...gpu import launch_qsa as qsa
from ...gpu import launch_sampling as sampling
from ...gpu.launch_util import recording_path
from ...gpu.runtime import check, cudart
from ...model.names import PLE_TABLE
from .buffers import argmax_scratch, split_k
from .weights import KVQ, PLE_KV, QKVZ


def copy_async(dst, src, nbytes: int, stream) -> None:
    """An async device copy on stream (one memcpy node)."""
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


# What a read's pending write adds to R (the previous block's output): nothing, block_out (a mixer's out-projection,
# the tiers' combine), a CombineWrite: the routed experts' combine, which the read's first kernel computes (_moe
# returns it), or a PleMix: the PLE's mix (with the previous layer's write), which the PLE layer's first read's
# first kernel computes (_ple returns it)
NO_WRITE, BLOCK_OUT = None, "block_out"


def _pending(e, pending, r0: int, r1: int):
    b = e.buf
    if isinstance(pending, ple.PleMix):  # the PLE layer's mix (_ple), whole window only
        return pending
    if isinstance(pending, hyper.CombineWrite):
        return pending
    return (b["block_out"][r0:r1], b["inj"][r0:r1]) if pending == BLOCK_OUT else None


def _hc(e, prefix: str, T: int, stream, mark=None, pending=NO_WRITE):
    """HC read of rows [0, T); pending: the write of
    those rows' block output with the last read's inj goes into R first (in the norm's kernel). The read's inject
    gates (if any) go to inj, which held the pending write's."""
    b = e.buf
    w = e.w.hc(prefix)
    scratch = hyper.HcScratch(b["hc_xn"], b["hc_dn"])
    return hyper.hc_read(b["R"][:T], w, e.g.eps, pending=_pending(e, pending, 0, T), out_mixed=b["mixed"][:T],
                         out_inj=b["inj"][:T] if w.n_inj else None, scratch=scratch, split=split_k(b),
                         stream=stream, mark=mark)


def _write(e, r0: int, r1: int, stream, pending) -> None:
    """The pending write of rows [r0, r1) on its own (hc_write, computing the experts' combine when it is theirs):
    at the end of a stage of the layer split, which hands R on whole."""
    R = e.buf["R"][r0:r1]
    hyper.hc_write(R, _pending(e, pending, r0, r1), out=R, stream=stream)


def gemv_weight(e, name: str, x, out, stream):
    """out = x @ W^T for the engine's weight `name` (one GEMV node)."""
    raw, ggml_type = e.w.raw(name)
    return launch_gemv.gemv(raw, ggml_type, x.shape[1], x, out=out, split=split_k(e.buf), stream=stream)


def qkv_rows(e, layer: int):
    """The qkv rows [M, conv_dim] a GDN layer's window writes and its commit reads: the leading columns of its
    [M, conv_dim + z] buffer when qkv and z are one GEMV (the row stride the kernels take), else the buffer's
    leading M * conv_dim values as contiguous rows."""
    buf, Ch = e.buf[f"qkv.{layer}"], e.g.conv_dim
    return buf[:, :Ch] if e.w.stack(layer, QKVZ) is not None else _rows(buf, buf.shape[0], Ch)


def _gdn(e, layer: int, x, T: int, stream):
    """GDN of rows [0, T), x = their mixed rows: the qkv and z projections (one GEMV where they stack), gdn_mix
    (conv + split, gates, delta rule, gated norm in one launch; alpha/beta GEMVs first for types it does not decode)
    and the out projection."""
    b, w, g = e.buf, e.w, e.g
    blk, n = f"blk.{layer}.", T
    qkv = qkv_rows(e, layer)[:T]
    qkvz = w.stack(layer, QKVZ)
    if qkvz is not None:  # one GEMV: rows [qkv | z] of the layer's buffer
        rows = b[f"qkv.{layer}"]
        launch_gemv.gemv(*qkvz[:2], x.shape[1], x, out=rows[:T], split=split_k(b), stream=stream)
        z = rows[:T, g.conv_dim:]
        stamp(e, layer, "qkv", stream)
    else:
        gemv_weight(e, blk + "attn_qkv.weight", x, qkv, stream)
        stamp(e, layer, "qkv", stream)
        z = b["gdn_z"][:T].reshape(n, g.ssm_nv, g.ssm_dv)
        gemv_weight(e, blk + "attn_gate.weight", x, b["gdn_z"][:T], stream)
        stamp(e, layer, "z", stream)
    alpha_w, beta_w = w.raw(blk + "ssm_alpha.weight"), w.raw(blk + "ssm_beta.weight")
    ab_raw = ab_proj = None
    if alpha_w[1] in gdn.AB_TYPES and beta_w[1] in gdn.AB_TYPES:
        ab_raw = (*alpha_w, *beta_w)
    else:
        ab_proj = (b["gdn_alpha"][:T], b["gdn_beta_in"][:T])
        gemv_weight(e, blk + "ssm_alpha.weight", x, ab_proj[0], stream)
        gemv_weight(e, blk + "ssm_beta.weight", x, ab_proj[1], stream)
        stamp(e, layer, "ab", stream)
    y = gdn.gdn_mix(qkv, b[f"conv.{layer}"], w.blk_f32(layer, "ssm_conv1d"), b[f"S.{layer}"], x,
                    w.blk_f32(layer, "ssm_dt.bias"), w.blk_f32(layer, "ssm_a"), z, w.blk_f32(layer, "ssm_norm"),
                    g.eps, g.ssm_nk,
                    g.ssm_dk, g.ssm_nv, g.ssm_dv, ab_raw=ab_raw, ab_proj=ab_proj, q=b[f"q.{layer}"][:T],
                    k=b[f"k.{layer}"][:T], v=b[f"v.{layer}"][:T], g=b[f"g.{layer}"][:T], beta=b[f"beta.{layer}"][:T],
                    out=b["gdn_y"][:T], stream=stream)
    stamp(e, layer, "gdn-mix", stream)
    gemv_weight(e, blk + "ssm_out.weight", y.reshape(n, -1), b["block_out"][:T], stream)
    stamp(e, layer, "out-proj", stream)


def _qsa(e, layer: int, x, T: int, stream):
    """QSA of rows [0, T), x = their mixed rows: the k, v, q (+ gate) and indexer q / k projections (one GEMV where
    they stack), qsa_mix (k/v into the cache, the norms and ropes, the window's pooled blocks, block scores, cell
    selection and attention in one launch) and the out projection."""
    b, w, g = e.buf, e.w, e.g
    blk, d, pos = f"blk.{layer}.", g.head_dim, b["positions"][:T]
    k, v, qg, qi_raw, ik = _qsa_projections(e, layer, x, T, stream)
    ratio = g.compress_ratios[layer]
    indexer = None
    if ratio:
        raw = b[f"idx_raw.{layer}"]  # the window's raw keys, which the commit re-appends
        if qi_raw is None:  # not in the stack
            qi_raw = b["qi_raw"][:T]
            gemv_weight(e, blk + "indexer.q_proj.weight", x, qi_raw, stream)
        if ik is None:  # not in the stack: projected straight into the commit's rows
            ik = raw[:T]
            gemv_weight(e, blk + "indexer.k_proj.weight", x, ik, stream)
            raw = None
        nb = b[f"pooled.{layer}"].shape[0]
        cap = qsa.cell_capacity(ratio, g.idx_budget)
        scratch = qsa.SelectScratch(_rows(b["scores"], T, nb), _rows(b["cells"], T, cap), b["counts"][:T],
                                    *(_rows(b[name], T, nb) for name in ("sel_keys", "sel_idx", "sel_flags")),
                                    b["sel_done"][:T], b["sel_ready"][:T], b["sel_seen"][:T], b["sel_ticket"])
        indexer = qsa.Indexer(qi_raw.reshape(T, g.idx_heads, g.idx_dim), w.blk_f32(layer, "indexer.q_norm"), ik,
                              w.blk_f32(layer, "indexer.k_norm"), b[f"tail.{layer}"], b[f"pooled.{layer}"],
                              g.idx_budget, raw=raw, scratch=scratch)
    stamp(e, layer, "kvq", stream)
    # a run writes no committed state (engine/state.py): the tail and pooled keys are only read, the window's
    # blocks pooled by the launch itself
    att = qsa.qsa_mix(k, v, qg[:, :, :d], qg[:, :, d:], w.blk_f32(layer, "attn_k_norm"),
                      w.blk_f32(layer, "attn_q_norm"), b[f"kc.{layer}"], b[f"vc.{layer}"], b["cos"], b["sin"], pos,
                      g.eps, indexer=indexer, out=b["qa_att"][:T], stream=stream)
    stamp(e, layer, "qsa-mix", stream)
    gemv_weight(e, blk + "attn_output.weight", att, b["block_out"][:T], stream)
    stamp(e, layer, "out-proj", stream)


def _qsa_projections(e, layer: int, x, T: int, stream):
    """The k, v, q (+ gate) and, with the indexer, indexer-q and indexer-k projections of rows [0, T): one GEMV
    where their weights stack (views of its [k | v | q | indexer q | indexer k] rows), else a GEMV each (no indexer
    q / k: None, projected later). Returns k [n, Hk, d], v [n, Hk, d], qg [n, H, 2d], qi_raw [n, idx_dim * heads]
    or None, ik [n, idx_dim] or None."""
    b, w, g = e.buf, e.w, e.g
    blk, d, n = f"blk.{layer}.", g.head_dim, T
    kv, qw = g.n_head_kv * d, g.n_head * 2 * d
    stacked = w.stack(layer, KVQ)
    if stacked is None:
        for name, buf in (("attn_k", "qa_k"), ("attn_v", "qa_v"), ("attn_q", "qa_qg")):
            gemv_weight(e, blk + name + ".weight", x, b[buf][:T], stream)
        return (b["qa_k"][:T].reshape(n, g.n_head_kv, d), b["qa_v"][:T].reshape(n, g.n_head_kv, d),
                b["qa_qg"][:T].reshape(n, g.n_head, 2 * d), None, None)
    raw, ggml_type, width = stacked
    rows = _rows(b["qa_kvq"], T, width)
    launch_gemv.gemv(raw, ggml_type, x.shape[1], x, out=rows, split=split_k(b), stream=stream)
    qi_raw = ik = None
    if width > 2 * kv + qw:  # the indexer's q and k rows follow
        qi_end = 2 * kv + qw + g.idx_heads * g.idx_dim
        qi_raw, ik = rows[:, 2 * kv + qw:qi_end], rows[:, qi_end:qi_end + g.idx_dim]
    return (rows[:, :kv].reshape(n, g.n_head_kv, d), rows[:, kv:2 * kv].reshape(n, g.n_head_kv, d),
            rows[:, 2 * kv:2 * kv + qw].reshape(n, g.n_head, 2 * d), qi_raw, ik)


def _rows(buf, T: int, width: int):
    """A contiguous [T, width] view at the start of a [M, W >= width] buffer (layers may use fewer columns)."""
    flat = buf.reshape(-1)[:T * width]
    return flat.reshape(T, width)


def _moe(e, layer: int, x, T: int, stream):
    """Router, shared expert and routed experts, every expert in VRAM; returns the CombineWrite of their combine,
    which the next read applies with its residual write. Where the shared expert joins the routed tensors
    (DeviceWeights.shared_expert_id) it is one more entry of every row, weighted by its gate: no launches of its own."""
    b, w, g = e.buf, e.w, e.g
    blk = f"blk.{layer}."
    scratch = moe.MoeScratch(b["moe_h"], b["moe_parts"], b["moe_gexp"], b["moe_gcnt"], b["moe_gent"])
    # the router's last block also groups the entries by expert (no moe_group node)
    groups = (scratch.g_expert, scratch.g_count, scratch.g_entries)
    gate = w.raw(blk + "ffn_gate_inp_shexp.weight")
    sg = b["sh_sg"][:T] if gate[1] in moe.SG_TYPES else None  # the router's launch computes the shared gate
    router, router_type = w.raw(blk + "ffn_gate_inp.weight")
    fused = moe.router_fuses(router_type, g.n_expert)
    shared_id = w.shared_expert_id(layer) if fused and sg is not None else None
    if shared_id is not None:  # ids and weights of K + 1 slots: the last the shared expert's
        ids, weights = moe.router_gemv_topk(x, router, router_type, g.n_expert_used, groups, b["route_done"],
                                            out_logits=b["router"][:T], scalar_gate=(*gate, sg), shared_id=shared_id,
                                            out_ids=b["route_ids1"][:T], out_w=b["route_w1"][:T], stream=stream)
        stamp(e, layer, "router", stream)
    else:
        out = dict(out_ids=b["route_ids"][:T], out_w=b["route_w"][:T], stream=stream)
        scalar_gate = None if sg is None else (*gate, sg)
        if fused:  # the router's GEMV in the same launch
            ids, weights = moe.router_gemv_topk(x, router, router_type, g.n_expert_used, groups, b["route_done"],
                                                out_logits=b["router"][:T], scalar_gate=scalar_gate, **out)
        else:
            gemv_weight(e, blk + "ffn_gate_inp.weight", x, b["router"][:T], stream)
            ids, weights = moe.router_topk(b["router"][:T], g.n_expert_used, groups=groups, done=b["route_done"],
                                           scalar_gate=None if sg is None else (x, *scalar_gate), **out)
        stamp(e, layer, "router", stream)
        raws = [w.raw(blk + f"ffn_{p}_shexp.weight") for p in ("gate", "up", "down")] + [gate]
        moe.shared_expert(x, raws[0][0], raws[1][0], raws[2][0], raws[3][0], [r[1] for r in raws],
                          out=b["shared"][:T], scratch=moe.SharedScratch(b["sh_h"], b["sh_sg"]), split=split_k(b),
                          stream=stream, sg=sg)
        stamp(e, layer, "shared", stream)
    if e.route_tap is not None:  # a counting run's graph (engine/routing.RouteTap): the layer's picks kept
        copy_async(e.route_tap.rows(layer, ids.shape), ids, ids.nbytes, stream)
    exps = [w.raw(blk + f"ffn_{p}_exps.weight") for p in ("gate", "up", "down")]
    moe.routed_parts(x, ids, weights, exps[0][0], exps[1][0], exps[2][0], [t for _, t in exps], scratch=scratch,
                     grouped=True, stream=stream)
    stamp(e, layer, "experts", stream)
    return hyper.CombineWrite(b["moe_parts"], weights, None if shared_id is not None else b["shared"][:T],
                              b["inj"][:T])


def _ple_weights(e, layer: int) -> dict:
    """ple_kv's projection arguments: the stacked [key; value] matrix (one GEMV) where DeviceWeights stacks them,
    else the two matrices and their types."""
    kv = e.w.stack(layer, PLE_KV)
    if kv is not None:
        return dict(w_key=None, w_value=None, kv=kv[:2])
    (wk, kt), (wv, vt) = e.w.blk_raw(layer, "ple_key"), e.w.blk_raw(layer, "ple_value")
    return dict(w_key=wk, w_value=wv, key_type=kt, value_type=vt)


def _ple_inputs(e, T: int, stream):
    """The PLE's part that reads the window's tokens only (the window's inputs section): the hashed n-gram table rows
    gathered (one launch for tables of the element-wise types) and their key / value projection (one GEMV where
    the matrices stack). Returns the (key, value) rows the PLE layer's mix reads."""
    b, p = e.buf, e.g.ple
    table, table_type = e.w.raw(PLE_TABLE)
    emb = ple.ngram_gather(b["tokens"][:T], b["ple_prev"], p.eos_token_id, b["ple_mult"], p.heads_per_ngram,
                           b["ple_sizes"], b["ple_offsets"], table, table_type, p.head_dim, out=b["ple_emb"][:T],
                           rows=b["ple_rows"][:T], stream=stream)
    return ple.ple_kv(emb, e.g.hc, work=ple.PLEWork(b["ple_key"], b["ple_value"]), split=split_k(b), stream=stream,
                      **_ple_weights(e, p.layer))


def _ple(e, T: int, rows, pending=NO_WRITE):
    """The PLE layer's mix as the pending write of its first read (no launch of its own: that read's first kernel
    is ple.cu ple_mix_norm); rows: _ple_inputs' (key, value); pending: the previous layer's write, applied to R
    first by the same kernel."""
    b, w, g = e.buf, e.w, e.g
    p, layer = g.ple, g.ple.layer
    return ple.PleMix(*rows, b["ple_history"], w.blk_f32(layer, "ple_norm_key"), w.blk_f32(layer, "ple_norm_query"),
                      w.blk_f32(layer, "ple_norm_conv"), w.blk_f32(layer, "ple_conv1d"), p.dilation,
                      b["ple_normed"][:T], pending=_pending(e, pending, 0, T), sync=b["ple_sync"])


class _LayerRecorder:
    """The one layer sequence of every window variant: every block's residual write is applied by the next HC read's
    first kernel (the pending write); a GDN mixer is 3 nodes (_gdn; 4 where qkv and z differ in type). Per layer:

        pre(l)  = HC read (attn; the previous layer's MoE write first, with every expert in VRAM also the experts'
                     combine; at the PLE layer the PLE's mix too), mixer, HC read (ffn; the mixer's write first),
                     MoE (router, shared expert, routed experts) or the tiers' front: router, doorbell, shared
                     expert, VRAM experts
        post(l) = the tiers' back: waits, PCIe experts, combine

    The PLE's n-gram rows and their key / value projection read the tokens only: they go into the window's inputs
    section (_inputs), before layer 0; the rest of the PLE (the previous layer's write, the gate, the conv step) is
    the first kernel of the PLE layer's first read (a PleMix pending)."""

    def __init__(self, e, T: int, stream):
        self.e, self.T, self.stream = e, T, stream
        self.moe_write = BLOCK_OUT  # the tiers' post combines into block_out; else the last _moe's CombineWrite
        self.ple_rows = None  # the PLE's (key, value) rows, from the inputs section (_inputs)

    def pre(self, layer: int) -> None:
        e, g, T, stream = self.e, self.e.g, self.T, self.stream
        if layer:
            stamp(e, layer - 1, "gap", stream)
        pending = self.moe_write if layer > self.e.layers[0] else NO_WRITE  # the previous layer's MoE write
        if g.ple is not None and g.ple.layer == layer:  # the read's first kernel is the PLE's mix (the write first)
            pending = _ple(e, T, self.ple_rows, pending)
        mixed, _ = _hc(e, f"blk.{layer}.hc_attn", T, stream, mark=_marks(e, layer, "hc0-", stream), pending=pending)
        stamp(e, layer, "hc-read0", stream)
        if g.layer_is_attn[layer]:
            _qsa(e, layer, mixed, T, stream)
        else:
            _gdn(e, layer, mixed, T, stream)
        mixed, _ = _hc(e, f"blk.{layer}.hc_ffn", T, stream, mark=_marks(e, layer, "hc1-", stream), pending=BLOCK_OUT)
        stamp(e, layer, "hc-read1", stream)
        if e.tiers is not None:  # expert tiers (tiers.py): router, doorbell, shared expert, VRAM share
            e.tiers.pre(layer, 0, 0, T, 1, stream)
        else:
            self.moe_write = _moe(e, layer, mixed, T, stream)

    def post(self, layer: int) -> None:
        e = self.e
        if e.tiers is None:
            return  # _moe ran whole in pre
        # the waits for the host's shares, the PCIe share, the combine into block_out
        e.tiers.post(layer, 0, 0, self.T, 1, self.stream)
        stamp(e, layer, "moe-tiers", self.stream)

    def record(self) -> None:
        """pre(0) | post(0) pre(1) | ... | post(L-1) | head. A stage of the layer split runs its layers [lo, hi)
        alone: from the embedding or the residual stack the previous stage left in R, to the head or (hi < L) the
        whole stack in R for the next stage."""
        e, L, T, stream = self.e, self.e.g.n_layers, self.T, self.stream
        lo, hi = e.layers
        self.ple_rows = _inputs(e, T, stream, embed_rows=lo == 0)
        stamp(e, L, "embed", stream)
        self.pre(lo)
        for layer in range(lo, hi):
            self.post(layer)
            if layer + 1 < hi:
                self.pre(layer + 1)
        if hi > lo:
            stamp(e, hi - 1, "gap", stream)
        if hi < L:  # the hand-off holds R whole: the last layer's write, awaiting the next read, goes in now
            if hi > lo:
                _write(e, 0, T, stream, self.moe_write)
            return
        mixed, _ = _hc(e, "output_hc", T, stream, pending=self.moe_write if hi > lo else NO_WRITE)
        stamp(e, L, "hc-out", stream)
        _head_after_read(e, mixed, T, stream)


def record_window(e, T: int, stream) -> None:
    """The T-row window of engine e (its launch variant e.window_paths(T))."""
    stamp(e, e.g.n_layers, "begin", stream)  # the stamps' window row
    with recording_path(e.window_paths(T)):
        _LayerRecorder(e, T, stream).record()


def _inputs(e, T: int, stream, embed_rows: bool = True):
    """Tokens and positions from mapped staging; where the engine's layer range holds the PLE layer, its n-gram rows
    and their key / value projection (_ple_inputs: they read the tokens only), returned (else None); the embedding,
    broadcast to the HC streams (embed_rows False: a later stage of the layer split, whose R the previous stage's
    hand-off filled)."""
    b, g = e.buf, e.g
    copy_async(b["tokens"], e.stage.tokens.device, T * 8, stream)
    copy_async(b["positions"], e.stage.positions.device, T * 4, stream)
    rows = None
    if g.ple is not None and e.layers[0] <= g.ple.layer < e.layers[1]:
        rows = _ple_inputs(e, T, stream)
        stamp(e, g.n_layers, "ple", stream)
    if embed_rows:
        table, table_type = e.w.raw("token_embd.weight")
        embed.gather_rows(b["tokens"][:T].reshape(T, 1), table, table_type, g.n_embd, out=b["emb"][:T],
                          stream=stream)
        hyper.broadcast_streams(b["emb"][:T], g.hc, out=b["R"][:T], stream=stream)
    return rows


def _head_after_read(e, mixed, T: int, stream) -> None:
    """Head GEMV of the final HC read's rows, greedy ids into mapped staging."""
    b = e.buf
    gemv_weight(e, "output.weight", mixed, b["logits"][:T], stream)
    stamp(e, e.g.n_layers, "lm-head", stream)
    # the argmax pass also flags rows holding NaN/Inf, straight into mapped host memory (no extra node)
    sampling.argmax_rows(b["logits"][:T], out=b["ids"][:T], scratch=argmax_scratch(b), stream=stream,
                         nonfinite=e.stage.out_nonfinite.device[:T])
    copy_async(e.stage.out_ids.device, b["ids"], T * 4, stream)
    stamp(e, e.g.n_layers, "argmax", stream)  # the window's end stamp (last node)


def record_commit(e, stream) -> None:
    """Advance every state to the first n_keep rows of the last window (n_keep staged by the host)."""
    b, w, g = e.buf, e.w, e.g
    copy_async(b["n_keep"], e.stage.n_keep.device, 4, stream)
    n_keep = b["n_keep"]
    for layer in e.gdn_layers:
        gdn.gdn_conv_commit(b[f"conv.{layer}"], qkv_rows(e, layer), None, n_keep_dev=n_keep, stream=stream)
        gdn.gdn_commit_state(b[f"S.{layer}"], b[f"q.{layer}"], b[f"k.{layer}"], b[f"v.{layer}"], b[f"g.{layer}"],
                             b[f"beta.{layer}"], None, n_keep_dev=n_keep, stream=stream)
    for layer in e.attn_layers:
        if g.compress_ratios[layer]:
            qsa.indexer_commit(b[f"tail.{layer}"], b[f"pooled.{layer}"], b[f"idx_raw.{layer}"], b["positions"], None,
                               w.blk_f32(layer, "indexer.k_norm"), g.eps, b["cos"], b["sin"], n_keep_dev=n_keep,
                               stream=stream)
    if e.has_ple:
        ple.ple_history_commit(b["ple_history"], b["ple_normed"], None, n_keep_dev=n_keep, stream=stream)
        ple.ple_prev_commit(b["ple_prev"], b["tokens"], None, n_keep_dev=n_keep, stream=stream)
