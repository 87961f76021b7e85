"""A plain-data description of a loaded model for `strata info`: numbers, not prose (tables render the prose)."""

from __future__ import annotations

import math
import re

from .geometry import Geometry, float32_text
from .gguf_file import GGUFModel
from .names import PLE_TABLE


def geometry_numbers(g: Geometry) -> dict:
    """Every geometry value as a number (or a list of numbers), grouped by block."""
    ple = None
    if g.ple is not None:
        p = g.ple
        ple = {"layer": p.layer, "ngram_size": p.ngram_size, "heads_per_ngram": p.heads_per_ngram,
               "head_dim": p.head_dim, "conv_kernel": p.conv_kernel, "dilation": p.dilation,
               "eos": p.eos_token_id}
    return {
        "layers": g.n_layers, "context": g.n_ctx, "hidden": g.n_embd, "vocab": g.n_vocab,
        "layout": "".join("A" if a else "G" for a in g.layer_is_attn), "eps": float(float32_text(g.eps)),
        "eos": g.eos_token_id,
        "attention": {"heads_q": g.n_head, "heads_kv": g.n_head_kv, "head_dim": g.head_dim, "rope_dims": g.n_rot,
                      "rope_base": float(float32_text(g.rope_base))},
        "qsa": {"indexer_heads": g.idx_heads, "indexer_dim": g.idx_dim, "budget_tokens": g.idx_budget,
                "compress_ratios": list(g.compress_ratios)},
        "gdn": {"k_heads": g.ssm_nk, "k_dim": g.ssm_dk, "v_heads": g.ssm_nv, "v_dim": g.ssm_dv,
                "conv_kernel": g.conv_kernel},
        "hyper_connections": {"streams": g.hc, "rank": g.hc_lowrank},
        "moe": {"experts": g.n_expert, "experts_used": g.n_expert_used, "ff": g.n_ff_exp, "shared_ff": g.n_ff_shexp},
        "ple": ple,
    }


def layer_extras(layer: dict) -> str:
    """The table's prose for one layer row of describe()."""
    extras = []
    if layer["kind"] == "attention":
        ratio = layer["qsa_ratio"]
        extras.append(f"QSA ratio {ratio}" if ratio else "dense (ratio 0)")
    if layer["ple"]:
        extras.append("PLE")
    return ", ".join(extras)


def _layer_of(name: str) -> int | None:
    match = re.match(r"blk\.(\d+)\.", name)
    return int(match.group(1)) if match else None


def _roles(m: GGUFModel) -> list[dict]:
    """Per tensor role (the name with its layer index dropped): the type mix, parameters, bytes, bits per weight."""
    roles: dict[str, dict] = {}
    for info in m.tensors.values():
        role = re.sub(r"^blk\.\d+\.", "blk.*.", info.name)
        r = roles.setdefault(role, {"role": role, "mix": {}, "params": 0, "bytes": 0})
        r["mix"][info.type_name] = r["mix"].get(info.type_name, 0) + 1
        r["params"] += math.prod(info.shape)
        r["bytes"] += info.n_bytes
    out = []
    for r in roles.values():
        mix = sorted(r["mix"].items(), key=lambda kv: (-kv[1], kv[0]))
        r["types"] = ", ".join(f"{t} x{n}" if n > 1 else t for t, n in mix)
        r["bits_per_weight"] = round(8.0 * r["bytes"] / max(r["params"], 1), 3)
        out.append(r)
    return sorted(out, key=lambda r: -r["bytes"])


def tokenizer_summary(md: dict) -> dict:
    """What the GGUF's tokenizer.ggml.* keys hold: whether `--text` can use them (strata_cli/model/tokenizer.py)."""
    from .tokenizer import PRE_TOKENIZER_REGEX

    def count(key):
        value = md.get(key)
        return len(value) if isinstance(value, list) else 0

    kind, pre = md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre")
    summary = {"model": kind, "pre": pre, "tokens": count("tokenizer.ggml.tokens"),
               "merges": count("tokenizer.ggml.merges"), "eos": md.get("tokenizer.ggml.eos_token_id")}
    summary["text_input"] = (kind == "gpt2" and pre in PRE_TOKENIZER_REGEX and summary["tokens"] > 0
                             and summary["merges"] > 0)
    return summary


def describe(m: GGUFModel) -> dict:
    g = m.geometry
    per_layer: dict[int, int] = {}
    by_type: dict[str, list[int]] = {}
    tensors = []
    for info in m.tensors.values():
        layer = _layer_of(info.name)
        if layer is not None:
            per_layer[layer] = per_layer.get(layer, 0) + info.n_bytes
        count = by_type.setdefault(info.type_name, [0, 0, 0])
        count[0] += 1
        count[1] += info.n_bytes
        count[2] += math.prod(info.shape)
        tensors.append({"name": info.name, "layer": layer, "shape": list(info.shape), "type": info.type_name,
                        "bytes": info.n_bytes})
    layers = []
    for layer in range(g.n_layers):
        attn = bool(g.layer_is_attn[layer])
        layers.append({"layer": layer, "kind": "attention" if attn else "gated deltanet",
                       "qsa_ratio": g.compress_ratios[layer] if attn else None,
                       "ple": g.ple is not None and g.ple.layer == layer, "bytes": per_layer.get(layer, 0)})
    return {
        "path": m.path, "file_bytes": m.file_size, "tensor_count": len(m.tensors),
        "geometry": geometry_numbers(g), "layers": layers,
        "types": [{"type": t, "tensors": c, "bytes": b, "bits_per_weight": round(8.0 * b / max(n, 1), 3)}
                  for t, (c, b, n) in sorted(by_type.items())],
        "roles": _roles(m),
        "bits_per_weight": round(8.0 * sum(i.n_bytes for i in m.tensors.values())
                                 / max(sum(math.prod(i.shape) for i in m.tensors.values()), 1), 3),
        "tokenizer": tokenizer_summary(m.metadata), "tensors": tensors, "warnings": list(g.warnings),
        **parameter_counts(m),
    }


def parameter_counts(m: GGUFModel) -> dict:
    """params_total: every tensor's elements. params_active: the weights one token is computed with: the routed
    experts (`*_exps`) at experts_used / experts of their elements, the lookup tables at the rows a token reads
    (token_embd one row; the PLE n-gram table one row per head), everything else whole."""
    g = m.geometry
    total = active = 0
    for info in m.tensors.values():
        n = math.prod(info.shape)
        total += n
        if "_exps." in info.name:
            active += n * g.n_expert_used // max(g.n_expert, 1)
        elif info.name == "token_embd.weight":
            active += info.shape[0]
        elif info.name == PLE_TABLE and g.ple is not None:
            active += info.shape[0] * g.ple.n_heads
        else:
            active += n
    return {"params_total": total, "params_active": active}


def params_text(n: int) -> str:
    """3.21B / 35.1M / 812K: a parameter count as model cards write it."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)
