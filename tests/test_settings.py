"""strata_cli/settings.py: every STRATA_* variable parsed in one table; a bad value is one line naming it (exit 2)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from strata_cli import settings

BAD = {"STRATA_TRACEBACK": "yes", "STRATA_VERIFY_PROFILE": "on", "STRATA_WATCHDOG_S": "soon",
       "STRATA_TEST_VERIFY_STALL": "x", "STRATA_POOL_NATIVE": "off", "STRATA_POOL_THREADS": "0"}
FREE_TEXT = {"STRATA_CACHE", "STRATA_GIT_COMMIT"}  # any string is a path / a commit name


def test_the_table_is_complete():
    assert set(BAD) | FREE_TEXT == {s.name for s in settings.ALL}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_one_line_naming_the_variable_exit_2(name, tmp_path):
    from strata_cli.cli import main

    result = CliRunner().invoke(main, ["info", str(tmp_path / "missing.gguf")], env={name: BAD[name]})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"strata: error: {name}={BAD[name]!r}: expected"), lines


def test_defaults_and_values():
    values = {s.name: s.value({}) for s in settings.ALL}
    assert values["STRATA_WATCHDOG_S"] == 60.0 and values["STRATA_TEST_VERIFY_STALL"] == 0
    assert values["STRATA_POOL_NATIVE"] is True
    assert settings.TEST_VERIFY_STALL.value({"STRATA_TEST_VERIFY_STALL": "3"}) == 3
    assert settings.WATCHDOG_S.value({"STRATA_WATCHDOG_S": "2.5"}) == 2.5
    assert settings.POOL_NATIVE.value({"STRATA_POOL_NATIVE": ""}) is True  # empty is unset
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(settings.SettingError, match=f"STRATA_WATCHDOG_S='{bad}'"):
            settings.WATCHDOG_S.value({"STRATA_WATCHDOG_S": bad})


def test_no_other_module_reads_a_strata_variable():
    from pathlib import Path
    import re

    root = Path(settings.__file__).parent
    for path in root.rglob("*.py"):
        if path.name != "settings.py":
            assert not re.search(r"environ[^\n]*\"STRATA_", path.read_text()), path
