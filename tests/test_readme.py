"""README.md documents every command, every option, every environment variable the code reads, and the exit
codes."""

from __future__ import annotations

import re
from pathlib import Path

import click

from strata_cli import settings
from strata_cli.cli import COMMANDS, main

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _section(name: str) -> str:
    match = re.search(rf"^### `strata {re.escape(name)}\b.*?(?=^### |^## )", README, re.S | re.M)
    assert match, f"README has no section for strata {name}"
    return match.group(0)


def test_every_option_of_every_command_is_documented():
    for name in COMMANDS:
        command = main.get_command(click.Context(main), name)
        text = _section(name)
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            for opt in param.opts + param.secondary_opts:
                assert re.search(rf"`[^`]*{re.escape(opt)}\b", text), f"strata {name} {opt}"


def test_every_environment_variable_is_documented():
    names = set()
    for path in (REPO / "strata_cli").rglob("*.py"):
        names |= set(re.findall(r"environ(?:\.get)?\(\s*\"([A-Z_]+)\"", path.read_text()))
        names |= set(re.findall(r"environ\[\"([A-Z_]+)\"\]", path.read_text()))
        names |= set(re.findall(r"^\w*ENV\w* = \"([A-Z_]+)\"", path.read_text(), re.M))  # TRACEBACK_ENV = "..."
    names |= {setting.name for setting in settings.ALL}
    names |= {"_STRATA_COMPLETE", "STRATA_FIXTURES", "STRATA_REQUIRE_FIXTURES", "CI"}
    env_section = README[README.index("### Environment variables"):]
    for name in sorted(names):
        assert f"`{name}`" in env_section, name


def test_exit_codes_are_documented():
    from strata_cli import errors
    from strata_cli.commands.stall_test import STALL_RELEASED

    table = README[README.index("### Exit codes"):README.index("### Environment variables")]
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")} | {STALL_RELEASED}
    assert {0, 1, 2, 3, 4} <= codes
    for code in sorted(codes):
        row = "\n| 128+N |" if code > 128 else f"\n| {code} |"
        assert row in table and (code < 128 or str(code) in table), code


def _examples() -> list[str]:
    """Every `strata ...` line of the README's bash blocks (the pip/pytest/shell-completion lines excepted)."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", README, re.S | re.M):
        lines += [line.strip() for line in block.splitlines() if line.strip().startswith("strata ")]
    return lines


GPU_ONLY = ("graph-nodes", "stall-test", "profile")


def test_every_readme_example_runs_as_written(fixture_dir, tmp_path, monkeypatch):
    """In a folder holding the files the examples name (model.gguf and model-q8_0.gguf: the fixture's Q8_0;
    model-f32.gguf; a few texts and token files), every example exits 0; the GPU-only commands, on a machine
    without a GPU, exit 1 with the line saying they need one."""
    import os
    import shlex
    import subprocess
    import sys

    from strata_cli.engine import gpu_probe

    examples = _examples()
    assert len(examples) >= 15
    for name, source in (("model.gguf", "model-q8_0.gguf"), ("model-q8_0.gguf", "model-q8_0.gguf"),
                         ("model-f32.gguf", "model-f32.gguf")):
        (tmp_path / name).symlink_to(fixture_dir / source)
    text = "the quick brown fox jumps over the lazy dog. " * 6
    (tmp_path / "prompt.txt").write_text(text)
    (tmp_path / "wiki.txt").write_text(text)
    (tmp_path / "train.txt").write_text(" ".join(str(i * 7 % 509) for i in range(48)))
    (tmp_path / "held.txt").write_text(" ".join(str(i * 11 % 509) for i in range(24)))
    (tmp_path / "profiles").mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), STRATA_CACHE=str(tmp_path / "cache"))
    env.pop("STRATA_TRACEBACK", None)

    def strata(line: str):
        args = shlex.split(line)[1:]
        return subprocess.run([sys.executable, "-m", "strata_cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)

    # `compare a.tsv b.tsv` compares with a second dump of the same tokens
    assert strata("strata logprobs --random 64 --seed 0 --topk 8 --window 4 -o b.tsv").returncode == 0
    gpu = gpu_probe()[1] is None
    for line in examples:
        proc = strata(line)
        command = shlex.split(line)[1]
        if command in GPU_ONLY and not gpu:
            assert proc.returncode == 1 and f"{command} runs on the GPU only" in proc.stderr, (line, proc.stderr)
            continue
        assert proc.returncode == 0, (line, proc.stderr[-2000:])
