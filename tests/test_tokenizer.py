"""--text / --text-file through the GGUF's own tokenizer (tokenizer.ggml.*), checked against transformers with the
tokenizer.json the fixture GGUFs were converted from; models without a tokenizer fail in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import require_fixture

from strata_cli.cli import main
from strata_cli.errors import InputError
from strata_cli.model.gguf_file import open_model
from strata_cli.synth import load_preset, write_model
from strata_cli.model.tokenizer import build_tokenizer, encode

TEXTS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "The cat sat on the mat<|endoftext|>and then\n\n  it left!!  ",
    "ünïcödé 123 4567 \t tabs \r\n and CRLF",
    "it's we'll THEY'RE don't I'd",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|filler_3|>x<|filler_0|>",
    "   leading spaces and trailing   ",
    "数字 and emoji 🙂 mixed",
]


@pytest.fixture(scope="module")
def fixture_tokenizer(fixture_dir):
    tokenizer_dir = require_fixture(fixture_dir.parent / "qwen4exp-tiny-c" / "tokenizer.json", "tokenizer.json").parent
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return hf, open_model(fixture_dir / "model-f32.gguf")


def test_fixture_gguf_carries_the_tokenizer(fixture_tokenizer):
    _, model = fixture_tokenizer
    md = model.metadata
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen35"
    assert len(md["tokenizer.ggml.tokens"]) == 512 and len(md["tokenizer.ggml.merges"]) > 0
    doc = json.loads(CliRunner().invoke(main, ["info", model.path, "--format", "json"]).stdout)["meta"]
    assert doc["tokenizer"] == {"model": "gpt2", "pre": "qwen35", "tokens": 512,
                                "merges": len(md["tokenizer.ggml.merges"]), "eos": 509, "text_input": True}


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_tokenizer_matches_transformers(fixture_tokenizer, text):
    hf, model = fixture_tokenizer
    ours = encode(model.metadata, text, model.path)
    assert ours == hf.encode(text, add_special_tokens=False)
    assert build_tokenizer(model.metadata, model.path).decode(ours, skip_special_tokens=False) == \
        hf.decode(ours, skip_special_tokens=False)


def test_logprobs_text_and_text_file(fixture_tokenizer, tmp_path):
    hf, model = fixture_tokenizer
    text = TEXTS[0]
    ids = hf.encode(text, add_special_tokens=False)
    text_file = tmp_path / "t.txt"
    text_file.write_text(text, encoding="utf-8")
    outs = []
    for args in (["--text", text], ["--text-file", text_file]):
        result = CliRunner().invoke(main, ["logprobs", model.path, *map(str, args), "--device", "cpu",
                                           "--format", "csv"])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()[1:]
        assert [int(line.split(",")[1]) for line in lines] == ids[1:]  # the targets are the text's tokens
        outs.append(result.stdout)
    assert outs[0] == outs[1]


def test_generated_models_carry_a_byte_level_bpe(tmp_path):
    """make-model writes 256 byte tokens, merges up to EOS and control tokens after it: any text round-trips."""
    from strata_cli.synth.vocab import byte_tokens

    path = tmp_path / "m.gguf"
    write_model(path, load_preset("tiny").with_overrides(layers=4, experts=4), seed=1, ggml_type="F32")
    md = open_model(path).metadata
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == 512 and len(set(tokens)) == 512 and tokens[:256] == byte_tokens()
    assert len(md["tokenizer.ggml.merges"]) == 509 - 256 and tokens[509] == "<|endoftext|>"
    tok = build_tokenizer(md, str(path))
    for text in TEXTS:
        ids = encode(md, text, str(path))
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert encode(md, " the", str(path)) == [tokens.index("Ġt"), tokens.index("he")]
    assert encode(md, "a<|endoftext|>", str(path)) == [tokens.index("a"), 509]
    result = CliRunner().invoke(main, ["logprobs", str(path), "--text", TEXTS[0], "--device", "cpu",
                                       "--format", "csv"])
    assert result.exit_code == 0, result.output
    targets = [int(line.split(",")[1]) for line in result.stdout.splitlines()[1:]]
    assert targets == encode(md, TEXTS[0], str(path))[1:]


def test_a_model_without_a_tokenizer_is_one_line(tmp_path):
    path = tmp_path / "m.gguf"  # vocab 64 < 256 byte tokens: placeholder tokens, no merges
    write_model(path, load_preset("tiny").with_overrides(layers=4, experts=4, vocab=64), seed=1, ggml_type="F32")
    result = CliRunner().invoke(main, ["logprobs", str(path), "--text", "hello", "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith(f"strata: error: {path}: no tokenizer in the model")
    assert len(result.stderr.splitlines()) == 1 and "--tokens" in result.stderr
    doc = json.loads(CliRunner().invoke(main, ["info", str(path), "--format", "json"]).stdout)["meta"]
    assert doc["tokenizer"]["text_input"] is False and doc["tokenizer"]["merges"] == 0


@pytest.mark.parametrize("edit, needle", [
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model missing"),
    ({"tokenizer.ggml.model": "llama"}, "byte-level BPE"),
    ({"tokenizer.ggml.pre": "mystery"}, "'mystery'"),
    ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges missing"),
    ({"tokenizer.ggml.merges": ["nospace"]}, "merges[0]"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "token_type"),
])
def test_bad_tokenizer_metadata_is_one_line(edit, needle):
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.tokens": ["a", "b", "ab"],
          "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": [1, 1, 1]}
    md.update(edit)
    md = {k: v for k, v in md.items() if v is not None}
    with pytest.raises(InputError) as info:
        encode(md, "ab", "m.gguf")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_tiny_bpe_merges():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35",
          "tokenizer.ggml.tokens": ["a", "b", "Ġ", "ab", "Ġab"], "tokenizer.ggml.merges": ["a b", "Ġ ab"]}
    assert encode(md, "ab ab", "m") == [3, 4]
    assert np.array_equal(encode(md, "ba", "m"), [1, 0])
    with pytest.raises(InputError, match="empty"):
        encode(md, "", "m")

