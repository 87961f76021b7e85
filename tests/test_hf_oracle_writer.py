"""The oracle's GGUF writer against llama.cpp's own conversion of the qwen4exp-tiny fixture, and its random models
against strata's loader."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import hf_oracle as H
from strata_cli.model import quants
from strata_cli.model.gguf_file import open_model
from strata_cli.model.names import PLE_TABLE

OUTTYPES = ["f32", "bf16", "q8_0"]


def _layout(path):
    """Ordered (key, value types) and (name, GGML shape, type) of a GGUF, plus the reader."""
    reader = gguf.GGUFReader(str(path), "r")
    keys = [(k, [int(t) for t in f.types]) for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    tensors = [(t.name, [int(s) for s in t.shape], int(t.tensor_type)) for t in reader.tensors]
    return reader, keys, tensors


@pytest.fixture(scope="module")
def fixture_config(fixture_dir):
    return H.config_from_json(fixture_dir / "config.json")


@pytest.fixture(scope="module")
def converted(fixture_dir, fixture_config):
    """transformers' model carrying the fixture's own weights, read back from llama.cpp's f32 conversion."""
    model = H.build_model(fixture_config, seed=0)
    return H.load_gguf_weights(model, fixture_dir / "model-f32.gguf")


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_writer_layout_matches_converter(fixture_dir, fixture_config, tmp_path, outtype):
    model = H.build_model(fixture_config, seed=1)
    H.write_gguf(model, tmp_path / "m.gguf", outtype)
    ours, our_keys, our_tensors = _layout(tmp_path / "m.gguf")
    ref, ref_keys, ref_tensors = _layout(fixture_dir / f"model-{outtype}.gguf")
    assert our_tensors == ref_tensors  # names, order, GGML shapes, per-tensor types
    assert our_keys == ref_keys  # keys, order, value and array element types
    for key, _ in ref_keys:
        if key != "general.name" and not key.startswith("tokenizer."):
            assert ours.get_field(key).contents() == ref.get_field(key).contents(), key
    counts = {}
    for _, _, ttype in our_tensors:
        counts[ttype] = counts.get(ttype, 0) + 1
    assert counts == {"f32": {quants.F32: 214}, "bf16": {quants.BF16: 146, quants.F32: 68},
                      "q8_0": {quants.F16: 18, quants.F32: 68, quants.Q8_0: 128}}[outtype]  # README's counts


def test_fixture_weights_reproduce_reference_logits(fixture_dir, converted):
    """Undoing the conversion of the fixture gives back transformers' reference: folds, value-head order and
    splits go the way llama.cpp's converter goes."""
    ref = np.load(fixture_dir / "reference.npz")
    np.testing.assert_allclose(H.reference_logits(converted, ref["tokens"]), ref["logits"], rtol=0, atol=1e-5)
    inc = H.incremental_logits(converted, ref["tokens"], int(ref["incremental_prefix"]))
    np.testing.assert_allclose(inc, ref["logits_incremental"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_writer_reproduces_converter_bytes(fixture_dir, converted, tmp_path, outtype):
    H.write_gguf(converted, tmp_path / "m.gguf", outtype)
    ours = gguf.GGUFReader(str(tmp_path / "m.gguf"), "r").tensors
    ref = gguf.GGUFReader(str(fixture_dir / f"model-{outtype}.gguf"), "r").tensors
    assert [t.name for t in ours] == [t.name for t in ref]
    for a, b in zip(ours, ref):
        if a.name.endswith("ssm_a"):  # -exp(log(-a)) may move one ulp
            np.testing.assert_allclose(np.asarray(a.data), np.asarray(b.data), rtol=1e-6, err_msg=a.name)
        else:
            assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name


def test_reference_logits_deterministic(fixture_config):
    tokens = H.random_tokens(np.random.default_rng(3), fixture_config, 24, eos_at=9)
    first = H.reference_logits(H.build_model(fixture_config, seed=5), tokens)
    again = H.reference_logits(H.build_model(fixture_config, seed=5), tokens)
    other = H.reference_logits(H.build_model(fixture_config, seed=6), tokens)
    assert first.shape == (24, fixture_config.vocab_size) and first.dtype == np.float32
    assert np.array_equal(first, again)
    assert np.abs(first - other).max() > 0.1


# ---------------------------------------------------------------- random geometries

RANDOM_CASES = [  # (seed, overrides): the forced ones pin the corners the brief asks for
    (11, {}),
    (12, {}),
    (13, {"ple_layer_ids": []}),
    (14, {"full_attention_interval": 3, "num_hidden_layers": 5,  # last layer GDN, PLE on it
          "ple_layer_ids": [5], "linear_key_head_dim": 16, "linear_value_head_dim": 24,
          "linear_num_key_heads": 2, "linear_num_value_heads": 6}),
    (15, {"hidden_size": 96, "moe_intermediate_size": 24, "heads_per_ngram": 3, "ngram_size": 3}),
]


@pytest.mark.parametrize("seed,overrides", RANDOM_CASES)
def test_random_model_loads_in_strata(tmp_path, seed, overrides):
    cfg = H.random_config(np.random.default_rng(seed), **overrides)
    model = H.build_model(cfg, seed)
    tensors = dict(H.gguf_tensors(model))
    for outtype in OUTTYPES:
        path = tmp_path / f"m-{outtype}.gguf"
        H.write_gguf(model, path, outtype)
        gm = open_model(path)
        g = gm.geometry
        attn = tuple(t == "indexed_attention" for t in cfg.layer_types)
        assert (g.n_layers, g.n_embd, g.n_vocab, g.layer_is_attn) == (cfg.num_hidden_layers, cfg.hidden_size,
                                                                      cfg.vocab_size, attn)
        assert (g.n_head, g.n_head_kv, g.head_dim) == (cfg.num_attention_heads, cfg.num_key_value_heads,
                                                       cfg.head_dim)
        assert g.n_rot == int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"])
        assert g.rope_base == cfg.rope_parameters["rope_theta"]
        assert (g.idx_heads, g.idx_dim, g.idx_budget) == (cfg.indexer_n_heads, cfg.indexer_head_dim,
                                                          cfg.indexer_budget)
        assert g.compress_ratios == tuple(cfg.indexer_compress_ratio if a else 0 for a in attn)
        assert (g.conv_kernel, g.ssm_nk, g.ssm_nv, g.ssm_dk, g.ssm_dv) == (
            cfg.linear_conv_kernel_dim, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
            cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        assert (g.hc, g.hc_lowrank) == (cfg.hc_count, cfg.hc_lowrank)
        assert (g.n_expert, g.n_expert_used, g.n_ff_exp, g.n_ff_shexp) == (
            cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size)
        assert g.eos_token_id == cfg.eos_token_id and not g.warnings
        if cfg.ple_layer_ids:
            ple = model.model.layers[cfg.ple_layer_ids[0] - 1].ple
            assert g.ple.layer == cfg.ple_layer_ids[0] - 1
            assert g.ple.embed_dim == cfg.ple_embed_dim and g.ple.conv_kernel == cfg.ple_conv_kernel_size
            assert list(g.ple.multipliers) == ple.ple_embedding.layer_multipliers.tolist()
            assert g.ple.eos_token_id == cfg.eos_token_id
        else:
            assert g.ple is None
        assert set(gm.tensors) == set(gm.specs) | ({PLE_TABLE} if cfg.ple_layer_ids else set())
        for name, info in gm.tensors.items():
            assert info.ggml_type == H.tensor_type(name, tensors[name], outtype), name
            if outtype == "f32":
                assert np.array_equal(gm.f32(name), tensors[name]), name
    # reading the f32 file back into a fresh model restores every parameter
    restored = H.load_gguf_weights(H.build_model(cfg, seed + 100), tmp_path / "m-f32.gguf")
    for (name, p), (_, q) in zip(model.named_parameters(), restored.named_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)  # 1 + w - 1: an ulp of 1


def test_random_config_covers_the_space():
    seen = set()
    for seed in range(60):
        cfg = H.random_config(np.random.default_rng(seed))
        attn = [t == "indexed_attention" for t in cfg.layer_types]
        n_rot = int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"])
        assert 2 <= cfg.num_hidden_layers <= 9 and any(attn)
        assert n_rot % 2 == 0 and n_rot <= min(cfg.head_dim, cfg.indexer_head_dim)
        assert sum(cfg.rope_parameters["mrope_section"]) == n_rot // 2
        assert cfg.indexer_budget % cfg.indexer_compress_ratio == 0
        assert cfg.linear_num_value_heads % cfg.linear_num_key_heads == 0
        assert 0 <= cfg.eos_token_id < cfg.vocab_size
        assert all(not attn[i - 1] for i in cfg.ple_layer_ids)
        seen.update({
            "last layer gdn": not attn[-1], "no ple": not cfg.ple_layer_ids, "ple": bool(cfg.ple_layer_ids),
            "dv != dk": cfg.linear_value_head_dim != cfg.linear_key_head_dim,
            "grouped v heads": cfg.linear_num_value_heads > cfg.linear_num_key_heads,
            "ffn not q8_0 aligned": cfg.moe_intermediate_size % 32 != 0,
            "bigram only": cfg.ngram_size == 2, "top-1": cfg.num_experts_per_tok == 1,
        }.items())
    assert {name for name, hit in seen if hit} == {
        "last layer gdn", "no ple", "ple", "dv != dk", "grouped v heads", "ffn not q8_0 aligned", "bigram only",
        "top-1"}


def test_value_heads_tiled():
    """GGUF value head h' holds an HF head served by key head h' % n_k (HF: head h serves key head h // r)."""
    for n_k, ratio in [(1, 3), (2, 2), (3, 3), (2, 1)]:
        cfg = H.random_config(np.random.default_rng(0), linear_num_key_heads=n_k,
                              linear_num_value_heads=n_k * ratio)
        order = H.value_head_order(cfg)
        assert sorted(order) == list(range(n_k * ratio))
        assert [int(h) // ratio for h in order] == [h % n_k for h in range(n_k * ratio)]
    assert H.value_head_order(H.random_config(np.random.default_rng(0), linear_num_key_heads=2,
                                              linear_num_value_heads=4)).tolist() == [0, 2, 1, 3]


def test_random_tokens_place_eos():
    cfg = H.random_config(np.random.default_rng(4))
    tokens = H.random_tokens(np.random.default_rng(4), cfg, 40, eos_at=[3, 17])
    assert tokens.dtype == np.int64 and tokens.shape == (40,)
    assert np.flatnonzero(tokens == cfg.eos_token_id).tolist() == [3, 17]
    assert tokens.min() >= 0 and tokens.max() < cfg.vocab_size
