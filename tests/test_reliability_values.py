"""Issue 9, class 1: no wrong number that looks like success.

NaN/Inf in weights (a norm, an expert, the router, ssm_a, a Q8_0 scale, BF16 NaN, 3e38) stop `logprobs` with one
line naming the first layer and stage that went non-finite and exit 4 (or, with --allow-nonfinite, write the rows
marked); `verify-bench` refuses to time such a model; `compare` refuses NaN dumps. Metadata values are checked
(finite, positive, in range, consistent with the tensors present). A fuzz over the fixture's numeric metadata
holds every outcome to: one error line and exit 1, or exit 0 with finite logprobs.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from gguf import GGUFValueType as VT

from gguf_edit import read_keys, rewrite_gguf
from strata_cli.cli import main
from strata_cli.errors import EXIT_NONFINITE, ModelFileError
from strata_cli.model.gguf_file import open_model

P = "qwen4exp."


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(result, code: int, *needles: str) -> str:
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.startswith("strata: error: ")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def poison(src, dst, name: str, change) -> str:
    """Copy src to dst and rewrite tensor `name`'s raw data in place with change(raw view)."""
    shutil.copyfile(src, dst)
    reader = GGUFReader(str(dst), "r+")
    tensor = next(t for t in reader.tensors if t.name == name)
    change(tensor.data)
    tensor.data.flush()
    del reader
    return str(dst)


def set_all(value):
    def change(raw):
        raw[...] = value
    return change


def q8_scales_nan(raw):
    """Every Q8_0 block's f16 scale (its first 2 bytes) set to NaN (0x7E00)."""
    blocks = raw.reshape(-1, 34)
    blocks[:, 0] = 0x00
    blocks[:, 1] = 0x7E


def bf16_nan(raw):
    pairs = raw.reshape(-1, 2)
    pairs[:, 0], pairs[:, 1] = 0xC0, 0x7F  # 0x7FC0 little-endian: a quiet NaN


# id -> (fixture file, tensor, change, substring of the stage the line must name)
WEIGHT_CASES = {
    "norm-nan": ("model-f32.gguf", "blk.0.ssm_norm.weight", set_all(np.nan), "layer 0 Gated DeltaNet"),
    "router-nan": ("model-f32.gguf", "blk.1.ffn_gate_inp.weight", set_all(np.nan), "layer 1 router"),
    "expert-nan": ("model-f32.gguf", "blk.1.ffn_gate_exps.weight", set_all(np.nan), "layer 1 routed experts"),
    "ssm_a-nan": ("model-f32.gguf", "blk.0.ssm_a", set_all(np.nan), "layer 0 Gated DeltaNet"),
    "ssm_a-inf": ("model-f32.gguf", "blk.2.ssm_a", set_all(np.inf), "layer 2 Gated DeltaNet"),
    "huge-3e38": ("model-f32.gguf", "blk.0.attn_qkv.weight", set_all(3e38), "layer 0"),
    "embedding-inf": ("model-f32.gguf", "token_embd.weight", set_all(np.inf), "token_embd"),
    "output-nan": ("model-f32.gguf", "output.weight", set_all(np.nan), "output.weight"),
    "q8-scale-nan": ("model-q8_0.gguf", "blk.0.attn_qkv.weight", q8_scales_nan, "layer 0"),
    "bf16-nan": ("model-bf16.gguf", "blk.1.ffn_gate_exps.weight", bf16_nan, "layer 1 routed experts"),
}


@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_nonfinite_weights_stop_logprobs_naming_the_stage(case, fixture_dir, tmp_path):
    src, name, change, stage = WEIGHT_CASES[case]
    bad = poison(fixture_dir / src, tmp_path / f"{case}.gguf", name, change)
    out = tmp_path / "dump.tsv"
    result = cli("logprobs", bad, "--random", 12, "--device", "cpu", "-o", out)
    line = error_line(result, EXIT_NONFINITE, "non-finite", stage)
    assert "positions 0..3" in line
    assert not out.exists()  # nothing that looks like a dump
    bench = cli("verify-bench", bad, "--window", "1,2", "-r", 1, "--device", "cpu")
    error_line(bench, EXIT_NONFINITE, "non-finite", stage)


def test_allow_nonfinite_writes_marked_rows_and_compare_refuses_them(fixture_dir, tmp_path):
    bad = poison(fixture_dir / "model-f32.gguf", tmp_path / "bad.gguf", "blk.1.ffn_gate_inp.weight",
                 set_all(np.nan))
    dump = tmp_path / "nan.tsv"
    result = cli("logprobs", bad, "--random", 9, "--device", "cpu", "--allow-nonfinite", "-o", dump)
    assert result.exit_code == 0, result.output
    assert "strata: warning: non-finite values" in result.stderr
    text = dump.read_text()
    assert "# nonfinite: positions 0..3 (first in layer 1 router" in text
    json_result = cli("logprobs", bad, "--random", 9, "--device", "cpu", "--allow-nonfinite", "--format", "json")
    assert '"nonfinite": true' in json_result.stdout
    good = tmp_path / "good.tsv"
    assert cli("logprobs", fixture_dir / "model-f32.gguf", "--random", 9, "--device", "cpu", "-o", good).exit_code == 0
    for a, b in ((dump, good), (good, dump), (dump, dump)):
        error_line(cli("compare", a, b, "--min-top1", "0.99"), EXIT_NONFINITE, "non-finite logprobs")


def test_compare_models_refuses_a_nan_model(fixture_dir, tmp_path):
    bad = poison(fixture_dir / "model-f32.gguf", tmp_path / "bad.gguf", "blk.2.ssm_a", set_all(np.inf))
    good = fixture_dir / "model-f32.gguf"
    for a, b in ((good, bad), (bad, good)):
        error_line(cli("compare-models", a, b, "--random", 9), EXIT_NONFINITE, str(bad), "layer 2 Gated DeltaNet")


def test_compare_refuses_hand_made_nan_and_inf_dumps(fixture_dir, tmp_path):
    good = tmp_path / "good.tsv"
    assert cli("logprobs", fixture_dir / "model-f32.gguf", "--random", 9, "--topk", 2, "--device", "cpu",
               "-o", good).exit_code == 0
    lines = good.read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if not line.startswith("#")]
    for field, value in ((2, "nan"), (4, "inf"), (2, "-inf"), (8, "3:nan")):
        edited = list(lines)
        parts = edited[rows[3]].split("\t")
        parts[field] = value
        edited[rows[3]] = "\t".join(parts)
        bad = tmp_path / f"bad{field}{value}.tsv"
        bad.write_text("\n".join(edited) + "\n")
        error_line(cli("compare", good, bad), EXIT_NONFINITE, str(bad), "position 3")
    # lp_extra is nan by design where there is no extra id: that alone is not refused
    edited = list(lines)
    parts = edited[rows[3]].split("\t")
    parts[6] = parts[7] = "nan"
    edited[rows[3]] = "\t".join(parts)
    (tmp_path / "extra.tsv").write_text("\n".join(edited) + "\n")
    assert cli("compare", good, tmp_path / "extra.tsv").exit_code == 0


# ---------------------------------------------------------------- metadata values

def _misaligned(src, dst):
    shutil.copyfile(src, dst)
    reader = GGUFReader(str(dst), "r+")
    offset = reader.tensors[3].field.parts[-1]
    offset[0] += 4
    offset.flush()
    return dst


# id -> (rewrite_gguf kwargs, or a callable (src, dst) -> path; substrings of the one error line)
METADATA_CASES = {
    "rope-nan": (dict(set_keys={P + "rope.freq_base": (float("nan"), VT.FLOAT32)}), ["rope.freq_base", "finite"]),
    "rope-inf": (dict(set_keys={P + "rope.freq_base": (float("inf"), VT.FLOAT32)}), ["rope.freq_base", "finite"]),
    "rope-zero": (dict(set_keys={P + "rope.freq_base": (0.0, VT.FLOAT32)}), ["rope.freq_base", "> 0"]),
    "rope-negative": (dict(set_keys={P + "rope.freq_base": (-10000.0, VT.FLOAT32)}), ["rope.freq_base", "> 0"]),
    "eps-inf": (dict(set_keys={P + "attention.layer_norm_rms_epsilon": (float("inf"), VT.FLOAT32)}),
                ["layer_norm_rms_epsilon", "finite"]),
    "eps-nan": (dict(set_keys={P + "attention.layer_norm_rms_epsilon": (float("nan"), VT.FLOAT32)}),
                ["layer_norm_rms_epsilon", "finite"]),
    "eos-minus-one": (dict(set_keys={"tokenizer.ggml.eos_token_id": (-1, VT.INT32)}),
                      ["tokenizer.ggml.eos_token_id", "-1", "0..511"]),
    "eos-past-vocab": (dict(set_keys={"tokenizer.ggml.eos_token_id": (512, VT.UINT32)}),
                       ["tokenizer.ggml.eos_token_id", "512", "0..511"]),
    "ple-layers-missing": (dict(drop_keys=[P + "ple.layers"]), ["PLE tensors", "ple.layers", "missing"]),
    "head-vocab-size-zero": (dict(set_keys={P + "ple.head_vocab_sizes": ([1009, 1013, 0, 1021], VT.ARRAY,
                                                                         VT.UINT64)}),
                             ["ple.head_vocab_sizes", "head 2 has size 0"]),
    "multiplier-zero": (dict(set_keys={P + "ple.layer_multipliers": ([0, 3, 5], VT.ARRAY, VT.UINT64)}),
                        ["ple.layer_multipliers", "multiplier 0 = 0"]),
    "alignment-not-power-of-two": (dict(set_keys={"general.alignment": (48, VT.UINT32)}),
                                   ["general.alignment", "power of two"]),
    "misaligned-offset": (_misaligned, ["not a multiple of the alignment 32"]),
    "transposed-token_embd": (None, ["token_embd.weight", "transposed"]),
}


def _transposed(src, dst):
    reader = GGUFReader(str(src))
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    from gguf import GGMLQuantizationType as QT

    return rewrite_gguf(src, dst, replace_tensors={"token_embd.weight": (np.asarray(embd.data).T.copy(), QT.F32)})


@pytest.mark.parametrize("case", list(METADATA_CASES))
def test_bad_metadata_values(case, fixture_dir, tmp_path):
    edits, needles = METADATA_CASES[case]
    src, dst = fixture_dir / "model-f32.gguf", tmp_path / f"{case}.gguf"
    if case == "transposed-token_embd":
        bad = _transposed(src, dst)
    elif callable(edits):
        bad = edits(src, dst)
    else:
        bad = rewrite_gguf(src, dst, **edits)
    with pytest.raises(ModelFileError) as info:
        open_model(bad)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert "ple.eos_token_id" not in str(info.value) or case.startswith("eos")
    error_line(cli("logprobs", bad, "--random", 6, "--device", "cpu"), 1, str(bad), *needles)


def _fuzz_values(value, vtype):
    """Hostile replacements of one scalar: zero, one, negative, huge, and for floats nan/inf/-inf/3e38."""
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return [(v, vtype) for v in (0.0, -1.0, float("nan"), float("inf"), -float("inf"), 3e38, 1e-30)]
    if vtype in (VT.UINT32, VT.UINT64, VT.INT32, VT.INT64, VT.UINT16, VT.UINT8):
        out = [(0, vtype), (1, vtype), (int(value) + 1, vtype), (2**31 - 1, VT.UINT32), (-1, VT.INT32)]
        return out
    return []


def _fuzz_cases(fixture_dir):
    keys = read_keys(fixture_dir / "model-f32.gguf")
    rng = np.random.default_rng(9)
    cases = []
    for key, (value, vtype, _) in keys.items():
        if not key.startswith(P) and key not in ("tokenizer.ggml.eos_token_id", "general.alignment"):
            continue
        for new in _fuzz_values(value, vtype):
            cases.append((key, new))
    picked = rng.choice(len(cases), size=min(60, len(cases)), replace=False)
    return [cases[i] for i in sorted(picked)]


def test_fuzz_metadata_values_never_give_silent_nan(fixture_dir, tmp_path):
    """Each hostile scalar gives one error line and exit 1 (or 4), or a run whose logprobs are all finite."""
    outcomes = {"error": 0, "ok": 0}
    for i, (key, (value, vtype)) in enumerate(_fuzz_cases(fixture_dir)):
        bad = rewrite_gguf(fixture_dir / "model-f32.gguf", tmp_path / f"f{i}.gguf", set_keys={key: (value, vtype)})
        result = cli("logprobs", bad, "--random", 6, "--device", "cpu", "--ctx", 16)
        assert "Traceback" not in result.output, (key, value, result.output)
        assert isinstance(result.exception, (SystemExit, type(None))), (key, value, repr(result.exception))
        if result.exit_code == 0:
            rows = [line.split("\t") for line in result.stdout.splitlines() if not line.startswith("#")]
            assert rows and all(math.isfinite(float(r[2])) and math.isfinite(float(r[4])) for r in rows), (key, value)
            outcomes["ok"] += 1
        else:
            error_line(result, result.exit_code)
            assert result.exit_code in (1, EXIT_NONFINITE), (key, value, result.exit_code)
            outcomes["error"] += 1
        bad.unlink()
    assert outcomes["error"] > 20 and outcomes["ok"] > 0, outcomes


def test_default_model_same_size_corruption_is_rebuilt(tmp_cache):
    from strata_cli.synth import default_model

    path = default_model.default_model_path()
    good = path.read_bytes()
    data = bytearray(good)
    data[-100] ^= 0x40  # a weight byte: same size, different model
    path.write_bytes(bytes(data))
    result = cli("info", "--format", "json")
    assert result.exit_code == 0, result.output
    assert path.read_bytes() == good
