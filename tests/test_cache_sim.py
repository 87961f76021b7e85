"""Routing traces (`make-profile --trace`) and `strata cache-sim`: the trace format, every cache policy against a
brute-force reference, and the static policy's hit rate equal to profile-info --holdout's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.tiers.trace import load_trace


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


def test_trace_holds_every_pick_in_the_order_served(model, tokens, tmp_path):
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.profile import load_profile
    from strata_cli.tiers.residency import expert_bytes

    res = cli("make-profile", model, "--tokens", tokens[0], "--window", 5, "-o", tmp_path / "p.yaml",
              "--trace", tmp_path / "t.npz")
    assert res.exit_code == 0, res.output
    assert "t.npz: 768 picks in 5 windows" in res.output  # 24 tokens x 8 layers x top-4; windows 5,5,5,5,4
    with np.load(tmp_path / "t.npz") as z:
        assert {k: z[k].dtype for k in ("window", "row", "layer", "expert")} == {k: np.int32 for k in
                                                                               ("window", "row", "layer", "expert")}
        assert int(z["n_layers"]) == 8 and int(z["n_expert"]) == 16
    trace = load_trace(tmp_path / "t.npz")
    np.testing.assert_array_equal(trace.counts(), load_profile(tmp_path / "p.yaml").counts)
    np.testing.assert_array_equal(trace.expert_bytes, expert_bytes(open_model(model)))
    # window 0: layer 0's rows 0..4 (top-4 each), then layer 1's ...
    w0 = trace.window == 0
    assert w0.sum() == 5 * 8 * 4
    np.testing.assert_array_equal(trace.layer[w0], np.repeat(np.arange(8), 20))
    np.testing.assert_array_equal(trace.row[w0][:20], np.repeat(np.arange(5), 4))
    assert trace.row[trace.window == 4].min() == 20 and trace.row.max() == 23


@pytest.mark.parametrize("name,content,message", [
    ("t.npz", b"not a zip", "not a routing trace"),
    ("t.txt", None, "name it .npz"),
])
def test_trace_errors(model, tmp_path, name, content, message):
    if content is not None:
        (tmp_path / name).write_bytes(content)
        res = cli("cache-sim", tmp_path / name, "--slots", "4")
    else:
        res = cli("make-profile", model, "--random", "5", "-o", tmp_path / "p.yaml", "--trace", tmp_path / name)
    assert res.exit_code == 1 and message in res.output
