"""Test oracle: tiny random transformers Qwen4-Exp models, their GGUF as llama.cpp's converter writes it, and
transformers' reference logits.

    cfg = random_config(np.random.default_rng(7))
    model = build_model(cfg, seed=7)
    write_gguf(model, tmp / "m.gguf", outtype="q8_0")
    ref = reference_logits(model, random_tokens(rng, cfg, 24, eos_at=9))   # float32 [N, V]

The conversion follows shared/fixtures/qwen4exp-tiny/README.md ("Conversion facts") and that fixture's listing:
same tensor names, GGML shapes, per-outtype tensor types, tensor order and metadata keys/types.
`load_gguf_weights` is the inverse, so a converter-written GGUF (the fixture) can be run through transformers.
"""

from __future__ import annotations

import copy
import re
from contextlib import contextmanager
from dataclasses import dataclass

import gguf
import numpy as np
import torch
from torch import nn
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
from transformers.models.qwen4_exp.modeling_qwen4_exp import (
    Qwen4ExpForCausalLM,
    Qwen4ExpTextExperts,
    Qwen4ExpTextGatedDeltaNet,
    Qwen4ExpTextRMSNorm,
    Qwen4ExpTextRMSNormGated,
    Qwen4ExpTextTopKRouter,
)

from strata_cli.model import quants

ARCH = "qwen4exp"
GV = gguf.GGUFValueType
# outtype -> (GGML type of the quantizable tensors, general.file_type)
OUTTYPES = {
    "f32": (quants.F32, gguf.LlamaFileType.ALL_F32),
    "bf16": (quants.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (quants.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}
# 2-D tensors the converter keeps in F32 whatever the outtype
KEEP_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")


# ---------------------------------------------------------------- configs and models

def random_config(rng: np.random.Generator, **overrides) -> Qwen4ExpTextConfig:
    """A tiny, consistent random geometry. Any config field (or `full_attention_interval`) can be pinned by keyword;
    fields derived from it (layer types, rope, budget, PLE layer) are drawn after the pinned values."""

    def pick(name, draw):
        return overrides.pop(name) if name in overrides else draw()

    def choice(options):
        return options[int(rng.integers(len(options)))]

    kw = {}
    kw["hidden_size"] = pick("hidden_size", lambda: choice([32, 64, 96]))
    interval = pick("full_attention_interval", lambda: int(rng.integers(2, 5)))
    n_layers = kw["num_hidden_layers"] = pick("num_hidden_layers", lambda: int(rng.integers(interval, 10)))
    layer_types = kw["layer_types"] = pick("layer_types", lambda: [
        "linear_attention" if (i + 1) % interval else "indexed_attention" for i in range(n_layers)])

    # gated attention + QSA indexer
    n_head = kw["num_attention_heads"] = pick("num_attention_heads", lambda: int(rng.integers(1, 5)))
    kw["num_key_value_heads"] = pick("num_key_value_heads",
                                     lambda: choice([d for d in range(1, n_head + 1) if n_head % d == 0]))
    head_dim = kw["head_dim"] = pick("head_dim", lambda: choice([16, 32, 64]))
    idx_dim = kw["indexer_head_dim"] = pick("indexer_head_dim", lambda: choice([16, 32, 64]))
    kw["indexer_n_heads"] = pick("indexer_n_heads", lambda: int(rng.integers(1, 4)))
    kw["indexer_kv_heads"] = pick("indexer_kv_heads", lambda: 1)
    ratio = kw["indexer_compress_ratio"] = pick("indexer_compress_ratio", lambda: choice([2, 3, 4]))
    kw["indexer_budget"] = pick("indexer_budget", lambda: ratio * int(rng.integers(1, 4)))
    kw["rope_parameters"] = pick("rope_parameters", lambda: _random_rope(rng, head_dim, idx_dim))

    # Gated DeltaNet
    n_k = kw["linear_num_key_heads"] = pick("linear_num_key_heads", lambda: int(rng.integers(1, 4)))
    kw["linear_num_value_heads"] = pick("linear_num_value_heads", lambda: n_k * int(rng.integers(1, 4)))
    d_k = kw["linear_key_head_dim"] = pick("linear_key_head_dim", lambda: choice([8, 16, 24, 32]))
    kw["linear_value_head_dim"] = pick("linear_value_head_dim",
                                       lambda: d_k if rng.random() < 0.5 else choice([8, 16, 24, 32]))
    kw["linear_conv_kernel_dim"] = pick("linear_conv_kernel_dim", lambda: choice([2, 3, 4]))

    # hyper-connections, MoE, vocabulary
    kw["hc_count"] = pick("hc_count", lambda: choice([2, 3, 4]))
    kw["hc_lowrank"] = pick("hc_lowrank", lambda: int(rng.integers(4, 17)))
    n_expert = kw["num_experts"] = pick("num_experts", lambda: int(rng.integers(4, 13)))
    kw["num_experts_per_tok"] = pick("num_experts_per_tok", lambda: int(rng.integers(1, min(4, n_expert) + 1)))
    kw["moe_intermediate_size"] = pick("moe_intermediate_size", lambda: choice([16, 24, 32, 48, 64]))
    kw["shared_expert_intermediate_size"] = pick("shared_expert_intermediate_size",
                                                 lambda: choice([16, 24, 32, 48, 64]))
    vocab = kw["vocab_size"] = pick("vocab_size", lambda: int(rng.integers(64, 301)))
    kw["eos_token_id"] = pick("eos_token_id", lambda: int(rng.integers(vocab)))

    # PLE (hashed n-gram embedding) on one linear-attention layer, or none
    linear_ids = [i + 1 for i, t in enumerate(layer_types) if t == "linear_attention"]
    kw["ple_layer_ids"] = pick("ple_layer_ids",
                               lambda: [choice(linear_ids)] if linear_ids and rng.random() < 0.75 else [])
    ngram = kw["ngram_size"] = pick("ngram_size", lambda: choice([2, 3]))
    per_ngram = kw["heads_per_ngram"] = pick("heads_per_ngram", lambda: choice([1, 2, 3]))
    kw["ple_embed_dim"] = pick("ple_embed_dim", lambda: (ngram - 1) * per_ngram * choice([8, 16, 32]))
    kw["ple_conv_kernel_size"] = pick("ple_conv_kernel_size", lambda: choice([2, 3, 4]))
    kw["ngram_vocab_size_base"] = pick("ngram_vocab_size_base", lambda: int(rng.integers(150, 261)))
    kw["make_ngram_vocab_size_divisible_by"] = pick("make_ngram_vocab_size_divisible_by",
                                                    lambda: choice([32, 64, 128]))
    kw["split_ngram_parts"] = pick("split_ngram_parts", lambda: 1)
    kw["seed"] = pick("seed", lambda: int(rng.integers(1 << 31)))

    kw.update(output_gate_type="sigmoid", hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=512,
              tie_word_embeddings=False, norm_topk_prob=True)
    kw.update(overrides)
    return Qwen4ExpTextConfig(**kw, attn_implementation="eager")


def _random_rope(rng: np.random.Generator, head_dim: int, idx_dim: int) -> dict:
    # even rotary width that fits the indexer head; head_dim is a power of two, so the factor is exact
    n_rot = 2 * int(rng.integers(3, min(head_dim, idx_dim) // 2 + 1))
    half = n_rot // 2
    base, rest = divmod(half, 3)
    return {
        "rope_type": "default",
        "rope_theta": float(rng.choice([1e4, 1e6, 1e7])),
        "partial_rotary_factor": n_rot / head_dim,
        "mrope_interleaved": True,
        "mrope_section": [base + (rest > 0), base + (rest > 1), base],  # 32 -> [11, 11, 10] like the real model
    }


def config_from_json(path) -> Qwen4ExpTextConfig:
    """A saved HF config (e.g. the fixture's config.json), set up for eager attention like the oracle's models."""
    config = Qwen4ExpTextConfig.from_json_file(str(path))
    config._attn_implementation = "eager"
    return config


def build_model(config: Qwen4ExpTextConfig, seed: int) -> Qwen4ExpForCausalLM:
    """A float32 eval-mode model whose every parameter is drawn from `seed` the way the fixture's were.
    The PLE hash buffers are transformers' own."""
    config = copy.deepcopy(config)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]), _one_thread():  # transformers' own init draws from the global RNG
        model = Qwen4ExpForCausalLM(config)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_draw(model, name, param.shape, gen))
    return model.float().eval()


def _draw(model: nn.Module, name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    owner_name, leaf = name.rpartition(".")[::2]
    owner = model.get_submodule(owner_name)

    def normal(std, mean=0.0):
        return mean + std * torch.randn(shape, generator=gen)

    if isinstance(owner, Qwen4ExpTextRMSNorm):
        return normal(0.1)  # zero-centred, used as 1 + w
    if isinstance(owner, Qwen4ExpTextRMSNormGated):
        return normal(0.1, 1.0)  # used as w
    if isinstance(owner, nn.Embedding):  # embed_tokens and the n-gram table
        return normal(1.0)
    if isinstance(owner, nn.Conv1d):  # depthwise GDN and PLE kernels
        return normal(0.3)
    if isinstance(owner, Qwen4ExpTextGatedDeltaNet) and leaf == "dt_bias":
        return normal(0.3, 1.0)
    if isinstance(owner, Qwen4ExpTextGatedDeltaNet) and leaf == "A_log":
        return torch.log(0.5 + 7.5 * torch.rand(shape, generator=gen))
    if isinstance(owner, (nn.Linear, Qwen4ExpTextExperts, Qwen4ExpTextTopKRouter)):
        scale = 2.0 if name == "lm_head.weight" else 1.0
        return normal(scale / shape[-1] ** 0.5)  # fan_in is the last axis of every weight here
    raise TypeError(f"hf_oracle does not know how to draw {name} ({type(owner).__name__})")


# ---------------------------------------------------------------- reference logits and tokens

@contextmanager
def _one_thread():
    """These models are tiny: torch's second thread only spins, and on a busy 2-core CI box that costs 10-70x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_logits(model: Qwen4ExpForCausalLM, tokens) -> np.ndarray:
    """Full-sequence forward without a cache: float32 [N, V]."""
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)[None]
    with torch.no_grad(), _one_thread():
        out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float().numpy().copy()


def incremental_logits(model: Qwen4ExpForCausalLM, tokens, prefix: int) -> np.ndarray:
    """With transformers' cache: tokens[:prefix] in one call (skipped if 0), then one token per call: float32 [N, V]."""
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)[None]
    spans = ([(0, prefix)] if prefix > 0 else []) + [(t, t + 1) for t in range(prefix, ids.shape[1])]
    cache, rows = None, []
    with torch.no_grad(), _one_thread():
        for start, stop in spans:
            out = model(input_ids=ids[:, start:stop], cache=cache, use_cache=True)
            cache = out.cache
            rows.append(out.logits[0].float())
    return torch.cat(rows).numpy().copy()


def eos_id(config: Qwen4ExpTextConfig) -> int | None:
    """The EOS id PLE resets on (transformers takes the first of a list)."""
    eos = config.eos_token_id
    return eos[0] if isinstance(eos, list) else eos


def random_tokens(rng: np.random.Generator, config: Qwen4ExpTextConfig, n: int, eos_at=None) -> np.ndarray:
    """n non-EOS ids, with EOS placed at position(s) `eos_at` (an int or a sequence)."""
    eos = eos_id(config)
    pool = np.array([i for i in range(config.vocab_size) if i != eos], dtype=np.int64)
    tokens = rng.choice(pool, size=n)
    if eos_at is not None:
        tokens[np.atleast_1d(np.asarray(eos_at, dtype=np.int64))] = eos
    return tokens


# ---------------------------------------------------------------- HF parameter <-> GGUF tensor rules

@dataclass(frozen=True)
class Rule:
    """How the converter turns one HF parameter into GGUF tensor(s) (numpy order, out x in)."""

    names: tuple[str, ...]  # several: the parameter is split along split_axis into `split` sizes
    split: tuple[int, ...] = ()
    split_axis: int = 0
    fold: bool = False  # zero-centred RMSNorm gamma stored as 1 + w
    neg_exp: bool = False  # A_log stored as -exp(A_log)
    squeeze: bool = False  # depthwise conv [C, 1, K] stored as [C, K] (GGML [K, C])
    vheads: tuple[int, int, int] | None = None  # (axis, offset, block): value heads regrouped -> tiled


_HC = {"hc_norm": "norm", "input_mix_weight_down": "down", "input_mix_weight_up": "up",
       "block_inject_weight": "inject"}
_SIMPLE = {  # under model.layers.N. -> under blk.N.
    "self_attn.q_proj.weight": "attn_q.weight",  # rows per head: [q | gate]
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",  # RMSNormGated, used as w: not folded
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "ple.key_proj.weight": "ple_key.weight",
    "ple.value_proj.weight": "ple_value.weight",
}
_FOLDED = {
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.indexer.q_layernorm.weight": "indexer.q_norm.weight",
    "self_attn.indexer.k_layernorm.weight": "indexer.k_norm.weight",
    "ple.norm_key.weight": "ple_norm_key.weight",
    "ple.norm_query.weight": "ple_norm_query.weight",
    "ple.norm_conv.weight": "ple_norm_conv.weight",
}
PLE_TABLE = "per_layer_token_embd.weight"


def rule_for(config: Qwen4ExpTextConfig, hf_name: str) -> Rule:
    if hf_name == "lm_head.weight":
        return Rule(("output.weight",))
    if hf_name == "model.embed_tokens.weight":
        return Rule(("token_embd.weight",))
    m = re.fullmatch(r"model\.hyper_connection_mixer\.(\w+)\.weight", hf_name)
    if m:
        return Rule((f"output_hc_{_HC[m[1]]}.weight",), fold=m[1] == "hc_norm")
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    if not m:
        raise KeyError(f"no GGUF rule for {hf_name}")
    blk, rest = f"blk.{m[1]}.", m[2]
    if rest in _SIMPLE:
        return Rule((blk + _SIMPLE[rest],))
    if rest in _FOLDED:
        return Rule((blk + _FOLDED[rest],), fold=True)
    m = re.fullmatch(r"(attn|mlp)_hyper_connection\.(\w+)\.weight", rest)
    if m:
        half = "attn" if m[1] == "attn" else "ffn"
        return Rule((f"{blk}hc_{half}_{_HC[m[2]]}.weight",), fold=m[2] == "hc_norm")
    if rest == "self_attn.indexer.index_qk_proj.weight":
        q_rows = config.indexer_n_heads * config.indexer_head_dim
        return Rule((blk + "indexer.q_proj.weight", blk + "indexer.k_proj.weight"),
                    split=(q_rows, config.indexer_kv_heads * config.indexer_head_dim))
    if rest == "mlp.experts.gate_up_proj":  # [E, 2F, D]: gate rows then up rows
        ff = config.moe_intermediate_size
        return Rule((blk + "ffn_gate_exps.weight", blk + "ffn_up_exps.weight"), split=(ff, ff), split_axis=1)
    if rest == "ple.conv1d.weight":
        return Rule((blk + "ple_conv1d.weight",), squeeze=True)
    if rest == "ple.ple_embedding.ngram_embedding.weight":
        return Rule((PLE_TABLE,))
    qk_channels = 2 * config.linear_num_key_heads * config.linear_key_head_dim
    dv = config.linear_value_head_dim
    gdn = {  # value-head indexed GDN tensors: (GGUF name, axis, offset, block, extra)
        "linear_attn.in_proj_qkv.weight": ("attn_qkv.weight", 0, qk_channels, dv, {}),
        "linear_attn.in_proj_z.weight": ("attn_gate.weight", 0, 0, dv, {}),
        "linear_attn.in_proj_a.weight": ("ssm_alpha.weight", 0, 0, 1, {}),
        "linear_attn.in_proj_b.weight": ("ssm_beta.weight", 0, 0, 1, {}),
        "linear_attn.dt_bias": ("ssm_dt.bias", 0, 0, 1, {}),
        "linear_attn.A_log": ("ssm_a", 0, 0, 1, {"neg_exp": True}),
        "linear_attn.conv1d.weight": ("ssm_conv1d.weight", 0, qk_channels, dv, {"squeeze": True}),
        "linear_attn.out_proj.weight": ("ssm_out.weight", 1, 0, dv, {}),
    }
    if rest in gdn:
        name, axis, offset, block, extra = gdn[rest]
        return Rule((blk + name,), vheads=(axis, offset, block), **extra)
    raise KeyError(f"no GGUF rule for {hf_name}")


def value_head_order(config: Qwen4ExpTextConfig) -> np.ndarray:
    """GGUF (tiled) value head h' holds HF (grouped) head perm[h']: h' = j*n_k + m <- m*r + j."""
    n_k, n_v = config.linear_num_key_heads, config.linear_num_value_heads
    r = n_v // n_k
    return np.array([(h % n_k) * r + h // n_k for h in range(n_v)], dtype=np.int64)


def _permute_heads(a: np.ndarray, vheads: tuple[int, int, int], order: np.ndarray) -> np.ndarray:
    axis, offset, block = vheads
    a = np.moveaxis(a, axis, 0)
    span = slice(offset, offset + len(order) * block)
    heads = a[span].reshape(len(order), block, *a.shape[1:])
    out = a.copy()
    out[span] = heads[order].reshape(-1, *a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def to_gguf(config: Qwen4ExpTextConfig, rule: Rule, param: torch.Tensor) -> list[tuple[str, np.ndarray]]:
    t = param.detach().float()
    if rule.squeeze:
        t = t[:, 0, :]
    if rule.fold:
        t = t + 1
    if rule.neg_exp:
        t = -torch.exp(t)
    a = t.numpy()
    if rule.vheads:
        a = _permute_heads(a, rule.vheads, value_head_order(config))
    parts = np.split(a, np.cumsum(rule.split)[:-1], axis=rule.split_axis) if rule.split else [a]
    return [(name, np.ascontiguousarray(part, dtype=np.float32)) for name, part in zip(rule.names, parts)]


def from_gguf(config: Qwen4ExpTextConfig, rule: Rule, parts: list[np.ndarray]) -> torch.Tensor:
    a = np.concatenate(parts, axis=rule.split_axis) if rule.split else parts[0]
    if rule.vheads:
        a = _permute_heads(a, rule.vheads, np.argsort(value_head_order(config)))
    t = torch.from_numpy(np.array(a, dtype=np.float32))
    if rule.neg_exp:
        t = torch.log(-t)
    if rule.fold:
        t = t - 1
    if rule.squeeze:
        t = t[:, None, :]
    return t


def gguf_tensors(model: Qwen4ExpForCausalLM) -> list[tuple[str, np.ndarray]]:
    """Every GGUF tensor as float32 numpy arrays, in the converter's order (HF names sorted, as safetensors
    stores them)."""
    config = model.config
    out = []
    for hf_name, param in sorted(model.named_parameters()):
        out += to_gguf(config, rule_for(config, hf_name), param)
    return out


def load_gguf_weights(model: Qwen4ExpForCausalLM, path) -> Qwen4ExpForCausalLM:
    """Overwrite the model's parameters from a converter-written GGUF (any type strata reads), undoing every
    conversion step. The model's PLE hash buffers must agree with the file's metadata."""
    reader = gguf.GGUFReader(str(path), "r")
    arrays = {t.name: quants.dequantize(np.asarray(t.data), int(t.tensor_type)) for t in reader.tensors}
    config, used = model.config, set()
    with torch.no_grad():
        for hf_name, param in model.named_parameters():
            rule = rule_for(config, hf_name)
            value = from_gguf(config, rule, [arrays[n] for n in rule.names])
            if value.shape != param.shape:
                raise ValueError(f"{path}: {rule.names} gives {tuple(value.shape)} for {hf_name} "
                                 f"{tuple(param.shape)}")
            param.copy_(value)
            used.update(rule.names)
    if set(arrays) - used:
        raise ValueError(f"{path}: tensors with no HF parameter: {sorted(set(arrays) - used)}")
    for key, (want, *_) in _ple_metadata(model):  # the hash constants live in the model, not the file
        field = reader.get_field(key)
        got = field.contents() if field is not None else None
        if got != want:
            raise ValueError(f"{path}: {key} = {got} but the model has {want}")
    return model


# ---------------------------------------------------------------- the writer

def tensor_type(name: str, array: np.ndarray, outtype: str) -> int:
    """The GGML type the converter gives a tensor for an outtype."""
    target = OUTTYPES[outtype][0]
    if target == quants.F32 or array.ndim <= 1 or name.endswith(KEEP_F32):
        return quants.F32
    if target == quants.Q8_0 and array.shape[-1] % quants.QK8_0:
        return quants.F16  # rows that do not fill whole Q8_0 blocks
    return target


def write_gguf(model: Qwen4ExpForCausalLM, path, outtype: str = "f32") -> None:
    """Write the model as llama.cpp's converter does for `--outtype` f32 / bf16 / q8_0."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: expected one of {sorted(OUTTYPES)}")
    writer = gguf.GGUFWriter(str(path), arch=ARCH)
    for name, array in gguf_tensors(model):
        ttype = tensor_type(name, array, outtype)
        raw = quants.quantize(array, ttype)
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(ttype) if raw.dtype == np.uint8 else None)
    size_label = gguf.size_label(*writer.get_total_parameter_count())
    for key, (value, vtype, *sub) in metadata(model, OUTTYPES[outtype][1], size_label):
        writer.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def metadata(model: Qwen4ExpForCausalLM, file_type: int, size_label: str) -> list[tuple[str, tuple]]:
    """(key, (value, type[, array element type])) in the converter's order; general.architecture comes from
    the writer itself."""
    c = model.config
    p = ARCH + "."
    u32 = GV.UINT32
    attn = [t != "linear_attention" for t in c.layer_types]
    rope = c.rope_parameters
    n_rot = int(c.head_dim * rope.get("partial_rotary_factor", 1.0))
    sections = list(rope.get("mrope_section", []))
    sections += [0] * (4 - len(sections))
    kv = [
        ("general.type", ("model", GV.STRING)),
        ("general.name", ("qwen4exp-oracle", GV.STRING)),
        ("general.size_label", (size_label, GV.STRING)),
        (p + "block_count", (c.num_hidden_layers, u32)),
        (p + "context_length", (c.max_position_embeddings, u32)),
        (p + "embedding_length", (c.hidden_size, u32)),
        (p + "attention.head_count", (c.num_attention_heads, u32)),
        (p + "attention.head_count_kv", (c.num_key_value_heads, u32)),
        (p + "rope.dimension_sections", ([int(s) for s in sections], GV.ARRAY, GV.INT32)),
        (p + "rope.freq_base", (float(rope["rope_theta"]), GV.FLOAT32)),
        (p + "attention.layer_norm_rms_epsilon", (float(c.rms_norm_eps), GV.FLOAT32)),
        (p + "expert_count", (c.num_experts, u32)),
        (p + "expert_used_count", (c.num_experts_per_tok, u32)),
        (p + "attention.key_length", (c.head_dim, u32)),
        (p + "attention.value_length", (c.head_dim, u32)),
        ("general.file_type", (int(file_type), u32)),
        (p + "expert_feed_forward_length", (c.moe_intermediate_size, u32)),
        (p + "expert_shared_feed_forward_length", (c.shared_expert_intermediate_size, u32)),
        (p + "ssm.conv_kernel", (c.linear_conv_kernel_dim, u32)),
        (p + "ssm.state_size", (c.linear_key_head_dim, u32)),
        (p + "ssm.group_count", (c.linear_num_key_heads, u32)),
        (p + "ssm.time_step_rank", (c.linear_num_value_heads, u32)),
        (p + "ssm.inner_size", (c.linear_num_value_heads * c.linear_value_head_dim, u32)),
        (p + "attention.recurrent_layers", ([not a for a in attn], GV.ARRAY, GV.BOOL)),
    ]
    interval = _attention_interval(attn)
    if interval is not None:
        kv.append((p + "full_attention_interval", (interval, u32)))
    kv += [
        (p + "rope.dimension_count", (n_rot, u32)),
        (p + "hyper_connection.count", (c.hc_count, u32)),
        (p + "hyper_connection.low_rank", (c.hc_lowrank, u32)),
        (p + "attention.indexer.head_count", (c.indexer_n_heads, u32)),
        (p + "attention.indexer.key_length", (c.indexer_head_dim, u32)),
        (p + "attention.indexer.top_k", (c.indexer_budget, u32)),
        (p + "attention.compress_ratios", ([c.indexer_compress_ratio if a else 0 for a in attn], GV.ARRAY,
                                           GV.INT32)),
    ]
    kv += _ple_metadata(model)
    kv.append(("general.quantization_version", (gguf.GGML_QUANT_VERSION, u32)))
    kv += _tokenizer_metadata(c)
    return kv


def _attention_interval(attn: list[bool]) -> int | None:
    """The converter's full_attention_interval: every k-th layer is attention (None if no such k)."""
    if not any(attn):
        return None
    k = attn.index(True) + 1
    return k if attn == [(i + 1) % k == 0 for i in range(len(attn))] else None


def _ple_metadata(model: Qwen4ExpForCausalLM) -> list[tuple[str, tuple]]:
    c = model.config
    if not c.ple_layer_ids:
        return []
    if len(c.ple_layer_ids) != 1:
        raise ValueError(f"ple_layer_ids {c.ple_layer_ids}: the GGUF layout has one n-gram table")
    layer = c.ple_layer_ids[0] - 1
    emb = model.model.layers[layer].ple.ple_embedding
    eos = c.eos_token_id[-1] if isinstance(c.eos_token_id, list) else c.eos_token_id  # converter: eos[-1]
    p, u32, u64 = ARCH + ".", GV.UINT32, GV.UINT64

    def u64s(buffer):
        return ([int(v) for v in buffer.tolist()], GV.ARRAY, u64)

    return [
        (p + "ple.layers", ([layer], GV.ARRAY, GV.INT32)),
        (p + "ple.ngram_size", (c.ngram_size, u32)),
        (p + "ple.heads_per_ngram", (c.heads_per_ngram, u32)),
        (p + "ple.conv_kernel", (c.ple_conv_kernel_size, u32)),
        (p + "ple.eos_token_id", (int(eos), u32)),
        (p + "embedding_length_per_layer_input", (emb.ngram_embedding.embedding_dim, u32)),
        (p + "ple.layer_multipliers", u64s(emb.layer_multipliers)),
        (p + "ple.head_offsets", u64s(emb.ngram_heads_offsets)),
        (p + "ple.head_vocab_sizes", u64s(emb.ngram_heads_vocab_sizes)),
    ]


def _tokenizer_metadata(c: Qwen4ExpTextConfig) -> list[tuple[str, tuple]]:
    """A minimal byte-level-looking vocabulary: printable characters, fillers, one merge, EOS as a control token."""
    vocab, eos = c.vocab_size, eos_id(c)
    tokens = [chr(33 + i) if i < 94 else f"<|filler_{i}|>" for i in range(vocab)]
    types = [1] * vocab  # NORMAL
    merged = vocab - 1 if vocab - 1 != eos else vocab - 2
    tokens[merged], types[merged] = '!"', 1
    kv = [
        ("tokenizer.ggml.model", ("gpt2", GV.STRING)),
        ("tokenizer.ggml.pre", ("qwen35", GV.STRING)),
    ]
    if eos is not None:
        tokens[eos], types[eos] = "<|endoftext|>", 3  # CONTROL
    kv += [
        ("tokenizer.ggml.tokens", (tokens, GV.ARRAY, GV.STRING)),
        ("tokenizer.ggml.token_type", (types, GV.ARRAY, GV.INT32)),
        ("tokenizer.ggml.merges", (['! "'], GV.ARRAY, GV.STRING)),
    ]
    if eos is not None:
        kv += [("tokenizer.ggml.eos_token_id", (int(eos), GV.UINT32)),
               ("tokenizer.ggml.padding_token_id", (int(eos), GV.UINT32))]
    return kv
