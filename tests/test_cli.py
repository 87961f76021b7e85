"""The root group: lazy command listing, --version, and the error policy (one line, exit codes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from strata_cli import __version__
from strata_cli.cli import COMMANDS, main
from strata_cli.errors import InputError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def runner():
    return CliRunner()


def _register(monkeypatch, name, callback):
    monkeypatch.setitem(main.commands, name, click.Command(name, callback=callback))


def test_help_lists_every_command_with_its_short_help(runner):
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    listed = " ".join(result.stdout.split())  # help text wraps long lines
    for name in ("info", "make-model", "logprobs", "compare", "verify-bench", "graph-nodes", "profile"):
        _, short_help = COMMANDS[name]
        assert f"{name} {short_help}" in listed


def test_help_imports_no_command_module_and_no_numpy():
    code = ("import sys\nfrom strata_cli.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('strata_cli.commands.') or m in ('numpy', 'rich', 'cupy'))\n"
            "print('LOADED', loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "LOADED []" in out


def test_version(runner):
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"strata {__version__}"


def test_python_m_strata_cli():
    done = subprocess.run([sys.executable, "-m", "strata_cli", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0
    assert done.stdout.strip() == f"strata {__version__}"


def test_every_listed_command_loads_with_the_listed_short_help(runner):
    import click

    listing = " ".join(runner.invoke(main, ["--help"]).stdout.split())  # the root help wraps long lines
    for name, (_, short_help) in COMMANDS.items():
        command = main.get_command(click.Context(main), name)
        assert isinstance(command, click.Command), name
        assert command.get_short_help_str(200) == short_help, name
        assert f"{name} {short_help}" in listing


def test_strata_error_is_one_line_exit_1_without_traceback(runner, monkeypatch):
    def boom():
        raise InputError("window 0 is out of range\n(second line)")

    _register(monkeypatch, "boom", boom)
    monkeypatch.delenv("STRATA_TRACEBACK", raising=False)
    result = runner.invoke(main, ["boom"])
    assert result.exit_code == 1
    assert result.stderr == "strata: error: window 0 is out of range; (second line)\n"
    assert "Traceback" not in result.output


def test_strata_traceback_env_reraises(runner, monkeypatch):
    def boom():
        raise InputError("bad")

    _register(monkeypatch, "boom", boom)
    monkeypatch.setenv("STRATA_TRACEBACK", "1")
    result = runner.invoke(main, ["boom"])
    assert isinstance(result.exception, InputError)
    assert "strata: error" not in result.output


def test_keyboard_interrupt_exits_130(runner, monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    _register(monkeypatch, "interrupted", interrupted)
    result = runner.invoke(main, ["interrupted"])
    assert result.exit_code == 130
    assert "Aborted" not in result.output


def test_broken_pipe_is_quiet(runner, monkeypatch):
    def piped():
        raise BrokenPipeError

    _register(monkeypatch, "piped", piped)
    result = runner.invoke(main, ["piped"])
    assert result.exit_code == 1
    assert result.stderr == ""


def test_usage_errors_keep_click_exit_2(runner):
    assert runner.invoke(main, ["no-such-command"]).exit_code == 2
    assert runner.invoke(main, ["--no-such-option"]).exit_code == 2


def test_other_exceptions_are_not_hidden(runner, monkeypatch):
    def bug():
        raise ZeroDivisionError("a bug")

    _register(monkeypatch, "bug", bug)
    result = runner.invoke(main, ["bug"])
    assert isinstance(result.exception, ZeroDivisionError)


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = 'pip install -e ".[test]" && python -m pytest -q -rs'  # -rs: every skip says why
    assert command in readme
    assert command in ci.splitlines()
    assert "export STRATA_REQUIRE_FIXTURES=1" in ci.splitlines()  # CI has ../shared: a fixture skip is an error
    assert (REPO / ".ci" / "run").stat().st_mode & 0o111
