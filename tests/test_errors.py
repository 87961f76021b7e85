"""Bad input gets one clear line naming the culprit and exit 1: never a traceback, a hang or a wrong answer.

Each case checks (a) the library raises the right StrataError subclass with a message naming the file / tensor /
key / value, and (b) the CLI prints exactly one `strata: error: ...` line on stderr and exits 1. The bad GGUFs are
rewritten from the shared qwen4exp-tiny fixture (tests/gguf_edit.py) into tmp_path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import GGUFValueType as VT

from gguf_edit import read_keys, rewrite_gguf
from strata_cli.cli import main
from strata_cli.errors import DeviceUnavailable, InputError, ModelFileError, StrataError
from strata_cli.model.gguf_file import open_model

P = "qwen4exp."


# ---------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def q8(fixture_dir):
    return fixture_dir / "model-q8_0.gguf"


@pytest.fixture(scope="module")
def f32(fixture_dir):
    return fixture_dir / "model-f32.gguf"


@pytest.fixture(scope="module")
def ref_tokens(fixture_dir):
    return np.load(fixture_dir / "reference.npz")["tokens"]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, *needles: str, code: int = 1) -> str:
    """Exit `code` (1 bad input, 2 a bad option value), exactly one non-empty stderr line `strata: error: ...`
    containing every needle, no traceback."""
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("strata: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def library_error(exc_type, fn, *needles: str) -> str:
    with pytest.raises(exc_type) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg.strip(), msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def write_tokens(tmp_path, text: str, name: str = "tokens.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the rewrite helper itself

def test_rewrite_unmodified_is_identical_and_gives_the_same_logits(tmp_path, fixture_dir, ref_tokens):
    from strata_cli.engine.reference import ReferenceEngine

    for name in ("model-q8_0.gguf", "model-f32.gguf"):
        src, dst = fixture_dir / name, tmp_path / name
        rewrite_gguf(src, dst)
        assert read_keys(dst) == read_keys(src)  # values with their types and array element types
        a, b = GGUFReader(str(src)), GGUFReader(str(dst))
        assert [(t.name, t.tensor_type, t.shape.tolist()) for t in a.tensors] == \
            [(t.name, t.tensor_type, t.shape.tolist()) for t in b.tensors]
        for ta, tb in zip(a.tensors, b.tensors):
            assert np.asarray(ta.data).tobytes() == np.asarray(tb.data).tobytes(), ta.name
        assert dst.read_bytes() == src.read_bytes()  # GGUFWriter wrote the converter's file: byte for byte
        logits = []
        for path in (src, dst):
            engine = ReferenceEngine(open_model(path), n_ctx=64)
            result = engine.run(ref_tokens[:16], 0)
            logits.append(result.logits)
        assert logits[0].shape == (16, 512)
        np.testing.assert_array_equal(logits[0], logits[1])


def test_rewrite_keeps_key_types_and_sets_new_ones(tmp_path, q8):
    keys = read_keys(q8)
    assert keys[P + "ple.head_offsets"][1:] == (VT.ARRAY, VT.UINT64)
    assert keys[P + "attention.recurrent_layers"][1:] == (VT.ARRAY, VT.BOOL)
    assert keys[P + "attention.compress_ratios"][1:] == (VT.ARRAY, VT.INT32)
    assert keys["tokenizer.ggml.tokens"][1:] == (VT.ARRAY, VT.STRING)
    out = rewrite_gguf(q8, tmp_path / "edit.gguf", drop_keys=[P + "rope.dimension_sections"],
                       set_keys={P + "expert_used_count": (3, VT.UINT32),
                                 "test.new_key": ([1, 2, 3], VT.ARRAY, VT.INT64)},
                       drop_tensors=["blk.0.ssm_a"],
                       replace_tensors={"blk.0.ssm_dt.bias": (np.arange(4, dtype=np.float16), QT.F16)})
    got = read_keys(out)
    assert P + "rope.dimension_sections" not in got
    assert got[P + "expert_used_count"] == (3, VT.UINT32, None)
    assert got["test.new_key"] == ([1, 2, 3], VT.ARRAY, VT.INT64)
    assert list(got)[:3] == list(keys)[:3]  # order kept
    tensors = {t.name: t for t in GGUFReader(str(out)).tensors}
    assert "blk.0.ssm_a" not in tensors
    assert tensors["blk.0.ssm_dt.bias"].tensor_type == QT.F16
    assert np.asarray(tensors["blk.0.ssm_dt.bias"].data).tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------- bad model files

def _q8_1_attn_q(q8):
    """attn_q as Q8_1 (ggml's activation type: never a weight in a file, and strata reads no such tensor)."""
    t = next(t for t in GGUFReader(str(q8)).tensors if t.name == "blk.3.attn_q.weight")
    rows, n_in = int(t.shape[1]), int(t.shape[0])
    raw = np.zeros((rows, n_in // 32 * 40), np.uint8)
    return dict(replace_tensors={"blk.3.attn_q.weight": (raw, QT.Q8_1)})


# id -> (rewrite_gguf kwargs, or a callable of the q8 path returning them; substrings the message must contain)
MODEL_CASES = {
    "wrong-architecture": (dict(arch="llama"), ["architecture 'llama'", "qwen4exp"]),
    "missing-tensor-attn_q": (dict(drop_tensors=["blk.3.attn_q.weight"]), ["missing tensor 'blk.3.attn_q.weight'"]),
    "missing-tensor-ple-table": (dict(drop_tensors=["per_layer_token_embd.weight"]),
                                 ["missing tensor 'per_layer_token_embd.weight'"]),
    "missing-tensor-token_embd": (dict(drop_tensors=["token_embd.weight"]), ["missing tensor 'token_embd.weight'"]),
    "misshaped-1d": (dict(replace_tensors={"blk.0.ssm_a": (np.zeros(5, np.float32), QT.F32)}),
                     ["tensor 'blk.0.ssm_a'", "[5]", "[4]"]),
    "misshaped-2d": (dict(replace_tensors={"blk.3.attn_q.weight": (np.zeros((256, 128), np.float32), QT.F32)}),
                     ["tensor 'blk.3.attn_q.weight'", "[128, 256]", "[128, 512]"]),
    "misshaped-ple-table": (dict(replace_tensors={"per_layer_token_embd.weight": (np.zeros((100, 32), np.float32),
                                                                                  QT.F32)}),
                            ["tensor 'per_layer_token_embd.weight'", "[32, 100]"]),
    "recurrent-layers-vs-interval": (
        dict(set_keys={P + "attention.recurrent_layers": ([True, True, False, True, True, True, True, False],
                                                          VT.ARRAY, VT.BOOL)}),
        ["'qwen4exp.attention.recurrent_layers'", "full_attention_interval"]),
    "compress-ratios-length": (dict(set_keys={P + "attention.compress_ratios": ([0, 0, 0, 4], VT.ARRAY, VT.INT32)}),
                               ["'qwen4exp.attention.compress_ratios'", "[0, 0, 0, 4]", "8"]),
    "experts-used-over-count": (dict(set_keys={P + "expert_used_count": (17, VT.UINT32)}),
                                ["'qwen4exp.expert_used_count' = 17", "expert_count 16"]),
    "value-length-vs-key-length": (dict(set_keys={P + "attention.value_length": (32, VT.UINT32)}),
                                   ["'qwen4exp.attention.value_length' = 32", "key_length 64"]),
    "ple-offsets-not-running-sum": (
        dict(set_keys={P + "ple.head_offsets": ([0, 1009, 2023, 3041], VT.ARRAY, VT.UINT64)}),
        ["'qwen4exp.ple.head_offsets'", "head 2 offset 2023", "2022"]),
    "missing-key-embedding_length": (dict(drop_keys=[P + "embedding_length"]),
                                     ["missing metadata key 'qwen4exp.embedding_length'"]),
    "missing-key-block_count": (dict(drop_keys=[P + "block_count"]), ["missing metadata key 'qwen4exp.block_count'"]),
    "unsupported-type-q8_1": (_q8_1_attn_q, ["tensor 'blk.3.attn_q.weight'", "Q8_1"]),
    "unsupported-type-i32": (dict(replace_tensors={"blk.0.ssm_a": (np.zeros(4, np.int32), QT.I32)}),
                             ["tensor 'blk.0.ssm_a'", "I32"]),
    # wrong value types used to escape as a bare ValueError (traceback)
    "key-wrong-type-float": (dict(set_keys={P + "attention.layer_norm_rms_epsilon": ("x", VT.STRING)}),
                             ["'qwen4exp.attention.layer_norm_rms_epsilon' = 'x'", "number"]),
    "key-wrong-type-int": (dict(set_keys={P + "embedding_length": ("128", VT.STRING)}),
                           ["'qwen4exp.embedding_length' = '128'", "integer"]),
    "key-wrong-element-type": (dict(set_keys={P + "ple.head_offsets": (["a", "b", "c", "d"], VT.ARRAY, VT.STRING)}),
                               ["'qwen4exp.ple.head_offsets'", "element 0", "integer"]),
    "eos-wrong-type": (dict(set_keys={"tokenizer.ggml.eos_token_id": ("x", VT.STRING)}),
                       ["'tokenizer.ggml.eos_token_id' = 'x'"]),
    # a corrupt block_count sized per-layer tables before anything was checked (2**32 - 1: minutes and GBs)
    "huge-block-count": (dict(set_keys={P + "block_count": (2**26, VT.UINT32)},
                              drop_keys=[P + "attention.recurrent_layers"]),
                         ["'qwen4exp.block_count' = 67108864", "blk.67108863"]),
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_bad_model_file(case, q8, tmp_path):
    edits, needles = MODEL_CASES[case]
    if callable(edits):
        edits = edits(q8)
    bad = rewrite_gguf(q8, tmp_path / f"{case}.gguf", **edits)
    library_error(ModelFileError, lambda: open_model(bad), str(bad), *needles)
    assert_one_line_error(cli("info", bad), str(bad), *needles)


@pytest.mark.parametrize("case", ["missing-tensor-attn_q", "compress-ratios-length", "wrong-architecture"])
def test_bad_model_file_logprobs_and_bench(case, q8, tmp_path):
    edits, needles = MODEL_CASES[case]
    bad = rewrite_gguf(q8, tmp_path / f"{case}.gguf", **edits)
    assert_one_line_error(cli("logprobs", bad, "--random", 5, "--device", "cpu"), str(bad), *needles)
    assert_one_line_error(cli("verify-bench", bad, "-r", 1, "--window", 1, "--device", "cpu"),
                          str(bad), *needles)


def _cut_points(path) -> dict[str, int]:
    r = GGUFReader(str(path))
    fields = [f for name, f in r.fields.items() if not name.startswith("GGUF.")]
    size = path.stat().st_size
    tokens = r.fields["tokenizer.ggml.tokens"]
    return {
        "magic-only": 4,
        "in-version": 6,
        "in-counts": 12,
        "in-first-key": fields[0].offset + 5,
        "in-metadata": fields[len(fields) // 2].offset + 3,
        "in-string-array": tokens.offset + 1000,
        "in-tensor-info": r.tensors[10].field.offset + 7,
        "before-data": r.data_offset - 1,
        "at-data-start": r.data_offset,
        "in-first-tensor": r.data_offset + 100,
        "in-tensor-data-middle": size // 2,
        "last-byte-missing": size - 1,
    }


@pytest.fixture(scope="module")
def cut_points(q8):
    return _cut_points(q8)


@pytest.mark.parametrize("where", ["magic-only", "in-version", "in-counts", "in-first-key", "in-metadata",
                                   "in-string-array", "in-tensor-info", "before-data", "at-data-start",
                                   "in-first-tensor", "in-tensor-data-middle", "last-byte-missing"])
def test_truncated_file(where, q8, cut_points, tmp_path):
    cut = cut_points[where]
    bad = tmp_path / f"cut-{where}.gguf"
    bad.write_bytes(q8.read_bytes()[:cut])
    msg = library_error(ModelFileError, lambda: open_model(bad), str(bad), "truncated", f"{cut}")
    if cut > cut_points["in-tensor-info"]:  # past the tensor infos: the message names the tensor cut off
        assert "tensor '" in msg, msg
    assert_one_line_error(cli("info", bad), str(bad), "truncated")


def test_not_a_gguf(tmp_path):
    bad = write_tokens(tmp_path, "hello, this is a text file\nnot a model\n", "notes.gguf")
    library_error(ModelFileError, lambda: open_model(bad), str(bad), "not a GGUF file")
    assert_one_line_error(cli("info", bad), str(bad), "not a GGUF file")
    assert_one_line_error(cli("logprobs", bad, "--random", 5, "--device", "cpu"), str(bad), "not a GGUF file")


def test_short_prefix_of_the_magic(q8, tmp_path):
    bad = tmp_path / "ggu.gguf"
    bad.write_bytes(q8.read_bytes()[:3])
    assert_one_line_error(cli("info", bad), str(bad), "not a GGUF file")


def test_empty_file(tmp_path):
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"")
    library_error(ModelFileError, lambda: open_model(bad), str(bad), "not a GGUF file", "0 bytes")
    assert_one_line_error(cli("info", bad), str(bad), "not a GGUF file", "0 bytes")


def test_nonexistent_path(tmp_path):
    bad = tmp_path / "no-such-model.gguf"
    library_error(ModelFileError, lambda: open_model(bad), str(bad), "no such file")
    assert_one_line_error(cli("info", bad), str(bad), "no such file")
    assert_one_line_error(cli("verify-bench", bad, "--device", "cpu"), str(bad), "no such file")


def test_directory_as_model(tmp_path):
    library_error(ModelFileError, lambda: open_model(tmp_path), str(tmp_path), "directory")
    assert_one_line_error(cli("info", tmp_path), str(tmp_path), "directory")


# ---------------------------------------------------------------- compress_ratios all zero: warning, dense attention

def test_compress_ratios_all_zero_warns_and_runs_dense(f32, tmp_path, ref_tokens):
    from strata_cli.engine.reference import ReferenceEngine

    dense = rewrite_gguf(f32, tmp_path / "ratios0.gguf",
                         set_keys={P + "attention.compress_ratios": ([0] * 8, VT.ARRAY, VT.INT32)})
    result = cli("info", dense)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("strata: warning:"), result.stderr
    assert "compress_ratios" in warnings[0] and str(dense) in warnings[0]
    assert "dense (ratio 0)" in result.stdout
    assert "compress_ratios" not in cli("info", f32).stderr  # the converted file has ratio 4: no warning

    m_dense, m_qsa = open_model(dense), open_model(f32)
    assert m_dense.geometry.compress_ratios == (0,) * 8 and m_dense.geometry.warnings
    assert m_qsa.geometry.compress_ratios == (0, 0, 0, 4, 0, 0, 0, 4) and not m_qsa.geometry.warnings
    tokens = ref_tokens[:28]
    logits = [ReferenceEngine(m, n_ctx=64).run(tokens, 0).logits for m in (m_dense, m_qsa)]
    diff = np.abs(logits[0] - logits[1]).max(axis=1)
    # a query at position p sees p+1 tokens: QSA (budget 16 = 4 blocks of 4) is sparse from p = 19 on
    assert diff[:19].max() <= 1e-5, diff[:19]
    assert (diff[19:] > 1e-2).all(), diff[19:]


# ---------------------------------------------------------------- tokens, windows, options

def test_token_id_out_of_range(q8, tmp_path):
    from strata_cli.model.tokens import check_range, read_token_file

    path = write_tokens(tmp_path, "1 2 999999 4\n")
    tokens = read_token_file(path)
    library_error(InputError, lambda: check_range(tokens, 512, str(path)), str(path), "999999", "0..511")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--device", "cpu"), str(path), "999999", "0..511")


def test_negative_token_id(q8, tmp_path):
    from strata_cli.model.tokens import check_range, read_token_file

    path = write_tokens(tmp_path, "5, -3, 7\n")
    library_error(InputError, lambda: check_range(read_token_file(path), 512, str(path)), "-3", "0..511")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--device", "cpu"), str(path), "-3")


def test_engine_rejects_bad_token_ids(q8):
    from strata_cli.engine.reference import ReferenceEngine

    engine = ReferenceEngine(open_model(q8), n_ctx=16)
    library_error(InputError, lambda: engine.run([1, 512], 0), "512", "0..511")
    library_error(InputError, lambda: engine.run([-1], 0), "-1")


def test_window_past_the_context(q8):
    from strata_cli.engine.reference import ReferenceEngine

    engine = ReferenceEngine(open_model(q8), n_ctx=8)
    library_error(InputError, lambda: engine.run(np.arange(9), 0), "context 8")
    library_error(InputError, lambda: ReferenceEngine(open_model(q8), n_ctx=5000), "5000", "4096")
    assert_one_line_error(cli("logprobs", q8, "--ctx", 8, "--random", 20, "--device", "cpu"), "context 8", "--ctx")
    assert_one_line_error(cli("verify-bench", q8, "--ctx", 8, "--window", 4, "-r", 1, "--device", "cpu"),
                          "context 8", "raise --ctx, up to the model's context_length 4096", code=2)


def test_empty_token_file(q8, tmp_path):
    from strata_cli.model.tokens import read_token_file

    path = write_tokens(tmp_path, "\n \n")
    library_error(InputError, lambda: read_token_file(path), str(path), "no token ids")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--device", "cpu"), str(path), "no token ids")


def test_token_file_with_a_non_integer(q8, tmp_path):
    from strata_cli.model.tokens import read_token_file

    path = write_tokens(tmp_path, "1 2 3\n4 five 6\n")
    library_error(InputError, lambda: read_token_file(path), f"{path}:2", "'five'")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--device", "cpu"), f"{path}:2", "'five'")
    path = write_tokens(tmp_path, "1 2.5\n", "float.txt")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--device", "cpu"), f"{path}:1", "'2.5'")


def test_single_token_and_missing_token_file(q8, tmp_path):
    path = write_tokens(tmp_path, "7\n")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--device", "cpu"), str(path), "at least 2")
    missing = tmp_path / "nope.txt"
    assert_one_line_error(cli("logprobs", q8, "--tokens", missing, "--device", "cpu"), str(missing))


def test_tokens_and_random_both_or_neither(q8, tmp_path):
    path = write_tokens(tmp_path, "1 2 3\n")
    assert_one_line_error(cli("logprobs", q8, "--tokens", path, "--random", 5, "--device", "cpu"),
                          "--tokens", "--random", code=2)
    assert_one_line_error(cli("logprobs", q8, "--device", "cpu"), "--tokens", "--random", code=2)


@pytest.mark.parametrize("spec, needle", [("0", "--window '0'"), ("a,b", "--window 'a,b'"), ("2,-1", "--window"),
                                          (",", "empty item"), ("1,,2", "empty item"), ("4,4", "4 given twice"),
                                          ("1,2,1,2", "1, 2 given twice")])
def test_verify_bench_bad_window_list(spec, needle, q8):
    from strata_cli.commands._common import parse_window_list

    library_error(InputError, lambda: parse_window_list(spec), needle)
    assert_one_line_error(cli("verify-bench", q8, "--window", spec, "-r", 1, "--device", "cpu"), needle, code=2)


@pytest.mark.parametrize("extra", [99999, 512, -1])
def test_extra_id_out_of_range(extra, q8):
    assert_one_line_error(cli("logprobs", q8, "--random", 5, "--extra-id", extra, "--device", "cpu"),
                          f"--extra-id {extra}", "0..511", code=2)


def test_unwritable_output(q8, tmp_path):
    out = tmp_path / "no-such-dir" / "dump.tsv"
    assert_one_line_error(cli("logprobs", q8, "--random", 5, "--device", "cpu", "-o", out), str(out))


def test_device_gpu_without_gpu(q8):
    from strata_cli.engine import gpu_probe, make_engine

    if gpu_probe()[1] is None:
        pytest.skip("a usable GPU engine is here: --device gpu is not an error")
    library_error(DeviceUnavailable, lambda: make_engine(open_model(q8), "gpu"), "--device cpu")
    assert issubclass(DeviceUnavailable, StrataError)
    assert_one_line_error(cli("logprobs", q8, "--random", 5, "--device", "gpu"), "GPU", "--device cpu")
    assert_one_line_error(cli("verify-bench", q8, "-r", 1, "--window", 1, "--device", "gpu"),
                          "GPU", "--device cpu")


def test_info_json_on_a_good_file_parses(q8):
    result = cli("info", q8, "--format", "json")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["meta"]["geometry"]["layers"] == 8
    assert doc["meta"]["tensor_count"] == 214
    assert doc["meta"]["warnings"] == []
