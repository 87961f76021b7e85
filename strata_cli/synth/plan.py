"""What a synthetic qwen4exp GGUF holds: the converter's metadata (keys, order, value types) and tensor list.

Mirrors the output of llama.cpp's convert_hf_to_gguf.py + conversion/qwen4exp.py (key order and value types as the
converter writes them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGUFValueType as VT

from ..model import quants
from ..model.geometry import ARCH, Geometry, Metadata, geometry_from_metadata
from ..model.names import PLE_TABLE, expected_tensors
from . import fill, ple_hash, recipes
from .presets import Preset
from .vocab import synthetic_vocab

ALIGNMENT = 32
GLOBAL_ORDER = ("output.weight", "token_embd.weight", "output_hc_norm.weight", "output_hc_down.weight",
                "output_hc_up.weight")
# Per-layer tensor order of the converter; a name absent from the layer is skipped.
LAYER_ORDER = (
    "hc_attn_inject.weight", "hc_attn_norm.weight", "hc_attn_down.weight", "hc_attn_up.weight",
    "ssm_a", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_alpha.weight", "ssm_beta.weight", "attn_qkv.weight",
    "attn_gate.weight", "ssm_norm.weight", "ssm_out.weight",
    "ffn_down_exps.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_gate_inp.weight",
    "ffn_down_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_gate_inp_shexp.weight",
    "hc_ffn_inject.weight", "hc_ffn_norm.weight", "hc_ffn_down.weight", "hc_ffn_up.weight",
    "ple_conv1d.weight", "ple_key.weight", "ple_norm_conv.weight", "ple_norm_key.weight",
    "ple_norm_query.weight", PLE_TABLE, "ple_value.weight",
    "indexer.q_proj.weight", "indexer.k_proj.weight", "indexer.k_norm.weight", "indexer.q_norm.weight",
    "attn_k_norm.weight", "attn_k.weight", "attn_output.weight", "attn_q_norm.weight", "attn_q.weight",
    "attn_v.weight",
)
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
EOS_NAME = "<|endoftext|>"


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # GGML order, ne0 first
    ggml_type: int
    init: fill.Init

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return fill.tensor_nbytes(self.shape, self.ggml_type)


@dataclass(frozen=True)
class ModelPlan:
    kvs: list[tuple[str, object, VT, VT | None]]  # general.architecture excluded: GGUFWriter adds it first
    tensors: list[TensorPlan]

    def header_bytes(self) -> int:
        kv = _kv_size("general.architecture", ARCH, VT.STRING, None)
        kv += sum(_kv_size(*item) for item in self.kvs)
        ti = sum(8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4 + 8 for t in self.tensors)
        return _pad(4 + 4 + 8 + 8 + kv + ti)

    def file_bytes(self) -> int:
        return self.header_bytes() + sum(_pad(t.nbytes) for t in self.tensors)


def _pad(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


_SCALAR_BYTES = {VT.UINT8: 1, VT.INT8: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4, VT.FLOAT32: 4,
                 VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8, VT.BOOL: 1}


def _value_size(value, vtype: VT) -> int:
    return 8 + len(value.encode()) if vtype == VT.STRING else _SCALAR_BYTES[vtype]


def _kv_size(key: str, value, vtype: VT, sub: VT | None) -> int:
    head = 8 + len(key.encode()) + 4
    if vtype != VT.ARRAY:
        return head + _value_size(value, vtype)
    return head + 4 + 8 + sum(_value_size(v, sub) for v in value)


def ordered_names(preset: Preset) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor (name, GGML shape) in the converter's order, the padded PLE table included."""
    specs = {name: spec.shape for name, spec in expected_tensors(preset_geometry(preset)).items()}
    if preset.ple_layer is not None:
        rows = ple_hash.padded_rows(preset.ple_vocab_sizes)
        specs[f"blk.{preset.ple_layer}.{PLE_TABLE}"] = (preset.ple_head_dim, rows)
    ordered = [(n, specs.pop(n)) for n in GLOBAL_ORDER]
    for layer in range(preset.num_hidden_layers):
        for suffix in LAYER_ORDER:
            name = f"blk.{layer}.{suffix}"
            if name in specs:
                shape = specs.pop(name)
                ordered.append((PLE_TABLE if suffix == PLE_TABLE else name, shape))
    if specs:  # the name table grew a tensor this plan does not know where to put
        raise AssertionError(f"synthetic writer has no place for tensors {sorted(specs)}")
    return ordered


def _size_label(tensors: list[TensorPlan]) -> str:
    """gguf's parameter-count label ('16x1.8M'), counted the way GGUFWriter counts it."""
    total = shared = expert = n_experts = 0
    for t in tensors:
        total += t.n_elements
        if "_exps." in t.name and len(t.shape) == 3:
            n_experts = t.shape[2]
            expert += t.n_elements // n_experts
        else:
            shared += t.n_elements
    return gguf.size_label(total, shared, expert, n_experts)


def _tokenizer_kvs(p: Preset) -> list:
    tokens, control, merges = synthetic_vocab(p.vocab_size, p.eos_token_id, EOS_NAME)
    types = [TOKEN_CONTROL if c else TOKEN_NORMAL for c in control]
    kvs = [
        ("tokenizer.ggml.model", "gpt2", VT.STRING, None),
        ("tokenizer.ggml.pre", "qwen35", VT.STRING, None),
        ("tokenizer.ggml.tokens", tokens, VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.token_type", types, VT.ARRAY, VT.INT32),
    ]
    if merges:  # the converter's key order: merges between token_type and the special ids
        kvs.append(("tokenizer.ggml.merges", merges, VT.ARRAY, VT.STRING))
    return kvs + [
        ("tokenizer.ggml.eos_token_id", p.eos_token_id, VT.UINT32, None),
        ("tokenizer.ggml.padding_token_id", p.eos_token_id, VT.UINT32, None),
    ]


def _model_kvs(p: Preset, recipe: fill.Recipe, size_label: str) -> list:
    a = ARCH + "."

    def u32(key: str, value: int) -> tuple:
        return a + key, int(value), VT.UINT32, None

    kvs = [
        ("general.type", "model", VT.STRING, None),
        ("general.name", f"{ARCH}-{p.name}", VT.STRING, None),
        ("general.size_label", size_label, VT.STRING, None),
        u32("block_count", p.num_hidden_layers), u32("context_length", p.max_position_embeddings),
        u32("embedding_length", p.hidden_size), u32("attention.head_count", p.num_attention_heads),
        u32("attention.head_count_kv", p.num_key_value_heads),
        (a + "rope.dimension_sections", p.rope_sections, VT.ARRAY, VT.INT32),
        (a + "rope.freq_base", float(p.rope_theta), VT.FLOAT32, None),
        (a + "attention.layer_norm_rms_epsilon", float(p.rms_norm_eps), VT.FLOAT32, None),
        u32("expert_count", p.num_experts), u32("expert_used_count", p.num_experts_per_tok),
        u32("attention.key_length", p.head_dim), u32("attention.value_length", p.head_dim),
        ("general.file_type", recipe.ftype, VT.UINT32, None),
        u32("expert_feed_forward_length", p.moe_intermediate_size),
        u32("expert_shared_feed_forward_length", p.shared_expert_intermediate_size),
        u32("ssm.conv_kernel", p.linear_conv_kernel_dim), u32("ssm.state_size", p.linear_key_head_dim),
        u32("ssm.group_count", p.linear_num_key_heads), u32("ssm.time_step_rank", p.linear_num_value_heads),
        u32("ssm.inner_size", p.linear_num_value_heads * p.linear_value_head_dim),
        (a + "attention.recurrent_layers", [not x for x in p.layer_is_attn], VT.ARRAY, VT.BOOL),
        u32("full_attention_interval", p.full_attention_interval), u32("rope.dimension_count", p.rotary_dims),
        u32("hyper_connection.count", p.hc_count), u32("hyper_connection.low_rank", p.hc_lowrank),
        u32("attention.indexer.head_count", p.indexer_n_heads),
        u32("attention.indexer.key_length", p.indexer_head_dim), u32("attention.indexer.top_k", p.indexer_budget),
        (a + "attention.compress_ratios", list(p.compress_ratios), VT.ARRAY, VT.INT32),
    ]
    if p.ple_layer is not None:
        sizes = p.ple_vocab_sizes
        kvs += [
            (a + "ple.layers", [p.ple_layer], VT.ARRAY, VT.INT32),
            u32("ple.ngram_size", p.ngram_size), u32("ple.heads_per_ngram", p.heads_per_ngram),
            u32("ple.conv_kernel", p.ple_conv_kernel_size), u32("ple.eos_token_id", p.eos_token_id),
            u32("embedding_length_per_layer_input", p.ple_head_dim),
            (a + "ple.layer_multipliers", p.ple_multipliers, VT.ARRAY, VT.UINT64),
            (a + "ple.head_offsets", ple_hash.head_offsets(sizes), VT.ARRAY, VT.UINT64),
            (a + "ple.head_vocab_sizes", sizes, VT.ARRAY, VT.UINT64),
        ]
    kvs.append(("general.quantization_version", gguf.GGML_QUANT_VERSION, VT.UINT32, None))
    return kvs + _tokenizer_kvs(p)


def preset_geometry(preset: Preset, path: str = "<preset>") -> Geometry:
    """The Geometry open_model reads back from a file written for this preset: the loader's geometry_from_metadata
    over the metadata this plan writes (FLOAT32 values rounded as the file stores them), so no default is restated."""
    values = {"general.architecture": ARCH}
    for key, value, vtype, _ in _model_kvs(preset, recipes.uniform(quants.F32), size_label=""):
        values[key] = float(np.float32(value)) if vtype == VT.FLOAT32 else value
    return geometry_from_metadata(Metadata(values, path), preset.vocab_size, any(preset.layer_is_attn))


def build_plan(preset: Preset, file_type: int | fill.Recipe) -> ModelPlan:
    """The file for a uniform output type (a GGML type id) or a per-tensor recipe."""
    recipe = file_type if isinstance(file_type, fill.Recipe) else recipes.uniform(file_type)
    tensors = [TensorPlan(name, shape, recipes.tensor_type(name, shape, recipe), fill.init_for(name, shape))
               for name, shape in ordered_names(preset)]
    return ModelPlan(_model_kvs(preset, recipe, _size_label(tensors)), tensors)


def fallbacks(preset: Preset, file_type: int | fill.Recipe) -> list[tuple[str, str, str, int, int]]:
    """(tensor role, type asked for, type written, row width ne0, tensor count) for every role whose rows do not fit
    the type the recipe asks for (llama-quantize's fallback, recipes.fit_type)."""
    recipe = file_type if isinstance(file_type, fill.Recipe) else recipes.uniform(file_type)
    seen: dict[tuple[str, int, int, int], int] = {}
    for name, shape in ordered_names(preset):
        wanted = recipe.wanted(name)
        got = recipes.tensor_type(name, shape, recipe)
        if got not in (wanted, quants.F32):
            role = re.sub(r"^blk\.\d+\.", "blk.*.", name)
            key = (role, wanted, got, shape[0])
            seen[key] = seen.get(key, 0) + 1
    return [(role, quants.TYPE_NAMES[w], quants.TYPE_NAMES[g], ne0, n) for (role, w, g, ne0), n in seen.items()]
