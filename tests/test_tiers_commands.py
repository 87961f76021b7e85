"""`strata make-profile` and `strata profile-info` on the qwen4exp-tiny fixture, and their one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.tiers.expert_profile import ExpertProfile, load_profile, save_profile
from strata_cli.engine.routing import count_routing


@pytest.fixture(scope="module")
def model(fixture_dir):
    return str(fixture_dir / "model-f32.gguf")


@pytest.fixture(scope="module")
def tokens(fixture_dir, tmp_path_factory):
    ids = np.load(fixture_dir / "reference.npz")["tokens"]
    d = tmp_path_factory.mktemp("tok")
    (d / "train.txt").write_text(" ".join(str(int(t)) for t in ids[:24]))
    (d / "held.txt").write_text(" ".join(str(int(t)) for t in ids[24:40]))
    return d / "train.txt", d / "held.txt"


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def test_make_profile_counts_every_token_once_whatever_the_window(model, tokens, tmp_path):
    res = cli("make-profile", model, "--tokens", tokens[0], "--window", 5, "-o", tmp_path / "p.yaml",
              "--holdout", tokens[1], "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["meta"]["tokens_seen"] == 24 and doc["rows"][-1]["holdout_hit"] == 1.0
    p = load_profile(tmp_path / "p.yaml")
    assert p.counts.sum(axis=1).tolist() == [24 * 4] * 8  # 8 layers, top-4
    from strata_cli.model.gguf_file import open_model

    m = open_model(model)
    ids = np.array(tokens[0].read_text().split(), dtype=np.int64)
    np.testing.assert_array_equal(count_routing(m, ids, window=1), p.counts)
    res = cli("make-profile", model, "--tokens", tokens[0], "--slots", 40, "-o", tmp_path / "p.bin")
    assert res.exit_code == 0, res.output
    q = load_profile(tmp_path / "p.bin")
    assert q.slots == 40 and q.counts is None
    np.testing.assert_array_equal(q.ranked, p.ranked)


def test_profile_info_table_and_holdouts(model, tokens, tmp_path):
    assert cli("make-profile", model, "--tokens", tokens[0], "-o", tmp_path / "p.yaml").exit_code == 0
    assert cli("make-profile", model, "--tokens", tokens[1], "-o", tmp_path / "h.yaml").exit_code == 0
    res = cli("profile-info", tmp_path / "p.yaml", "--slots", "0,32,128", "--holdout", tokens[1], "--model", model,
              "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [r["slots"] for r in rows] == [0, 32, 128]
    assert rows[0]["coverage"] == 0.0 and rows[2]["coverage"] == 1.0 and rows[2]["holdout_hit"] == 1.0
    assert 0 < rows[1]["holdout_hit"] < 1 and rows[1]["vram_gib"] > 0
    res2 = cli("profile-info", tmp_path / "p.yaml", "--slots", "0,32,128", "--holdout", tmp_path / "h.yaml",
               "--format", "json")
    assert [r["holdout_hit"] for r in json.loads(res2.stdout)["rows"]] == [r["holdout_hit"] for r in rows]
    table = cli("profile-info", tmp_path / "p.yaml")
    assert table.exit_code == 0 and "suggests 128 slots" in table.stdout and "coverage" in table.stdout


@pytest.mark.parametrize("args,message", [
    (["profile-info", "{tmp}/missing.yaml"], "missing.yaml: cannot read expert profile: no such file"),
    (["profile-info", "{tmp}/bad.bin"], "bad.bin: bad magic"),
    (["profile-info", "{tmp}/other.yaml", "--model", "{model}"], "profile of another geometry"),
    (["profile-info", "{tmp}/other.yaml", "--slots", "1,x"], "not a comma-separated list"),
    (["profile-info", "{tmp}/other.yaml", "--slots", "999"], "--slots 999: the profile has 18"),
    (["make-profile", "{model}", "--random", "5", "-o", "{tmp}/p.txt"], "unknown profile extension"),
    (["make-profile", "{model}", "--random", "5", "-o", "{tmp}/no/p.yaml"], "no such directory"),
    (["make-profile", "{model}", "-o", "{tmp}/p.yaml"], "give exactly one of --tokens"),
    (["make-profile", "{model}", "--random", "5", "--slots", "999", "-o", "{tmp}/p.yaml"], "has 128 (layer, expert)"),
    (["make-profile", "{model}", "--random", "5", "--expert-cache", "12XB", "-o", "{tmp}/p.yaml"],
     "--expert-cache '12XB': expected all, auto, a slot count"),
])
def test_errors_are_one_line(model, tmp_path, args, message):
    (tmp_path / "bad.bin").write_bytes(b"NOPE" + bytes(40))
    counts = np.ones((3, 6), dtype=np.int64)
    geom = type("G", (), dict(n_layers=3, n_expert=6, n_expert_used=2, n_embd=64, n_ff_exp=32))
    save_profile(ExpertProfile.from_counts(counts, geom, "x.gguf", 3), tmp_path / "other.yaml")
    res = cli(*[a.format(tmp=tmp_path, model=model) for a in args])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert message in res.output, res.output
    assert len(lines) <= 3, res.output  # click usage errors add a usage line; ours are one line
    assert not list(tmp_path.glob(".*partial"))


def test_make_profile_expert_cache(model, tmp_path):
    """A bad --expert-cache is refused when parsed (exit 2, one line, the model never opened, nothing written); on
    the numpy engine a given one is a warning and changes no count."""
    res = cli("make-profile", tmp_path / "no-such.gguf", "--random", "5", "--device", "gpu", "--expert-cache",
              "half", "-o", tmp_path / "p.yaml")
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        "strata: error: --expert-cache 'half': expected all, auto, a slot count (e.g. 4096) or a size (e.g. 12GiB)"]
    assert not list(tmp_path.iterdir())
    assert cli("make-profile", model, "--random", "6", "-o", tmp_path / "a.yaml").exit_code == 0
    res = cli("make-profile", model, "--random", "6", "--expert-cache", "0", "-o", tmp_path / "b.yaml")
    assert res.exit_code == 0, res.output
    assert "strata: warning: --expert-cache 0: the numpy engine (--device cpu) keeps every expert" in res.stderr
    np.testing.assert_array_equal(load_profile(tmp_path / "a.yaml").counts, load_profile(tmp_path / "b.yaml").counts)
    assert "--expert-cache all|auto|N|SIZE" in cli("make-profile", "--help").output
