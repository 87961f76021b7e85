"""The split window (--split with expert tiers): the rows in two token groups A = [0, ceil(T/2)) and
B = the rest, recorded in the order

    pre(0,A) pre(0,B) | post(0,A) pre(1,A) | post(0,B) pre(1,B) | ... | post(L-1,A) | post(L-1,B) | head

so that the host computes one group's CPU experts while the GPU runs the other group. pre(l,g) = [PLE] HC read,
mixer, HC write, HC read, router, doorbell, shared expert, VRAM experts; post(l,g) = the waits, PCIe experts,
combine, HC write. B's mixer reads what A's stored (GDN rows, K/V cells, indexer keys): window.py's _gdn/_qsa
take the row range. The PLE runs its rows sequentially over the history, so B reruns rows [0, r1) on a saved
copy of A's input rows and keeps only its own outputs.
"""

from __future__ import annotations

from ...gpu import launch_embed as embed
from ...gpu import launch_hyper as hyper
from ...gpu import launch_ple as ple
from ...model.names import PLE_TABLE
from .buffers import split_k
from .window import _copy, _gdn, _hc, _head, _inputs, _qsa


def _ple_group(e, T: int, r0: int, r1: int, stream) -> None:
    b, w, g = e.buf, e.w, e.g
    p, layer = g.ple, g.ple.layer
    if r0 == 0:  # the gathered PLE rows of the whole window (they depend on tokens only)
        rows = ple.ngram_rows(b["tokens"][:T], b["ple_prev"], p.eos_token_id, b["ple_mult"], p.heads_per_ngram,
                              b["ple_sizes"], b["ple_offsets"], out=b["ple_rows"][:T], stream=stream)
        table, table_type = w.raw(PLE_TABLE)
        embed.gather_rows(rows, table, table_type, p.head_dim, out=b["ple_emb"][:T], stream=stream)
    saved, mixed_out = b["split_ple_in"], b["split_ple_out"]
    row_bytes = saved[0].nbytes
    _copy(saved[r0:r1], b["R"][r0:r1], (r1 - r0) * row_bytes, stream)
    wk, kt = w.blk_raw(layer, "ple_key")
    wv, vt = w.blk_raw(layer, "ple_value")
    ple.ple_mix(saved[:r1], b["ple_emb"][:r1], b["ple_history"], wk, wv, w.blk_f32(layer, "ple_norm_key"),
                w.blk_f32(layer, "ple_norm_query"), w.blk_f32(layer, "ple_norm_conv"),
                w.blk_f32(layer, "ple_conv1d"),
                p.dilation, g.eps, key_type=kt, value_type=vt, out=mixed_out[:r1], normed=b["ple_normed"][:r1],
                work=ple.PLEWork(b["ple_key"], b["ple_value"], b["ple_gated"]), split=split_k(b), stream=stream)
    _copy(b["R"][r0:r1], mixed_out[r0:r1], (r1 - r0) * row_bytes, stream)


def record_split_window(e, T: int, stream) -> None:
    b, g, tiers = e.buf, e.g, e.tiers
    groups = tiers.groups(T)
    G = len(groups)

    def pre(layer: int, grp: int) -> None:
        r0, n = groups[grp]
        r1 = r0 + n
        if g.ple is not None and g.ple.layer == layer:
            _ple_group(e, T, r0, r1, stream)
        mixed, inj = _hc(e, f"blk.{layer}.hc_attn", r1, True, stream, r0)
        (_qsa if g.layer_is_attn[layer] else _gdn)(e, layer, mixed, r1, stream, r0)
        hyper.hc_write(b["R"][r0:r1], b["block_out"][r0:r1], inj, out=b["R"][r0:r1], stream=stream)
        _hc(e, f"blk.{layer}.hc_ffn", r1, True, stream, r0)
        tiers.pre(layer, grp, r0, n, G, stream)

    def post(layer: int, grp: int) -> None:
        r0, n = groups[grp]
        r1 = r0 + n
        tiers.post(layer, grp, r0, n, G, stream)
        hyper.hc_write(b["R"][r0:r1], b["block_out"][r0:r1], b["inj"][r0:r1], out=b["R"][r0:r1], stream=stream)

    _inputs(e, T, stream)
    for grp in range(G):
        pre(0, grp)
    for layer in range(g.n_layers):
        for grp in range(G):
            post(layer, grp)
            if layer + 1 < g.n_layers:
                pre(layer + 1, grp)
    _head(e, T, stream)
