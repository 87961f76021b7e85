"""Random tiny qwen4exp geometries written by strata's own synthetic writer: no ../shared, no transformers.

The window/commit properties run on these on a fresh clone and on the GPU machine (which has no transformers
with Qwen4-Exp); tests/hf_oracle.py draws transformers models where the math itself is checked.

    preset = random_preset(np.random.default_rng(3), indexer_compress_ratio=3)
    model = write_random(tmp_path, preset, seed=3)             # a GGUFModel (F32 unless ggml_type is given)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from strata_cli.model.gguf_file import open_model
from strata_cli.synth import Preset, load_preset, write_model


def random_preset(rng: np.random.Generator, **pins) -> Preset:
    """A consistent random geometry: every width drawn, QSA on every interval-th layer with a small budget (so
    selection turns sparse within a few dozen tokens), PLE on a GDN layer unless ple_layer=None is pinned.
    Any Preset field can be pinned by keyword; fields derived from it are drawn after the pinned values."""

    def pick(name, draw):
        return pins.pop(name) if name in pins else draw()

    def choice(options):
        return options[int(rng.integers(len(options)))]

    kw = {}
    interval = kw["full_attention_interval"] = pick("full_attention_interval", lambda: int(rng.integers(2, 4)))
    n_layers = kw["num_hidden_layers"] = pick("num_hidden_layers", lambda: int(rng.integers(interval, 2 * interval + 1)))
    n_head = kw["num_attention_heads"] = pick("num_attention_heads", lambda: int(rng.integers(1, 5)))
    kw["num_key_value_heads"] = pick("num_key_value_heads",
                                     lambda: choice([d for d in range(1, n_head + 1) if n_head % d == 0]))
    head_dim = kw["head_dim"] = pick("head_dim", lambda: choice([16, 32, 64]))
    idx_dim = kw["indexer_head_dim"] = pick("indexer_head_dim", lambda: choice([16, 32, 64]))
    kw["rotary_dims"] = pick("rotary_dims", lambda: 2 * int(rng.integers(1, min(head_dim, idx_dim) // 2 + 1)))
    kw["indexer_n_heads"] = pick("indexer_n_heads", lambda: int(rng.integers(1, 4)))
    ratio = kw["indexer_compress_ratio"] = pick("indexer_compress_ratio", lambda: choice([2, 3, 4, 5]))
    kw["indexer_budget"] = pick("indexer_budget", lambda: ratio * int(rng.integers(1, 4)))
    n_k = kw["linear_num_key_heads"] = pick("linear_num_key_heads", lambda: int(rng.integers(1, 4)))
    kw["linear_num_value_heads"] = pick("linear_num_value_heads", lambda: n_k * int(rng.integers(1, 3)))
    kw["linear_key_head_dim"] = pick("linear_key_head_dim", lambda: choice([8, 16, 24, 32]))
    kw["linear_value_head_dim"] = pick("linear_value_head_dim", lambda: choice([8, 16, 24, 32]))
    kw["linear_conv_kernel_dim"] = pick("linear_conv_kernel_dim", lambda: choice([2, 3, 4]))
    kw["hidden_size"] = pick("hidden_size", lambda: choice([32, 48, 64, 96]))
    kw["hc_count"] = pick("hc_count", lambda: choice([2, 3, 4]))
    kw["hc_lowrank"] = pick("hc_lowrank", lambda: int(rng.integers(4, 13)))
    n_expert = kw["num_experts"] = pick("num_experts", lambda: int(rng.integers(4, 13)))
    kw["num_experts_per_tok"] = pick("num_experts_per_tok", lambda: int(rng.integers(1, min(4, n_expert) + 1)))
    kw["moe_intermediate_size"] = pick("moe_intermediate_size", lambda: choice([16, 24, 32, 48]))
    kw["shared_expert_intermediate_size"] = pick("shared_expert_intermediate_size", lambda: choice([16, 32, 48]))
    vocab = kw["vocab_size"] = pick("vocab_size", lambda: int(rng.integers(64, 301)))
    kw["eos_token_id"] = pick("eos_token_id", lambda: int(rng.integers(vocab)))
    gdn_layers = [i for i in range(n_layers) if (i + 1) % interval]
    kw["ple_layer"] = pick("ple_layer", lambda: choice(gdn_layers))
    kw["ngram_size"] = pick("ngram_size", lambda: choice([2, 3, 4]))
    kw["heads_per_ngram"] = pick("heads_per_ngram", lambda: choice([1, 2]))
    kw["ple_head_dim"] = pick("ple_head_dim", lambda: choice([8, 16]))
    kw["ple_conv_kernel_size"] = pick("ple_conv_kernel_size", lambda: choice([2, 3, 4]))
    kw["ngram_vocab_size_base"] = pick("ngram_vocab_size_base", lambda: int(rng.integers(100, 400)))
    kw["ngram_hash_seed"] = pick("ngram_hash_seed", lambda: int(rng.integers(1 << 16)))
    kw["max_position_embeddings"] = pick("max_position_embeddings", lambda: 256)
    kw.update(pins)
    return dataclasses.replace(load_preset("tiny"), name="random", **kw)


def write_random_file(directory, preset: Preset, seed: int, ggml_type: str = "F32"):
    """Path of the GGUF written for preset in directory."""
    return write_model(directory / f"random-{seed}-{ggml_type}.gguf", preset, seed=seed, ggml_type=ggml_type)


def write_random(directory, preset: Preset, seed: int, ggml_type: str = "F32"):
    return open_model(write_random_file(directory, preset, seed, ggml_type))
