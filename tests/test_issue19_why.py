"""Issue 19's "Why": each rough edge a new user hit, as the user typed it, with the behaviour that replaced it. A
regression of any of them fails here (the wider rules are tested in test_cli_rules.py, test_stdio_args.py,
test_terminal_tables.py and test_info_header.py).

The commands run in a folder where `model.gguf` is the shared tiny fixture (F32), as in tests/test_readme.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from test_reliability_values import error_line as one_line

from strata_cli.cli import main

REPO = Path(__file__).resolve().parent.parent

# bullet 4, "the same kind of mistake exits 2 in one place and 1 in another": each is a bad option value now, exit
# 2 with one line naming it
BAD_VALUES = {
    "verify-bench --window 0": ("--window '0'",),
    "verify-bench --expert-cache foo": ("--expert-cache 'foo'",),
    "verify-bench --pcie-frac 2": ("--pcie-frac '2'",),
    "make-model m.gguf --layers 0": ("--layers 0",),
    "make-model m.gguf --preset nope": ("--preset 'nope'",),
    "logprobs --random 4 --extra-id -1": ("--extra-id -1 out of range",),
    "logprobs --random 4 --text hi": ("give exactly one of", "(got --random, --text)"),
    "logprobs --random 4 --window 0": ("'--window'",),
    "verify-bench -r 0": ("'-r' / '--repetitions'",),
    "make-profile --seed -1 --random 4 -o p.yaml": ("'--seed'", "-1 is not in the range"),
    f"make-profile --seed {2**64 + 1} --random 4 -o p.yaml": ("'--seed'",),
    "verify-bench --window 4,4": ("4 given twice",),
    "verify-bench --window 1,,2": ("an empty item",),
    # "-d 5000 says raise --ctx, and --ctx 8192 is then refused": the hint and the limit agree now
    "verify-bench -d 5000": ("the model's context_length is 4096: lower -d/--depth",),
    "verify-bench --ctx 8192": ("context 8192 outside 1..4096",),
    # bullet 3: `make-model -` wrote a file named `-`
    "make-model -": ("'OUT': '-' (stdout) is not supported",),
}

MODEL_FIRST = ("verify-bench", "logprobs", "make-profile")  # MODEL is their first argument


def run(cwd: Path, line: str, stdin: bytes = b""):
    words = line.split()
    if words[0] in MODEL_FIRST:
        words.insert(1, "model.gguf")
    if words[0] in ("verify-bench", "logprobs") and "--device" not in words:
        words += ["--device", "cpu"]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, words, input=stdin)
    finally:
        os.chdir(old)


@pytest.fixture
def folder(fixture_dir, tmp_path):
    (tmp_path / "model.gguf").symlink_to(fixture_dir / "model-f32.gguf")
    return tmp_path


@pytest.mark.parametrize("line", sorted(BAD_VALUES))
def test_bad_option_values_exit_2_in_one_line(folder, line):
    one_line(run(folder, line), 2, *BAD_VALUES[line])
    assert sorted(p.name for p in folder.iterdir()) == ["model.gguf"]  # nothing written, no file named '-'


# ---------------------------------------------------------------- the other bullets, one scenario each

def same_seed_types_are_one_model(folder):
    """Bullet 1: `make-model --type X` gave each type its own weights (F32 vs Q8_0 of seed 0: KLD 1.05, top-1 0 %),
    and there was no quantizing of an existing F32 file."""
    for line in ("make-model f32.gguf --type F32 --seed 0", "make-model q8.gguf --type Q8_0 --seed 0",
                 "quantize f32.gguf requant.gguf --type Q8_0"):
        assert run(folder, line).exit_code == 0, line
    assert (folder / "q8.gguf").read_bytes() == (folder / "requant.gguf").read_bytes()
    result = run(folder, "compare-models f32.gguf q8.gguf --random 64 --device cpu --format json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["meta"]["summary"]
    assert summary["kld_mean"] < 0.01 and summary["top1_agreement"] > 0.95, summary  # was 1.05 and 0


def tables_fit_80_columns(folder):
    """Bullet 2: tables were cut on an 80-column terminal (cells `33.1…`, headers `ms/w…`)."""
    from test_terminal_tables import on_terminal

    text = on_terminal("verify-bench", "model.gguf", "--device", "cpu", "-r", 1, "--warmup", 0, "--window",
                       "1,2,4,8,16,32,64", columns=80, cwd=folder).replace("\r", "")
    assert "…" not in text and max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    assert "ms/window" in text


def profile_to_stdout(folder):
    """Bullet 3: `make-profile -o -` failed ("unknown profile extension")."""
    result = run(folder, "make-profile --random 8 -o -")
    assert result.exit_code == 0, result.output
    assert "format: strata-expert-profile" in result.stdout


def compare_reads_jsonl_full_dist(folder):
    """Bullet 3: `compare` rejected a JSONL dump of `logprobs --format jsonl --full-dist`."""
    for name in ("a", "b"):
        result = run(folder, f"logprobs --random 8 --format jsonl --full-dist -o {name}.jsonl")
        assert result.exit_code == 0, result.output
    result = run(folder, "compare a.jsonl b.jsonl --format json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["meta"]["summary"]["divergence"]["kld_mean"] == 0


def gpu_only_commands_name_what_they_need(folder):
    """Bullet 5: the GPU-only commands' error suggested `--device cpu`, which they do not take."""
    from strata_cli.engine import gpu_probe

    if gpu_probe()[1] is None:
        pytest.skip("a usable GPU: graph-nodes runs")
    line = one_line(run(folder, "graph-nodes model.gguf"), 1, "graph-nodes runs on the GPU only")
    assert "--device" not in line


def stall_test_options_mean_one_thing(folder):
    """Bullet 5: `stall-test --window` was the index of the window to stall and `--tokens` the window size."""
    from strata_cli.commands.stall_test import command

    names = {opt: p.name for p in command.params for opt in p.opts}
    assert names["--stall-window"] == "stall_at" and names["--window"] == "n_tokens"
    assert "--tokens is deprecated: use --window" in run(folder, "stall-test model.gguf --tokens 3").stderr


def compare_models_defaults_to_auto(folder):
    """Bullet 5: `compare-models` defaulted to the CPU where logprobs/verify-bench default to auto."""
    from strata_cli.commands.compare_models import command

    assert next(p.default for p in command.params if p.name == "device") == "auto"


def profile_info_takes_the_model_as_an_argument(folder):
    """Bullet 5: `profile-info` took the model as `--model` only."""
    assert run(folder, "make-profile --random 8 -o p.yaml").exit_code == 0
    by_arg = run(folder, "profile-info p.yaml model.gguf --format json")
    by_opt = run(folder, "profile-info p.yaml --model model.gguf --format json")
    assert by_arg.exit_code == by_opt.exit_code == 0, by_arg.output
    assert json.loads(by_arg.stdout)["rows"] == json.loads(by_opt.stdout)["rows"]


def one_overwrite_policy(folder):
    """Bullet 5: make-model refused to overwrite without --force while `logprobs -o` and `make-profile -o`
    overwrote silently."""
    for line, name in (("logprobs --random 4 -o d.tsv", "d.tsv"), ("make-profile --random 4 -o p.yaml", "p.yaml"),
                       ("make-model m.gguf", "m.gguf")):
        (folder / name).write_text("old\n")
        one_line(run(folder, line), 1, name, "file exists (use --force")
        assert (folder / name).read_text() == "old\n"


def info_floats_and_parameter_counts(folder):
    """Bullet 6: eps showed as 9.999999974752427e-07 and there were no parameter counts (the 9.7 s of a 54.7 GB
    file: test_info_header.py's structure test)."""
    result = run(folder, "info model.gguf")
    assert result.exit_code == 0, result.output
    assert "1e-06" in result.stdout and "9.99999" not in result.stdout
    assert "parameters (" in result.stdout and "active per token)" in result.stdout
    meta = json.loads(run(folder, "info model.gguf --format json").stdout)["meta"]
    assert meta["geometry"]["eps"] == 1e-06 and meta["params_total"] > meta["params_active"] > 0


def logprobs_json_carries_provenance(folder):
    """Bullet 7: logprobs JSON dumps carried no timestamp, command or model sha256."""
    result = run(folder, "logprobs --random 4 --format json")
    assert result.exit_code == 0, result.output
    prov = json.loads(result.stdout)["meta"]["provenance"]
    assert prov["timestamp"] and prov["command"].startswith("strata logprobs ") and len(prov["model_sha256"]) == 64


def fresh_clone_says_how_to_get_fixtures(folder):
    """Bullet 8: on a fresh clone without ../shared, 264 tests skipped with nothing that said how to get them."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "STRATA_REQUIRE_FIXTURES")}
    env.update(STRATA_FIXTURES=str(folder / "no-fixtures"), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_info_header.py::test_fast_header_parse_gives_gguf_readers_values"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 tests skipped: a fixture is missing" in proc.stdout, proc.stdout
    assert "STRATA_FIXTURES" in proc.stdout and "../shared" in proc.stdout


SCENARIOS = [same_seed_types_are_one_model, tables_fit_80_columns, profile_to_stdout, compare_reads_jsonl_full_dist,
             gpu_only_commands_name_what_they_need, stall_test_options_mean_one_thing, compare_models_defaults_to_auto,
             profile_info_takes_the_model_as_an_argument, one_overwrite_policy, info_floats_and_parameter_counts,
             logprobs_json_carries_provenance, fresh_clone_says_how_to_get_fixtures]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_why_bullet(scenario, folder):
    scenario(folder)
