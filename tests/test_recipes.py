"""make-model --type for every block type and --recipe mixes: llama-quantize's fallbacks, files that load and run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.model import quants as Q
from strata_cli.model.gguf_file import open_model
from strata_cli.synth import estimate_size, load_preset, write_model
from strata_cli.synth.plan import build_plan, fallbacks
from strata_cli.synth.recipes import RECIPE_NAMES, fit_type, load_recipe, tensor_type, uniform


@pytest.mark.parametrize("asked,ne0,written", [
    (Q.Q4_K, 2560, Q.Q4_K), (Q.Q4_K, 640, Q.Q5_0), (Q.Q5_K, 640, Q.Q5_1), (Q.Q6_K, 640, Q.Q8_0),
    (Q.Q2_K, 640, Q.IQ4_NL), (Q.Q3_K, 640, Q.IQ4_NL), (Q.IQ2_XS, 640, Q.IQ4_NL), (Q.IQ1_M, 640, Q.IQ4_NL),
    (Q.IQ4_XS, 160, Q.IQ4_NL), (Q.TQ1_0, 640, Q.Q4_0), (Q.TQ2_0, 128, Q.Q4_0), (Q.Q4_0, 16, Q.F16),
    (Q.IQ2_XXS, 16, Q.F16), (Q.NVFP4, 96, Q.F16), (Q.MXFP4, 640, Q.MXFP4),
])
def test_fallback_is_llama_quantizes(asked, ne0, written):
    assert fit_type(asked, ne0) == written


def test_converter_exceptions_hold_under_any_recipe():
    r = load_recipe("ud-q4_k_xl")
    assert tensor_type("blk.0.ffn_gate_inp.weight", (256, 8), r) == Q.F32
    assert tensor_type("blk.0.ssm_conv1d.weight", (4, 512), r) == Q.F32
    assert tensor_type("blk.0.ssm_a", (4,), r) == Q.F32
    assert tensor_type("blk.2.ffn_gate_exps.weight", (2560, 640, 512), r) == Q.Q5_K
    assert tensor_type("blk.3.ffn_gate_exps.weight", (2560, 640, 512), r) == Q.Q4_K
    assert tensor_type("blk.30.ffn_down_exps.weight", (640, 2560, 512), r) == Q.Q8_0
    assert tensor_type("blk.31.ffn_down_exps.weight", (640, 2560, 512), r) == Q.Q5_1
    assert tensor_type("per_layer_token_embd.weight", (160, 1000), r) == Q.IQ4_NL
    assert tensor_type("blk.5.attn_q.weight", (2560, 12288), r) == Q.Q8_0


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_recipes_at_the_released_geometry(name):
    """At flash-next's shapes every recipe writes what it asks for on the experts (no fallback there)."""
    preset = load_preset("flash-next").with_overrides(layers=4, experts=8, ngram_vocab=1000)
    recipe = load_recipe(name)
    plan = {t.name: t.ggml_type for t in build_plan(preset, recipe).tensors}
    for layer in range(4):
        for role in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            tname = f"blk.{layer}.{role}.weight"
            assert plan[tname] == recipe.wanted(tname), tname
    assert not [f for f in fallbacks(preset, recipe) if "_exps" in f[0]]


@pytest.mark.parametrize("ggml_type", Q.BLOCK_TYPES, ids=[Q.TYPE_NAMES[t] for t in Q.BLOCK_TYPES])
def test_every_type_writes_a_model_that_loads_and_runs(tmp_path, ggml_type):
    # hidden and expert width 256: every type fits the expert matrices (the rest may fall back)
    preset = dataclasses.replace(load_preset("tiny").with_overrides(layers=4, experts=4), hidden_size=256,
                                 moe_intermediate_size=256, shared_expert_intermediate_size=256)
    path = write_model(tmp_path / "m.gguf", preset, seed=3, ggml_type=Q.TYPE_NAMES[ggml_type])
    assert path.stat().st_size == estimate_size(preset, Q.TYPE_NAMES[ggml_type])
    model = open_model(path)
    want = {t.name: t.ggml_type for t in build_plan(preset, ggml_type).tensors}
    assert {n: i.ggml_type for n, i in model.tensors.items()} == want
    assert want["blk.0.ffn_gate_exps.weight"] == want["blk.3.ffn_down_exps.weight"] == ggml_type
    logits = ReferenceEngine(model).run(np.array([1, 5, 9, 2], np.int64), 0).logits
    assert np.isfinite(logits).all() and logits.std() > 0


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_make_model_recipe_cli(tmp_path, name):
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(main, ["make-model", str(out), "--recipe", name, "--seed", "1"])
    assert result.exit_code == 0, result.output
    model = open_model(out)
    assert model.metadata["general.file_type"] == load_recipe(name).ftype
    info = CliRunner().invoke(main, ["info", str(out)])
    assert info.exit_code == 0 and "tensor roles" in info.output and "bits per weight" in info.output


def test_user_recipe_path_and_bad_recipes(tmp_path):
    good = tmp_path / "mine.yaml"
    good.write_text("default: Q4_0\nrules:\n  - {match: 'blk.*.ffn_*_exps.weight', type: iq4_nl}\n")
    r = load_recipe(str(good))
    assert (r.name, r.default, r.ftype, r.rules) == ("mine", Q.Q4_0, 2, (("blk.*.ffn_*_exps.weight", Q.IQ4_NL),))
    cases = {
        "default: Q9_9\n": "default = 'Q9_9'",
        "rules: []\n": "missing key 'default'",
        "default: Q4_0\nrules: [{match: x}]\n": "rules[0]",
        "default: Q4_0\nbogus: 1\n": "unknown key 'bogus'",
        "default: [\n": "not valid YAML",
    }
    for text, needle in cases.items():
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        result = CliRunner().invoke(main, ["make-model", str(tmp_path / "x.gguf"), "--recipe", str(bad)])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and needle in lines[0], (text, result.output)
    result = CliRunner().invoke(main, ["make-model", str(tmp_path / "x.gguf"), "--recipe", "nope"])
    assert result.exit_code == 2 and "no such recipe" in result.output  # a bad option value (a bad recipe file: 1)
    result = CliRunner().invoke(main, ["make-model", str(tmp_path / "x.gguf"), "--recipe", "q2_k-mix",
                                       "--type", "Q4_0"])
    assert result.exit_code == 2 and "one of them" in result.output
    assert uniform(Q.IQ2_XS).ftype == 20
