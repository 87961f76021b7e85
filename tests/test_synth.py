"""Synthetic models: presets, the streaming writer, `make-model` and the cached default model."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections import namedtuple
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.synth import default_model
from strata_cli.sysio import cache
from strata_cli.commands.make_model import command as make_model
from strata_cli.errors import InputError
from strata_cli.model import quants
from strata_cli.model.gguf_file import open_model
from strata_cli.synth import estimate_size, fill, load_preset, write_model
from strata_cli.synth.plan import build_plan, preset_geometry

TYPES = ("F32", "F16", "BF16", "Q8_0")
SPEC_MULTIPLIERS = [23703573157769, 20109073645365, 8052911324071]  # the released model's layer 0
SPEC_VOCAB = [20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
              20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171]
SPEC_OFFSETS = [0, 20000003, 40000026, 60000059, 80000106, 100000165, 120000228, 140000297,
                160000374, 180000455, 200000548, 220000655, 240000802, 260000955, 280001114, 300001275]


def _same_geometry(path: Path, preset) -> None:
    got = open_model(path).geometry
    assert got.warnings == ()
    assert dataclasses.replace(got, path="<preset>") == preset_geometry(preset)


@pytest.mark.parametrize("ggml_type", TYPES)
def test_tiny_writes_loads_and_matches_estimate(tmp_path, ggml_type):
    preset = load_preset("tiny")
    path = write_model(tmp_path / "m.gguf", preset, seed=0, ggml_type=ggml_type)
    _same_geometry(path, preset)
    assert abs(path.stat().st_size - estimate_size(preset, ggml_type)) <= 4096
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no partial file left behind


def test_tiny_weights_are_sane(tmp_path):
    model = open_model(write_model(tmp_path / "m.gguf", load_preset("tiny"), seed=0, ggml_type="F32"))
    for name in model.tensors:
        assert np.isfinite(model.f32(name)).all(), name
    assert (model.f32("blk.0.ssm_a") < 0).all()
    assert abs(model.f32("blk.0.hc_attn_norm.weight").mean() - 1) < 0.05
    assert abs(model.f32("blk.0.ssm_dt.bias").mean() - 1) < 0.5
    assert 0.8 < model.f32("token_embd.weight").std() < 1.2


def test_seed_decides_the_bytes_and_chunking_does_not(tmp_path, monkeypatch):
    preset = load_preset("tiny")
    a = write_model(tmp_path / "a.gguf", preset, seed=1, ggml_type="Q8_0").read_bytes()
    b = write_model(tmp_path / "b.gguf", preset, seed=2, ggml_type="Q8_0").read_bytes()
    assert a != b and len(a) == len(b)
    monkeypatch.setattr(fill, "CHUNK_ELEMENTS", 1024)  # many chunks per tensor, reordered across threads
    for ggml_type in ("Q8_0", "BF16"):
        path = write_model(tmp_path / f"c-{ggml_type}.gguf", preset, seed=1, ggml_type=ggml_type)
        _same_geometry(path, preset)
        assert path.stat().st_size == estimate_size(preset, ggml_type)


def test_overrides_keep_the_model_loadable(tmp_path):
    preset = load_preset("tiny").with_overrides(layers=1, experts=2, vocab=64)
    assert (preset.ple_layer, preset.num_experts_per_tok, preset.eos_token_id) == (0, 2, 61)
    _same_geometry(write_model(tmp_path / "m.gguf", preset, seed=0, ggml_type="Q8_0"), preset)
    assert load_preset("tiny").with_overrides(layers=2).ple_layer == 1


def test_small_is_a_few_hundred_mb_at_q8_0():
    preset = load_preset("small")
    sizes = {t: estimate_size(preset, t) for t in TYPES}
    assert 200e6 < sizes["Q8_0"] < 600e6
    assert sizes["Q8_0"] < sizes["BF16"] == sizes["F16"] < sizes["F32"]
    geometry = preset_geometry(preset)
    assert (geometry.n_embd, geometry.n_expert, geometry.n_vocab) == (512, 64, 32768)


def test_scaled_flash_next_writes_and_loads_at_full_width(tmp_path):
    preset = load_preset("flash-next").with_overrides(layers=2, experts=8, vocab=1024, ngram_vocab=1000)
    path = write_model(tmp_path / "f.gguf", preset, seed=0, ggml_type="Q8_0")
    assert abs(path.stat().st_size - estimate_size(preset, "Q8_0")) <= 4096
    _same_geometry(path, preset)
    got = open_model(path).geometry
    assert (got.n_embd, got.hc_dim, got.conv_dim, got.n_expert_used, got.ple.head_dim) == (2560, 10240, 10240, 8, 160)


def test_full_flash_next_plan():
    preset = load_preset("flash-next")
    plan = build_plan(preset, quants.Q8_0)
    types = {t.name: (t.shape, t.ggml_type) for t in plan.tensors}
    assert types["per_layer_token_embd.weight"] == ((160, 320001536), quants.Q8_0)
    assert types["blk.1.ple_conv1d.weight"][1] == quants.F16  # ne0 = 4
    assert types["blk.3.attn_q.weight"] == ((2560, 12288), quants.Q8_0)
    assert types["blk.0.ffn_gate_exps.weight"] == ((2560, 640, 512), quants.Q8_0)
    assert types["blk.0.ffn_gate_inp_shexp.weight"][1] == quants.F32
    assert sum(1 for t in plan.tensors if t.name.endswith("attn_q.weight")) == 12
    assert 150 * 2**30 < plan.file_bytes() < 200 * 2**30


def test_ple_constants_reproduce_the_spec_and_the_converter():
    flash = load_preset("flash-next")
    assert flash.ple_multipliers == SPEC_MULTIPLIERS
    assert flash.ple_vocab_sizes == SPEC_VOCAB
    assert list(preset_geometry(flash).ple.head_offsets) == SPEC_OFFSETS
    # the fixture's config (vocab 512, base 1000) through transformers + converter
    fixture_like = dataclasses.replace(load_preset("tiny"), vocab_size=512, ngram_vocab_size_base=1000)
    assert fixture_like.ple_multipliers == [4295158889763781, 17440218147737327, 1270917961434445]
    assert fixture_like.ple_vocab_sizes == [1009, 1013, 1019, 1021]


@pytest.mark.parametrize("outtype", ["q8_0", "bf16", "f32"])
def test_type_rules_match_the_converter(outtype, fixture_dir):
    reader = gguf.GGUFReader(fixture_dir / f"model-{outtype}.gguf")
    file_type = {"q8_0": quants.Q8_0, "bf16": quants.BF16, "f32": quants.F32}[outtype]
    for t in reader.tensors:
        shape = tuple(int(s) for s in t.shape)
        assert fill.tensor_type(t.name, shape, file_type) == int(t.tensor_type), t.name


def test_metadata_keys_and_types_match_the_converter(tmp_path, fixture_dir):
    def keys(path):
        fields = gguf.GGUFReader(path).fields
        return [(k, [t.name for t in f.types]) for k, f in fields.items() if not k.startswith("GGUF.")]

    ours = keys(write_model(tmp_path / "m.gguf", load_preset("tiny"), seed=0, ggml_type="Q8_0"))
    assert ours == keys(fixture_dir / "model-q8_0.gguf")  # tokenizer.ggml.merges included (synth/vocab.py)


def test_tensor_order_matches_the_converter(fixture_dir):
    ours = [t.name for t in build_plan(load_preset("tiny"), quants.F32).tensors]  # same layout as the fixture
    assert ours == [t.name for t in gguf.GGUFReader(fixture_dir / "model-f32.gguf").tensors]


def test_make_model_writes_and_refuses_overwrite(tmp_path):
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(make_model, [str(out), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert str(out) in result.stdout and "will write" in result.stderr
    _same_geometry(out, load_preset("tiny"))

    before = out.read_bytes()
    result = CliRunner().invoke(make_model, [str(out), "--seed", "4"])
    assert isinstance(result.exception, InputError) and "exists" in str(result.exception)
    assert out.read_bytes() == before
    result = CliRunner().invoke(make_model, [str(out), "--seed", "4", "--force", "--type", "q8_0"])
    assert result.exit_code == 0 and out.read_bytes() != before
    assert open_model(out).type_counts()["Q8_0"] > 0


def test_make_model_refuses_a_full_disk(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 9.5 * 2**30, 2**29))
    result = CliRunner().invoke(make_model, [str(tmp_path / "m.gguf"), "--preset", "small", "--type", "Q8_0"])
    assert isinstance(result.exception, InputError)
    message = str(result.exception)
    assert "0.50 GiB free" in message and "0.30 GiB" in message and "\n" not in message
    assert not (tmp_path / "m.gguf").exists()


def test_make_model_rejects_bad_overrides(tmp_path):
    result = CliRunner().invoke(make_model, [str(tmp_path / "m.gguf"), "--layers", "0"])
    assert isinstance(result.exception, InputError) and "--layers" in str(result.exception)


def test_a_changed_generator_names_a_new_default_model(tmp_path, monkeypatch):
    """The default model's name follows the generator's sources: an older strata's file is never taken for it."""
    from pathlib import Path

    before = default_model.default_name()
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (b"#" if self.name == "fill.py" else b""))
    assert default_model.default_name() != before


def test_default_model_is_generated_once(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    writes = []
    real_write = default_model.write_model
    monkeypatch.setattr(default_model, "write_model", lambda *a, **kw: writes.append(a) or real_write(*a, **kw))
    path = default_model.default_model_path()
    assert path == tmp_path / "cache" / f"qwen4exp-tiny-f32-seed0-{default_model.generator_tag()}.gguf"
    assert len(writes) == 1
    # no partial file left behind: the model, its checksum and the first-use lock
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, path.name + default_model.CHECKSUM_SUFFIX, f".{path.name}.lock"])
    _same_geometry(path, load_preset("tiny"))
    stamp = os.stat(path).st_mtime_ns

    def no_rewrite(*args, **kwargs):
        raise AssertionError("default model written twice")

    monkeypatch.setattr(default_model, "write_model", no_rewrite)
    assert default_model.default_model_path() == path and os.stat(path).st_mtime_ns == stamp
    assert default_model.resolve_model(None) == str(path)
    assert default_model.resolve_model("other.gguf") == "other.gguf"


def test_cache_dir_falls_back_to_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("STRATA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "strata"
