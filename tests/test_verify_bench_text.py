"""verify-bench --tokens / --text / --text-file: the context and the windows follow the text."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.analysis.speculation import Acceptance
from strata_cli.analysis.window_timing import time_window


class _Engine:
    """What time_window drives: run/commit/reset and the positions, recording every window's ids."""

    max_t, n_ctx = 4, 12
    g = type("G", (), {"n_vocab": 1000})()

    def __init__(self):
        self.n_past, self.windows = 0, []

    def reset(self):
        self.n_past = 0
        self.windows.append("reset")

    def run(self, tokens, pos0):
        self.windows.append(("prefill", pos0, list(tokens)))

    def commit(self, n):
        self.n_past += n


def test_windows_read_the_text_in_order_and_wrap():
    text = np.arange(100, 130)
    engine = _Engine()
    seen = []

    def timer(engine, tokens, pos, n_keep):
        seen.append((pos, list(tokens), n_keep))
        engine.n_past += n_keep
        return 1.0, 1.0

    time_window(engine, 3, 6, Acceptance.assumed(0.7), depth=5, seed=1, timer=timer, warmup=0, text=text)
    assert engine.windows[:3] == ["reset", ("prefill", 0, [100, 101, 102, 103]), ("prefill", 4, [104])]
    cursor = 105
    for i, (pos, tokens, n_keep) in enumerate(seen):
        if pos == 5 and i:  # the context filled up: a new prefill read on from the cursor
            cursor = tokens[0]
        if cursor + 3 > 130:
            cursor = 100
        assert tokens == list(range(cursor, cursor + 3)), (i, seen)
        cursor += n_keep
    random_run = []
    time_window(_Engine(), 3, 2, Acceptance.assumed(0.7), 5, 1, lambda e, t, p, k: random_run.append(list(t))
                or (e.__setattr__("n_past", e.n_past + k), (1.0, 1.0))[1], warmup=0)
    rng = np.random.default_rng(1)
    rng.integers(0, 1000, 4), rng.integers(0, 1000, 1)  # the prefill's draws
    assert random_run[0] == list(rng.integers(0, 1000, 3))  # no text: the same seeded ids as before


def test_verify_bench_text_file_cpu(fixture_dir, tmp_path):
    model = str(fixture_dir / "model-f32.gguf")
    ids = np.load(fixture_dir / "reference.npz")["tokens"][:20]
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    res = CliRunner().invoke(main, ["verify-bench", model, "--device", "cpu", "-r", "1", "--warmup", "0",
                                    "--window", "2", "--depth", "4", "--tokens", str(tmp_path / "ids.txt"),
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["meta"]["provenance"]["tokens"] == f"{tmp_path / 'ids.txt'} (20 tokens)"
    short = CliRunner().invoke(main, ["verify-bench", model, "--device", "cpu", "-r", "1", "--window", "2",
                                      "--depth", "32", "--tokens", str(tmp_path / "ids.txt")])
    assert short.exit_code == 1 and "20 tokens; --depth and the largest --window need 34" in short.output
    both = CliRunner().invoke(main, ["verify-bench", model, "--device", "cpu", "--tokens", str(tmp_path / "ids.txt"),
                                     "--text", "hi"])
    assert both.exit_code == 2 and "give exactly one of" in both.output  # two token sources: usage error
