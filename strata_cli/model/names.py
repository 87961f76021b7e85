"""The qwen4exp tensor name table: every tensor the converter writes, with its GGML shape (ne0 first).

ne0 is the contiguous (input) axis: a weight `[ne0=in, ne1=out]` is read as numpy `(out, in)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .geometry import Geometry


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shapes: tuple[tuple[int, ...], ...]  # accepted GGML shapes; the first is the canonical one
    group: str  # for `strata info`: embed / head / hc / gdn / qsa / moe / ple

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shapes[0]


def _hc_half(prefix: str, g: Geometry, inject: bool) -> list[TensorSpec]:
    specs = [
        TensorSpec(f"{prefix}_norm.weight", ((g.hc_dim,),), "hc"),
        TensorSpec(f"{prefix}_down.weight", ((g.hc_dim, g.hc_lowrank),), "hc"),
        TensorSpec(f"{prefix}_up.weight", ((g.hc_lowrank, g.hc_dim),), "hc"),
    ]
    if inject:
        specs.append(TensorSpec(f"{prefix}_inject.weight", ((g.hc_dim, g.hc),), "hc"))
    return specs


def layer_tensors(g: Geometry, layer: int) -> list[TensorSpec]:
    b = f"blk.{layer}."
    D, E = g.n_embd, g.n_expert
    specs = _hc_half(b + "hc_attn", g, True) + _hc_half(b + "hc_ffn", g, True)
    specs += [
        TensorSpec(b + "ffn_gate_inp.weight", ((D, E),), "moe"),
        TensorSpec(b + "ffn_gate_inp_shexp.weight", ((D, 1), (D,)), "moe"),
        TensorSpec(b + "ffn_gate_shexp.weight", ((D, g.n_ff_shexp),), "moe"),
        TensorSpec(b + "ffn_up_shexp.weight", ((D, g.n_ff_shexp),), "moe"),
        TensorSpec(b + "ffn_down_shexp.weight", ((g.n_ff_shexp, D),), "moe"),
        TensorSpec(b + "ffn_gate_exps.weight", ((D, g.n_ff_exp, E),), "moe"),
        TensorSpec(b + "ffn_up_exps.weight", ((D, g.n_ff_exp, E),), "moe"),
        TensorSpec(b + "ffn_down_exps.weight", ((g.n_ff_exp, D, E),), "moe"),
    ]
    if g.layer_is_attn[layer]:
        qd, kvd = g.n_head * g.head_dim, g.n_head_kv * g.head_dim
        specs += [
            TensorSpec(b + "attn_q.weight", ((D, 2 * qd),), "qsa"),  # per head: [q | gate]
            TensorSpec(b + "attn_k.weight", ((D, kvd),), "qsa"),
            TensorSpec(b + "attn_v.weight", ((D, kvd),), "qsa"),
            TensorSpec(b + "attn_output.weight", ((qd, D),), "qsa"),
            TensorSpec(b + "attn_q_norm.weight", ((g.head_dim,),), "qsa"),
            TensorSpec(b + "attn_k_norm.weight", ((g.head_dim,),), "qsa"),
            TensorSpec(b + "indexer.q_proj.weight", ((D, g.idx_heads * g.idx_dim),), "qsa"),
            TensorSpec(b + "indexer.k_proj.weight", ((D, g.idx_dim),), "qsa"),
            TensorSpec(b + "indexer.q_norm.weight", ((g.idx_dim,),), "qsa"),
            TensorSpec(b + "indexer.k_norm.weight", ((g.idx_dim,),), "qsa"),
        ]
    else:
        nv = g.ssm_nv
        specs += [
            TensorSpec(b + "attn_qkv.weight", ((D, g.conv_dim),), "gdn"),
            TensorSpec(b + "attn_gate.weight", ((D, g.ssm_inner),), "gdn"),
            TensorSpec(b + "ssm_alpha.weight", ((D, nv),), "gdn"),
            TensorSpec(b + "ssm_beta.weight", ((D, nv),), "gdn"),
            TensorSpec(b + "ssm_dt.bias", ((nv,),), "gdn"),
            TensorSpec(b + "ssm_a", ((nv,),), "gdn"),
            TensorSpec(b + "ssm_conv1d.weight", ((g.conv_kernel, g.conv_dim),), "gdn"),
            TensorSpec(b + "ssm_norm.weight", ((g.ssm_dv,),), "gdn"),
            TensorSpec(b + "ssm_out.weight", ((g.ssm_inner, D),), "gdn"),
        ]
    if g.ple is not None and g.ple.layer == layer:
        p = g.ple
        specs += [
            TensorSpec(b + "ple_key.weight", ((p.embed_dim, g.hc_dim),), "ple"),
            TensorSpec(b + "ple_value.weight", ((p.embed_dim, D),), "ple"),
            TensorSpec(b + "ple_norm_key.weight", ((g.hc_dim,),), "ple"),
            TensorSpec(b + "ple_norm_query.weight", ((g.hc_dim,),), "ple"),
            TensorSpec(b + "ple_norm_conv.weight", ((g.hc_dim,),), "ple"),
            TensorSpec(b + "ple_conv1d.weight", ((p.conv_kernel, g.hc_dim),), "ple"),
        ]
    return specs


def ple_table_rows(g: Geometry) -> int:
    """Rows the hashed n-gram table needs (the file may pad past this)."""
    assert g.ple is not None
    return g.ple.head_offsets[-1] + g.ple.head_vocab_sizes[-1]


def global_tensors(g: Geometry) -> list[TensorSpec]:
    D, V = g.n_embd, g.n_vocab
    specs = [
        TensorSpec("token_embd.weight", ((D, V),), "embed"),
        TensorSpec("output.weight", ((D, V),), "head"),
    ] + _hc_half("output_hc", g, False)
    for s in specs[2:]:
        object.__setattr__(s, "group", "head")
    return specs


def expected_tensors(g: Geometry) -> dict[str, TensorSpec]:
    """Every tensor of the model, except the PLE table whose row count is padded (checked separately)."""
    specs = global_tensors(g)
    for layer in range(g.n_layers):
        specs += layer_tensors(g, layer)
    return {s.name: s for s in specs}


PLE_TABLE = "per_layer_token_embd.weight"
GATHERED = ("token_embd.weight", PLE_TABLE)  # tables read a row at a time by id, never streamed whole
EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")  # routed: [E, ...] each
UNSUFFIXED_ROLES = ("ssm_a", "ssm_dt.bias")  # layer tensors whose names carry no ".weight"


def blk_tensor(layer: int, role: str) -> str:
    """The name of a layer's tensor: blk.{layer}.{role}.weight (blk.{layer}.{role} for ssm_a and ssm_dt.bias)."""
    return f"blk.{layer}.{role}" + ("" if role in UNSUFFIXED_ROLES else ".weight")
INDEXER_MARK = ".indexer.k_proj.weight"
