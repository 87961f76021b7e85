"""Progress bars: drawn on a terminal's stderr, nothing at all when stderr is piped or redirected."""

from __future__ import annotations

import io

from click.testing import CliRunner
from rich.console import Console

from strata_cli.cli import main
from strata_cli.report.progress import byte_progress, step_progress, timed_phase


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100), buf


def test_step_progress_draws_on_a_terminal_only():
    for terminal in (True, False):
        con, buf = _console(terminal)
        with step_progress("timing windows", total=3, console=con) as update:
            for i in range(3):
                update(i + 1, description=f"T = {i}")
        assert ("T = " in buf.getvalue() or "timing windows" in buf.getvalue()) is terminal
        if not terminal:
            assert buf.getvalue() == ""


def test_byte_progress_quiet_off_a_terminal():
    con, buf = _console(False)
    with byte_progress("writing", console=con) as update:
        update(10, 100)
    assert buf.getvalue() == ""


def test_a_timed_phase_prints_one_line_with_its_time_or_its_failure(monkeypatch):
    """Off a terminal: no spinner, one `load:` line per phase (what it did, its seconds); a phase that raises after
    FAILED_NOTE_S says after how long; quiet prints nothing."""
    import re
    import time

    import pytest

    from strata_cli.report import progress

    con, buf = _console(False)
    with timed_phase("dense weights uploaded", console=con) as phase:
        time.sleep(0.02)
        phase["what"] = "dense weights uploaded (9.01 GiB)"
    with pytest.raises(RuntimeError):
        with timed_phase("a quick refusal", console=con):
            raise RuntimeError("bad profile")  # under FAILED_NOTE_S: its error is the one line
    monkeypatch.setattr(progress, "FAILED_NOTE_S", 0.01)
    with pytest.raises(RuntimeError):
        with timed_phase("warm-up window", console=con):
            time.sleep(0.02)
            raise RuntimeError("boom")
    with timed_phase("arena", console=con, quiet=True):
        pass
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    m = re.fullmatch(r"load: dense weights uploaded \(9\.01 GiB\) in (\d+\.\d\d) s", lines[0])
    assert m and float(m.group(1)) >= 0.02
    assert re.fullmatch(r"load: warm-up window failed after \d+\.\d\d s", lines[1])
    con, buf = _console(True)
    with timed_phase("bringing in", console=con):
        pass
    assert "load: bringing in in " in buf.getvalue()


def test_commands_write_no_progress_to_a_pipe(tmp_path):
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(main, ["make-model", str(out), "--layers", "4", "--experts", "4", "--vocab", "64"])
    assert result.exit_code == 0
    result = CliRunner().invoke(main, ["verify-bench", str(out), "--device", "cpu", "-r", "1", "-d", "2",
                                       "--window", "1", "--format", "csv"])
    assert result.exit_code == 0 and result.stderr == ""  # no bar, no spinner, no escape codes
    result = CliRunner().invoke(main, ["logprobs", str(out), "--random", "9", "--device", "cpu"])
    assert result.exit_code == 0 and "\x1b" not in result.stderr and "━" not in result.stderr
