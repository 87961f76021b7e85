"""Shell completion through click's `_STRATA_COMPLETE` (README: "Shell completion")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from strata_cli.cli import main


def complete(words: str, cword: int) -> list[str]:
    result = CliRunner().invoke(main, [], prog_name="strata", env={
        "_STRATA_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    assert result.exit_code == 0, result.output
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


def test_commands_options_and_choices_complete():
    assert complete("strata verify-b", 1) == ["verify-bench"]
    assert complete("strata compare", 1) == ["compare", "compare-models"]
    assert complete("strata verify-bench --acc", 2) == ["--acceptance", "--acceptance-from"]
    assert complete("strata info --format ", 3) == ["table", "json", "jsonl", "csv", "md"]
    # deprecated spellings keep working but are not offered
    assert "--windows" not in complete("strata verify-bench --", 2)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell):
    result = CliRunner().invoke(main, [], prog_name="strata", env={"_STRATA_COMPLETE": f"{shell}_source"})
    assert result.exit_code == 0 and "_STRATA_COMPLETE" in result.stdout
