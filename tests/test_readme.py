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
