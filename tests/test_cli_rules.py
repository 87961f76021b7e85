"""Issue 19's one rules for every command: a bad option value exits 2, a bad input file 1, each in one line; option
names that mean one thing (stall-test --stall-window/--window, compare-models --device auto, the GPU-only commands
naming what they need)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from test_reliability_values import cli, poison, set_all
from test_reliability_values import error_line as one_line

from strata_cli.cli import main


@pytest.fixture(scope="module")
def model(fixture_dir):
    return fixture_dir / "model-f32.gguf"


BAD_OPTION_VALUES = {  # exit 2: the option's value is wrong, whatever the files are
    "bench-expert-cache": (["verify-bench", "--expert-cache", "foo", "--device", "cpu"], "--expert-cache"),
    "bench-pcie-frac": (["verify-bench", "--pcie-frac", "2", "--device", "cpu"], "--pcie-frac"),
    "bench-window-repeated": (["verify-bench", "--window", "4,4", "--device", "cpu"], "4 given twice"),
    "bench-window-empty-item": (["verify-bench", "--window", "1,,2", "--device", "cpu"], "empty item"),
    "bench-depth-past-model": (["verify-bench", "-d", "5000", "-r", "1", "--window", "1", "--device", "cpu"],
                               "the model's context_length is 4096: lower -d/--depth"),
    "bench-depth-past-ctx": (["verify-bench", "-d", "100", "--ctx", "64", "-r", "1", "--window", "1",
                              "--device", "cpu"], "raise --ctx, up to the model's context_length 4096"),
    "ctx-past-model": (["verify-bench", "--ctx", "8192", "--device", "cpu"], "context 8192 outside 1..4096"),
    "profile-seed-negative": (["make-profile", "--seed", "-1", "--random", "4", "-o", "p.yaml"], "--seed"),
    "profile-seed-too-big": (["make-profile", "--seed", str(2**64), "--random", "4", "-o", "p.yaml"], "--seed"),
    "logprobs-window-zero": (["logprobs", "--window", "0", "--random", "4"], "--window"),
    "cm-two-token-sources": (["compare-models", "--random", "4", "--text", "x"], "exactly one"),
}


@pytest.mark.parametrize("name", sorted(BAD_OPTION_VALUES))
def test_bad_option_values_exit_2(name, model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, needle = BAD_OPTION_VALUES[name]
    models = [model, model] if args[0] == "compare-models" else [model]
    args = [args[0], *models, *args[1:]]
    one_line(cli(*args), 2, needle)


@pytest.mark.parametrize("args, needle", [
    (["--layers", "0"], "--layers 0"), (["--preset", "nope"], "--preset 'nope'"),
    (["--experts", "0"], "--experts"), (["--type", "F32", "--recipe", "q2_k-mix"], "--type and --recipe"),
])
def test_make_model_bad_option_values_exit_2(args, needle, tmp_path):
    one_line(cli("make-model", tmp_path / "m.gguf", *args), 2, needle)
    assert not (tmp_path / "m.gguf").exists()


def test_bad_input_files_exit_1(model, tmp_path):
    one_line(cli("logprobs", model, "--tokens", tmp_path / "none.txt", "--device", "cpu"), 1, "none.txt")
    one_line(cli("verify-bench", tmp_path / "none.gguf", "--device", "cpu"), 1, "none.gguf")
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: [1, 2]\n")
    one_line(cli("profile-info", bad), 1, str(bad))


@pytest.mark.parametrize("command", ["graph-nodes", "profile", "stall-test"])
def test_gpu_only_commands_name_what_they_need(command, model):
    from strata_cli.engine import gpu_probe

    if gpu_probe()[1] is None:
        pytest.skip("a usable GPU: the command runs")
    line = one_line(cli(command, model), 1, f"{command} runs on the GPU only", "CuPy")
    assert "--device" not in line  # they take no --device option


def test_stall_test_option_names():
    from strata_cli.commands.stall_test import command

    names = {opt: param.name for param in command.params for opt in param.opts}
    assert names["--stall-window"] == "stall_at" and names["--window"] == "n_tokens"
    result = cli("stall-test", "--tokens", "3", "--stall-window", "1", "/nonexistent.gguf")
    assert "--tokens is deprecated: use --window" in result.stderr


def test_compare_models_device_defaults_to_auto():
    from strata_cli.commands.compare_models import command as compare_models
    from strata_cli.commands.logprobs import command as logprobs

    def default(command):
        return next(p.default for p in command.params if p.name == "device")

    assert default(compare_models) == default(logprobs) == "auto"


def test_one_overwrite_policy(model, tmp_path):
    """Every output file is refused when it exists, unless --force (README "Commands")."""
    dump, profile = tmp_path / "d.tsv", tmp_path / "p.yaml"
    runs = {dump: ["logprobs", model, "--random", 4, "--device", "cpu", "-o", dump],
            profile: ["make-profile", model, "--random", 4, "-o", profile]}
    for path, args in runs.items():
        path.write_text("old\n")
        one_line(cli(*args), 1, str(path), "file exists (use --force")
        assert path.read_text() == "old\n"
        assert cli(*args, "--force").exit_code == 0
        assert path.read_text() != "old\n"


def test_dash_means_stdout_or_one_refusal(model, tmp_path):
    result = cli("make-profile", model, "--random", 8, "-o", "-")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# strata expert profile") and "format: strata-expert-profile" in result.stdout
    assert "expert cache by profile" in result.stderr  # the report goes to stderr
    yaml_path = tmp_path / "p.yaml"
    yaml_path.write_text(result.stdout)
    back = CliRunner().invoke(main, ["profile-info", "-", "--format", "json"], input=result.stdout)
    assert back.exit_code == 0, back.output
    one_line(cli("make-model", "-"), 2, "'OUT': '-' (stdout) is not supported")
    one_line(cli("quantize", model, "-", "--type", "Q8_0"), 2, "'OUT': '-' (stdout) is not supported")
    assert not (tmp_path / "-").exists()


def test_profile_info_takes_the_model_as_an_argument(model, tmp_path):
    import json

    profile = tmp_path / "p.yaml"
    assert cli("make-profile", model, "--random", 8, "-o", profile).exit_code == 0
    by_argument = cli("profile-info", profile, model, "--format", "json")
    by_option = cli("profile-info", profile, "--model", model, "--format", "json")
    assert by_argument.exit_code == by_option.exit_code == 0
    rows = json.loads(by_argument.stdout)["rows"]
    assert rows == json.loads(by_option.stdout)["rows"] and "vram_gib" in rows[0]
    one_line(cli("profile-info", profile, model, "--model", tmp_path / "other.gguf"), 2, "give the model once")


def test_compare_reads_json_and_jsonl_dumps_with_kld(fixture_dir, tmp_path):
    import json

    dumps = {}
    for fmt, name in (("jsonl", "model-f32.gguf"), ("json", "model-q8_0.gguf")):
        dumps[fmt] = tmp_path / f"d.{fmt}"
        result = cli("logprobs", fixture_dir / name, "--random", 10, "--device", "cpu", "--format", fmt,
                     "--full-dist", "-o", dumps[fmt])
        assert result.exit_code == 0, result.output
    for a, b in ((dumps["jsonl"], dumps["json"]), (dumps["jsonl"], dumps["jsonl"])):
        result = cli("compare", a, b, "--format", "json")
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)["meta"]["summary"]
        assert summary["rows"] == 9 and summary["divergence"]["kld_mean"] >= 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(dumps["jsonl"].read_text().splitlines()[0] + "\n{not json\n")
    one_line(cli("compare", bad, dumps["json"]), 1, f"{bad}:2")


def test_json_dumps_carry_verify_bench_provenance(fixture_dir):
    import json

    f32, q8 = fixture_dir / "model-f32.gguf", fixture_dir / "model-q8_0.gguf"
    bench = json.loads(cli("verify-bench", f32, "--device", "cpu", "--window", 1, "-r", 1, "--warmup", 0,
                           "--format", "json").stdout)["meta"]["provenance"]
    dump = json.loads(cli("logprobs", f32, "--random", 4, "--device", "cpu", "--format", "json").stdout)
    pairs = json.loads(cli("compare-models", f32, q8, "--random", 4, "--device", "cpu", "--format", "json").stdout)
    logprobs_prov, compare_prov = dump["meta"]["provenance"], pairs["meta"]["provenance"]
    shared = {"timestamp", "command", "seed", "n_ctx", "model", "model_bytes", "model_sha256", "model_types"}
    assert shared <= set(bench) and shared <= set(logprobs_prov)
    assert logprobs_prov["model_sha256"] == bench["model_sha256"]
    assert logprobs_prov["command"].startswith("strata logprobs ")
    assert compare_prov["base_sha256"] == bench["model_sha256"] and compare_prov["other_sha256"] != bench["model_sha256"]
    env_keys = set(bench) - shared - {"depth", "warmup", "repetitions", "acceptance", "acceptance_per_position",
                                      "acceptance_source", "mode", "tokens"}
    assert env_keys <= set(logprobs_prov) and env_keys <= set(compare_prov)


@pytest.mark.parametrize("tensor", ["blk.0.attn_qkv.weight", "blk.2.ffn_gate_inp.weight"])
def test_make_profile_refuses_nan_routing(fixture_dir, tmp_path, tensor):
    """Values that go NaN while make-profile counts: exit 4 as logprobs, and no profile written."""
    model = poison(fixture_dir / "model-f32.gguf", tmp_path / "nan.gguf", tensor, set_all(float("nan")))
    out = tmp_path / "p.yaml"
    one_line(cli("make-profile", model, "--random", 16, "-o", out), 4, "non-finite", "no profile written")
    assert not out.exists()


@pytest.mark.parametrize("command", ["verify-bench", "logprobs", "compare-models"])
def test_expert_profile_is_checked_on_any_device(command, model, tmp_path):
    """The numpy engine ignores the tiers, but a missing or malformed --expert-profile is still one line, exit 1."""
    models = [model, model] if command == "compare-models" else [model]
    extra = ["--random", 4] if command != "verify-bench" else ["-r", 1, "--window", 1]
    missing = tmp_path / "missing.yaml"
    one_line(cli(command, *models, "--device", "cpu", *extra, "--expert-profile", missing), 1, str(missing))
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: [unclosed\n")
    one_line(cli(command, *models, "--device", "cpu", *extra, "--expert-profile", bad), 1, str(bad))


def test_strp_whose_table_contradicts_its_ranked_pairs(model, tmp_path):
    import struct

    import numpy as np

    from strata_cli.tiers.expert_profile import STRP_HEADER

    good = tmp_path / "p.bin"
    assert cli("make-profile", model, "--random", 16, "-o", good).exit_code == 0
    data = bytearray(good.read_bytes())
    _, _, n_layers, n_expert, _, n_ranked = STRP_HEADER.unpack_from(data)
    ranked = np.frombuffer(bytes(data), "<u2", 2 * n_ranked, STRP_HEADER.size).reshape(-1, 2)
    table_at = STRP_HEADER.size + 4 * n_ranked

    def with_table(values) -> bytes:
        out = bytearray(data)
        for (layer, expert), value in zip(ranked, values):
            struct.pack_into("<i", out, table_at + 4 * (int(layer) * n_expert + int(expert)), value)
        return bytes(out)

    counts_path = tmp_path / "counts.bin"  # a count table in the ranked order: accepted
    counts_path.write_bytes(with_table(range(n_ranked, 0, -1)))
    assert cli("profile-info", counts_path, "--format", "json").exit_code == 0
    rising = tmp_path / "rising.bin"  # counts that rise along the ranked order contradict it
    rising.write_bytes(with_table(range(1, n_ranked + 1)))
    one_line(cli("profile-info", rising), 1, str(rising), "contradicts the ranked pairs")
