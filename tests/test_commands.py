"""The commands on the shared qwen4exp-tiny fixture (f32), through click's CliRunner: info, logprobs, verify-bench,
compare. Every run names the fixture model explicitly (never the default model)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from random_models import random_preset, write_random_file

from strata_cli.cli import main
from strata_cli.analysis.dumps import N_FIXED, read_tsv

N_TOKENS = 24  # crosses position 19, where QSA selection turns sparse
TOPK = 5
EOS = 509


@pytest.fixture(scope="module")
def model(fixture_dir):
    return str(fixture_dir / "model-f32.gguf")


@pytest.fixture(scope="module")
def config(fixture_dir):
    return json.loads((fixture_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def token_file(fixture_dir, tmp_path_factory):
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:N_TOKENS]
    path = tmp_path_factory.mktemp("tokens") / "tokens.txt"
    path.write_text(" ".join(str(int(t)) for t in tokens) + "\n")
    return path


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def ok(*args):
    result = cli(*args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def logprobs_tsv(model, token_file, *extra):
    return ok("logprobs", model, "--tokens", token_file, "--topk", TOPK, "--format", "tsv", "--device", "cpu",
              *extra).stdout


def parse_tsv(text: str) -> list[list[str]]:
    lines = text.splitlines()
    n_comments = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert n_comments >= 1
    # rows stream out as windows finish, so the loop's `# speculation {...}` line is the one comment after them
    assert lines[-1].startswith("# speculation "), lines[-1]
    lines = lines[:-1]
    assert not any(line.startswith("#") for line in lines[n_comments:]), "comment lines must come first"
    return [line.split("\t") for line in lines[n_comments:] if line.strip()]


def assert_same_dump(rows_a: list[list[str]], rows_b: list[list[str]], tol: float = 1e-5) -> None:
    """Same positions, targets, top ids, match flags and top-k ids; logprobs within tol."""
    assert len(rows_a) == len(rows_b)
    for a, b in zip(rows_a, rows_b):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            if i in (0, 1, 3, 5):  # pos, target, top_id, match
                assert x == y, (a[0], i, x, y)
            elif i < N_FIXED:  # the renormalised column is nan where the target is the extra id, in both
                assert abs(float(x) - float(y)) <= tol or (x == y == "nan"), (a[0], i, x, y)
            else:
                (id_x, lp_x), (id_y, lp_y) = x.split(":"), y.split(":")
                assert id_x == id_y, (a[0], i, x, y)
                assert abs(float(lp_x) - float(lp_y)) <= tol, (a[0], i, x, y)


# ---------------------------------------------------------------- info

def test_info_table(model):
    result = ok("info", model)
    out = result.stdout
    assert model in out
    assert "214 tensors" in out
    assert "GGGAGGGA" in out
    assert not any(ord(ch) > 127 for ch in out)  # not a terminal: a plain ASCII table
    cells = [[c.strip() for c in line.split("|") if c.strip()] for line in out.splitlines()]
    for key, value in (("layers", "8"), ("hidden", "128"), ("vocab", "512"), ("context", "4096"),
                       ("layout", "GGGAGGGA"), ("eos", "509")):
        assert [key, value] in cells, key
    assert "QSA ratio 4" in out and "PLE" in out
    assert "F32" in out
    assert result.stderr == ""  # ratios are set in this file: no warning


def test_info_json_matches_the_fixture_config(model, config):
    doc = json.loads(ok("info", model, "--format", "json").stdout)["meta"]
    g = doc["geometry"]
    assert g["layers"] == config["num_hidden_layers"] == 8
    assert g["hidden"] == config["hidden_size"] == 128
    assert g["vocab"] == config["vocab_size"] == 512
    assert g["context"] == config["max_position_embeddings"]
    assert g["layout"] == "GGGAGGGA" == "".join("A" if t == "full_attention" else "G" for t in config["layer_types"])
    assert g["eos"] == config["eos_token_id"] == EOS
    assert doc["tensor_count"] == 214
    assert [layer["kind"] for layer in doc["layers"]] == ["attention" if c == "A" else "gated deltanet"
                                                         for c in g["layout"]]
    assert doc["types"] == [{"type": "F32", "tensors": 214, "bytes": sum(t["bytes"] for t in doc["tensors"]),
                             "bits_per_weight": 32.0}]
    assert doc["bits_per_weight"] == 32.0
    experts = next(r for r in doc["roles"] if r["role"] == "blk.*.ffn_gate_exps.weight")
    assert experts["mix"] == {"F32": 8} and "types" not in experts  # the "F32 x8" text is the table's
    assert doc["warnings"] == []


# ---------------------------------------------------------------- logprobs

@pytest.fixture(scope="module")
def dump_w4(model, token_file):
    return logprobs_tsv(model, token_file, "--window", 4)


def test_logprobs_tsv_layout(dump_w4):
    lines = dump_w4.splitlines()
    assert lines[0].startswith("# strata ")
    rows = parse_tsv(dump_w4)
    assert len(rows) == N_TOKENS - 1
    assert all(len(r) == N_FIXED + TOPK for r in rows)
    assert [int(r[0]) for r in rows] == list(range(N_TOKENS - 1))
    for r in rows:
        lp_target, top_id, lp_top = float(r[2]), int(r[3]), float(r[4])
        assert lp_target <= lp_top <= 0
        assert int(r[5]) == (top_id == int(r[1]))
        topk = [(int(x.split(":")[0]), float(x.split(":")[1])) for x in r[N_FIXED:]]
        assert topk[0][0] == top_id
        assert [lp for _, lp in topk] == sorted((lp for _, lp in topk), reverse=True)


@pytest.fixture(scope="module", params=["fixture", "synthetic"])
def dump_case(request, tmp_path_factory):
    """(model path, token file, dump at window 4): the shared fixture, or a random geometry strata writes here
    (so a clone without ../shared checks the dump's independence of the window too)."""
    if request.param == "fixture":
        model, token_file = request.getfixturevalue("model"), request.getfixturevalue("token_file")
        return model, token_file, request.getfixturevalue("dump_w4")
    rng = np.random.default_rng(61)
    preset = random_preset(rng, indexer_compress_ratio=3, indexer_budget=6)   # sparse from position 8
    folder = tmp_path_factory.mktemp("synthetic")
    model = str(write_random_file(folder, preset, 61))
    tokens = rng.integers(0, preset.vocab_size, N_TOKENS)
    tokens[N_TOKENS // 2] = preset.eos_token_id
    token_file = folder / "tokens.txt"
    token_file.write_text(" ".join(str(int(t)) for t in tokens) + "\n")
    return model, token_file, logprobs_tsv(model, token_file, "--window", 4)


@pytest.mark.parametrize("extra", [["--window", "1"], ["--window", "3"], ["--window", "8"],
                                   ["--window", "4", "--draft-noise", "0.5", "--seed", "1"],
                                   ["--window", "4", "--draft-noise", "0.5", "--seed", "2"]],
                         ids=["T1", "T3", "T8", "noise-seed1", "noise-seed2"])
def test_logprobs_dump_does_not_depend_on_window_or_draft_noise(extra, dump_case):
    model, token_file, dump_w4 = dump_case
    assert_same_dump(parse_tsv(logprobs_tsv(model, token_file, *extra)), parse_tsv(dump_w4))


def test_draft_noise_really_rejects_drafts(dump_case):
    """With draft noise the loop runs more, shorter windows (the dump stays the same, tested above)."""
    model, token_file, _ = dump_case
    windows = []
    for extra in ([], ["--draft-noise", "0.5", "--seed", "1"]):
        # the TSV streams its rows, so the window count is in the summary line on stderr
        result = ok("logprobs", model, "--tokens", token_file, "--window", 4, "--device", "cpu", *extra)
        windows.append(int(result.stderr.split(" rows through ")[1].split()[0]))
    assert windows[0] == -(-(N_TOKENS - 1) // 4)
    assert windows[1] > windows[0]


def test_logprobs_json(model, token_file, dump_w4):
    result = ok("logprobs", model, "--tokens", token_file, "--topk", TOPK, "--format", "json", "--device", "cpu")
    doc = json.loads(result.stdout)
    assert doc["meta"]["extra_id"] == EOS and doc["meta"]["window"] == 4
    rows = doc["rows"]
    assert len(rows) == N_TOKENS - 1
    for row, tsv in zip(rows, parse_tsv(dump_w4)):
        assert row["pos"] == int(tsv[0]) and row["target"] == int(tsv[1]) and row["top_id"] == int(tsv[3])
        assert abs(row["lp_target"] - float(tsv[2])) <= 1e-6
        assert len(row["topk"]) == TOPK


def test_logprobs_output_file(model, token_file, tmp_path, dump_w4):
    out = tmp_path / "dump.tsv"
    result = ok("logprobs", model, "--tokens", token_file, "--topk", TOPK, "--device", "cpu", "-o", out)
    assert result.stdout == ""
    text = out.read_text()
    assert_same_dump(parse_tsv(text), parse_tsv(dump_w4), tol=0)
    assert len(read_tsv(out)) == N_TOKENS - 1


def test_logprobs_extra_id_defaults_to_eos(model, token_file, dump_w4):
    assert f"extra_id {EOS}" in dump_w4.splitlines()[1]
    explicit = logprobs_tsv(model, token_file, "--extra-id", EOS)
    assert_same_dump(parse_tsv(explicit), parse_tsv(dump_w4), tol=0)
    other = parse_tsv(logprobs_tsv(model, token_file, "--extra-id", 0))
    assert any(a[6] != b[6] for a, b in zip(other, parse_tsv(dump_w4)))
    # logprob(extra) and the renormalised target logprob agree with each other
    for r in parse_tsv(dump_w4):
        lp_target, lp_extra, renorm = float(r[2]), float(r[6]), float(r[7])
        assert abs(renorm - (lp_target - np.log1p(-np.exp(lp_extra)))) <= 1e-6


def test_logprobs_random_tokens(model):
    rows = parse_tsv(ok("logprobs", model, "--random", 10, "--seed", 3, "--device", "cpu").stdout)
    assert len(rows) == 9 and all(len(r) == N_FIXED for r in rows)


def test_logprobs_table(model, token_file):
    out = ok("logprobs", model, "--tokens", token_file, "--format", "table", "--device", "cpu").stdout
    assert "lp_target" in out and "top_id" in out


# ---------------------------------------------------------------- verify-bench

def _check_bench_arithmetic(records: list[dict], acceptance: float) -> None:
    """Each record's statistics from its own samples, and E(T), rows/s, accepted tok/s and the speedup over the
    T = 1 record from their closed forms."""
    t1 = next(r for r in records if int(r["window"]) == 1)["ms_median"]
    for r in records:
        T, samples = int(r["window"]), np.array(r["samples_ms"], dtype=np.float64)
        assert len(samples) == int(r["repetitions"]) and (samples > 0).all()
        assert r["ms_median"] == pytest.approx(np.median(samples))
        assert r["ms_p10"] == pytest.approx(np.percentile(samples, 10))
        assert r["ms_p90"] == pytest.approx(np.percentile(samples, 90))
        assert r["ms_p10"] <= r["ms_median"] <= r["ms_p90"]
        e = (1 - acceptance ** T) / (1 - acceptance)
        assert r["expected_tokens"] == pytest.approx(e)
        assert r["rows_per_s"] == pytest.approx(T / r["ms_median"] * 1e3)
        assert r["accepted_tok_per_s"] == pytest.approx(e / r["ms_median"] * 1e3)
        assert r["speedup_vs_t1"] == pytest.approx(e * t1 / r["ms_median"])
        assert r["ms_vs_t1"] == pytest.approx(r["ms_median"] / t1)
        assert 1 <= r["kept_mean"] <= T and (T > 1 or r["kept_mean"] == 1)


def test_verify_bench_json(model):
    result = ok("verify-bench", model, "--device", "cpu", "-d", 8, "-r", 3, "--window", "1,2", "--acceptance", 0.6,
                "--format", "json")
    doc = json.loads(result.stdout)
    records = doc["rows"]
    assert [r["window"] for r in records] == [1, 2]
    for r in records:
        assert r["repetitions"] == 3 and r["device"] == "cpu" and r["mode"] == "numpy"
        assert r["model"] == model and r["depth"] == 8
    _check_bench_arithmetic(records, 0.6)
    env = doc["meta"]["provenance"]
    for key in ("strata", "git_commit", "numpy"):
        assert key in env
    assert env["strata"] and env["numpy"] and env["device"] == "cpu"


def test_verify_bench_csv(model):
    result = ok("verify-bench", model, "--device", "cpu", "-d", 8, "-r", 3, "--window", "2,1", "--format", "csv")
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert len(rows) == 3
    header = rows[0]
    assert header[:3] == ["window", "repetitions", "ms_median"]
    assert [r[0] for r in rows[1:]] == ["2", "1"]
    records = []
    for row in rows[1:]:
        rec = dict(zip(header, row))
        records.append({k: float(rec[k]) for k in ("window", "repetitions", "ms_median", "ms_p10", "ms_p90",
                                                  "expected_tokens", "rows_per_s", "accepted_tok_per_s",
                                                  "speedup_vs_t1", "ms_vs_t1", "kept_mean")}
                       | {"samples_ms": [float(v) for v in rec["samples_ms"].split()]})  # space-separated
    _check_bench_arithmetic(records, 0.7)  # the default acceptance


def test_verify_bench_table(model):
    out = ok("verify-bench", model, "--device", "cpu", "-d", 8, "-r", 2, "--window", "2").stdout
    assert "ms/window" in out and "device cpu" in out


# ---------------------------------------------------------------- compare

def test_compare_dumps_of_different_windows(model, token_file, tmp_path):
    a, b = tmp_path / "w1.tsv", tmp_path / "w8.tsv"
    ok("logprobs", model, "--tokens", token_file, "--topk", TOPK, "--window", 1, "--device", "cpu", "-o", a)
    ok("logprobs", model, "--tokens", token_file, "--topk", TOPK, "--window", 8, "--device", "cpu", "-o", b)
    result = ok("compare", a, b, "--max-delta", "1e-4", "--format", "json")
    doc = json.loads(result.stdout)["meta"]
    summary = doc["summary"]
    assert doc["passed"] is True
    assert summary["rows"] == N_TOKENS - 1
    assert summary["max_abs_delta"] < 1e-5
    assert summary["top1_agreement"] == 1.0
    assert summary["mean_topk_overlap"] == 1.0
    table = ok("compare", a, b, "--max-delta", "1e-4")
    assert "top-1 agreement" in table.stdout and table.stderr == ""


def test_graph_nodes_without_a_gpu_is_one_line(fixture_dir):
    from strata_cli.engine import gpu_probe

    if gpu_probe()[1] is None:
        pytest.skip("a GPU is present: tests/test_gpu_engine.py covers graph-nodes there")
    result = CliRunner().invoke(main, ["graph-nodes", str(fixture_dir / "model-q8_0.gguf"), "--window", "4"])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("strata: error:") and "GPU" in lines[0]


def test_profile_without_a_gpu_is_one_line(fixture_dir):
    from strata_cli.engine import gpu_probe

    if gpu_probe()[1] is None:
        pytest.skip("a GPU is present: tests/test_gpu_profile.py covers profile there")
    result = CliRunner().invoke(main, ["profile", str(fixture_dir / "model-q8_0.gguf"), "--window", "8"])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("strata: error:") and "GPU" in lines[0]


def test_verify_profile_env_on_the_numpy_engine_prints_nothing(fixture_dir, monkeypatch):
    """STRATA_VERIFY_PROFILE stamps GPU windows only; a CPU run is unchanged and adds no summary line."""
    monkeypatch.setenv("STRATA_VERIFY_PROFILE", "1")
    result = CliRunner().invoke(main, ["verify-bench", str(fixture_dir / "model-q8_0.gguf"), "--device", "cpu",
                                       "--window", "1", "-r", "1", "-d", "2", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "verify profile" not in result.stderr
    assert json.loads(result.stdout)["rows"][0]["window"] == 1
