"""`strata quantize`: the converter's own files reproduced byte for byte from the fixture's F32 file, make-model's
types of one seed one model, and one line with the right exit code for every refusal."""

from __future__ import annotations

import filecmp

import pytest
from click.testing import CliRunner

from strata_cli.cli import main


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("outtype, converted", [("Q8_0", "model-q8_0.gguf"), ("BF16", "model-bf16.gguf")])
def test_quantize_reproduces_the_converter(fixture_dir, tmp_path, outtype, converted):
    """The converter's --outtype q8_0 / bf16 of the same checkpoint: every tensor (and the header) byte for byte."""
    out = tmp_path / "out.gguf"
    result = cli("quantize", fixture_dir / "model-f32.gguf", out, "--type", outtype, "--format", "json")
    assert result.exit_code == 0, result.output
    assert filecmp.cmp(out, fixture_dir / converted, shallow=False)


def test_quantize_from_bf16_is_readable(fixture_dir, tmp_path):
    out = tmp_path / "q.gguf"
    assert cli("quantize", fixture_dir / "model-bf16.gguf", out, "--type", "q4_0", "--format", "json").exit_code == 0
    assert cli("info", out, "--format", "json").exit_code == 0


@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_1", "TQ2_0", "F16", "Q4_K", "Q6_K", "IQ2_XS", "IQ1_M", "NVFP4"])
def test_make_model_type_is_the_f32_model_quantized(tmp_path, ggml_type):
    f32, direct, quantized = tmp_path / "f32.gguf", tmp_path / "direct.gguf", tmp_path / "quantized.gguf"
    for out, kind in ((f32, "F32"), (direct, ggml_type)):
        assert cli("make-model", out, "--type", kind, "--seed", 7, "--format", "json").exit_code == 0
    assert cli("quantize", f32, quantized, "--type", ggml_type, "--format", "json").exit_code == 0
    assert filecmp.cmp(direct, quantized, shallow=False)


def test_quantize_refusals(fixture_dir, tmp_path):
    f32 = fixture_dir / "model-f32.gguf"
    out = tmp_path / "o.gguf"
    cases = [
        ((f32, out), 2, "give one of --type and --recipe"),
        ((f32, out, "--type", "Q8_0", "--recipe", "q2_k-mix"), 2, "give one of --type and --recipe"),
        ((fixture_dir / "model-q8_0.gguf", out, "--type", "Q4_0"), 1, "quantize reads F32, F16 and BF16"),
        ((tmp_path / "missing.gguf", out, "--type", "Q8_0"), 1, "no such file"),
        ((f32, tmp_path / "nodir" / "o.gguf", "--type", "Q8_0"), 1, "no such directory"),
        ((f32, f32, "--type", "Q8_0", "--force"), 1, "is IN itself"),
    ]
    for args, code, words in cases:
        result = cli("quantize", *args)
        assert result.exit_code == code, (args, result.output)
        assert words in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()
    out.write_bytes(b"x")
    result = cli("quantize", f32, out, "--type", "Q8_0")
    assert result.exit_code == 1 and "file exists (use --force" in result.output
    assert cli("quantize", f32, out, "--type", "Q8_0", "--force", "--format", "json").exit_code == 0
