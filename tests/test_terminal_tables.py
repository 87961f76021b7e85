"""Tables on an 80-column terminal: no line wider than the terminal, no cell or header cut (`33.1…`); piped output
is the plain ASCII table, as wide as its content."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def on_terminal(*args, columns: int = 80, cwd=None) -> str:
    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), LINES="50", PYTHONPATH=str(REPO), TERM="xterm")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "strata_cli", *map(str, args)], stdout=follower,
                            stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=300)
    os.close(leader)
    assert proc.returncode == 0
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))


@pytest.mark.parametrize("args", [
    ["verify-bench", "--device", "cpu", "-r", 1, "--warmup", 0, "--window", "1,2,4,8,16,32,64"],
    ["verify-bench", "--device", "cpu", "-r", 1, "--warmup", 0, "--window", "1,2"],
    ["info"],
])
def test_terminal_tables_fit_80_columns_uncut(fixture_dir, args):
    text = on_terminal(args[0], fixture_dir / "model-f32.gguf", *args[1:])
    table_lines = [line for line in text.splitlines() if not line.startswith(("strata ", "model ", str(fixture_dir)))]
    assert max(len(line.rstrip()) for line in table_lines) <= 80, text
    assert "…" not in text, text
    if args[0] == "verify-bench":
        assert "ms/window" in text and "speedup vs T=1" in text.replace("\r", "")


def test_piped_tables_are_plain_and_whole(fixture_dir):
    proc = subprocess.run([sys.executable, "-m", "strata_cli", "verify-bench", str(fixture_dir / "model-f32.gguf"),
                           "--device", "cpu", "-r", "1", "--warmup", "0", "--window", "1,2,4,8,16,32,64"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="80"),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "+---" in proc.stdout and "…" not in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) > 80  # the table's own width, not the terminal's


def header_runs(fixture_dir, tmp_path):
    """Commands whose tables carry one-line provenance headers, run in tmp_path (short relative file names)."""
    m = fixture_dir / "model-f32.gguf"
    q8 = fixture_dir / "model-q8_0.gguf"
    for args in (["make-profile", m, "--random", 8, "-o", "p.yaml", "--trace", "t.npz"],
                 ["logprobs", m, "--random", 6, "--device", "cpu", "-o", "d.tsv"]):
        proc = subprocess.run([sys.executable, "-m", "strata_cli", *map(str, args)], cwd=tmp_path, capture_output=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
        assert proc.returncode == 0, proc.stderr
    return {
        "verify-bench": ["verify-bench", m, "--device", "cpu", "-r", 1, "--warmup", 0, "--window", "1,2"],
        "logprobs": ["logprobs", m, "--random", 5, "--device", "cpu", "--format", "table"],
        "compare": ["compare", "d.tsv", "d.tsv"],
        "compare-models": ["compare-models", m, q8, "--random", 5, "--device", "cpu"],
        "profile-info": ["profile-info", "p.yaml", m],
        "cache-sim": ["cache-sim", "t.npz", "--slots", "4,16"],
        "info": ["info", m],
    }


@pytest.mark.parametrize("columns", [80, 60])
@pytest.mark.parametrize("command", ["verify-bench", "logprobs", "compare", "compare-models", "profile-info",
                                     "cache-sim", "info"])
def test_header_lines_fold_to_the_terminal_width(fixture_dir, tmp_path, command, columns):
    """The provenance lines above a table (`strata 0.1.0 @ abc | device cpu (...) | numpy ...`, `model ... | depth
    32 | ...`) fold at field boundaries to the terminal's width: no line wider than it, and every word and number of
    the piped (unfolded) lines is whole on the terminal; piped output keeps them one line each."""
    args = header_runs(fixture_dir, tmp_path)[command]
    text = on_terminal(*args, columns=columns, cwd=tmp_path).replace("\r", "")
    lines = [line.rstrip() for line in text.splitlines()]
    assert max(len(line) for line in lines) <= columns, "\n".join(line for line in lines if len(line) > columns)
    piped = subprocess.run([sys.executable, "-m", "strata_cli", *map(str, args)], cwd=tmp_path, capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert piped.returncode == 0, piped.stderr
    out = piped.stdout.splitlines()
    head = out[:next(i for i, line in enumerate(out) if line.startswith("+-") or line.startswith(" "))]
    assert head  # and, for most, wider than the terminal: the folding is what this tests
    assert any(len(line) > columns for line in head) or command in ("compare", "cache-sim", "profile-info")
    words = set(text.split())
    for line in head:
        for word in line.split():
            assert word in words, (word, line, text)
