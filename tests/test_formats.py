"""Every --format of every command, parsed back: table (plain ASCII off a terminal), md, csv (raw numbers), json,
jsonl; the benchmark record's fields; the deprecated option spellings. On a model the suite writes itself."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.report.present import RECORD_FORMATS
from strata_cli.synth import load_preset, write_model

NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """4 layers (GGGA), 4 experts, vocab 64: every block, in about a megabyte."""
    path = tmp_path_factory.mktemp("model") / "m.gguf"
    write_model(path, load_preset("tiny").with_overrides(layers=4, experts=4, vocab=64), seed=1, ggml_type="F32")
    return str(path)


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def table_rows(text: str) -> list[list[str]]:
    """The cells of every ASCII (or Markdown) table row; border and separator lines dropped."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-+: "):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def parse(fmt: str, text: str) -> list[dict]:
    """Rows of one table back as dicts (first table for table/md)."""
    if fmt == "json":
        return json.loads(text)["rows"]
    if fmt == "jsonl":
        return [json.loads(line) for line in text.splitlines()]
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    assert not any(ord(ch) > 127 for ch in text.replace("Δ", "").replace("±", "")), "table off a terminal is ASCII"
    rows = table_rows(text)
    header, body = rows[0], rows[1:]
    out = []
    for cells in body:
        if cells == header:  # the next table starts
            break
        if len(cells) != len(header):
            break
        out.append(dict(zip(header, cells)))
    return out


# ---------------------------------------------------------------- verify-bench

@pytest.fixture(scope="module")
def bench_outputs(model):
    return {fmt: run("verify-bench", model, "--device", "cpu", "-d", 4, "-r", 3, "--warmup", 1, "--window", "1,2",
                     "--seed", 5, "--format", fmt).stdout for fmt in RECORD_FORMATS}


RECORD_KEYS = ("window", "repetitions", "ms_median", "ms_mean", "ms_stddev", "ms_p10", "ms_p90", "host_ms",
               "rows_per_s", "expected_tokens", "accepted_tok_per_s", "speedup_vs_t1", "ms_vs_t1", "capture_ms",
               "read_bytes", "floor_ms", "samples_ms", "timestamp", "command", "seed", "depth", "n_ctx", "warmup", "model",
               "model_bytes", "model_sha256", "model_types", "device", "cpu", "strata",
               "numpy", "git_commit")


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_verify_bench_machine_formats_hold_the_raw_record(bench_outputs, model, fmt):
    rows = parse(fmt, bench_outputs[fmt])
    assert [int(r["window"]) for r in rows] == [1, 2]
    for r in rows:
        for key in RECORD_KEYS:
            assert key in r, key
        samples = r["samples_ms"] if fmt != "csv" else [float(x) for x in r["samples_ms"].split()]
        assert len(samples) == int(r["repetitions"]) == 3
        med = sorted(samples)[1]
        assert float(r["ms_median"]) == pytest.approx(med, rel=1e-12)
        assert float(r["ms_mean"]) == pytest.approx(sum(samples) / 3, rel=1e-12)
        assert float(r["rows_per_s"]) == pytest.approx(int(r["window"]) / med * 1e3, rel=1e-12)
        assert int(r["depth"]) == 4 and int(r["warmup"]) == 1 and int(r["seed"]) == 5
        assert r["model"] == model and len(r["model_sha256"]) == 64 and r["model_types"].startswith("F32:")
        assert "verify-bench" in r["command"] and "-r 3" in r["command"]
    e2 = float(rows[1]["expected_tokens"])
    assert e2 == pytest.approx(1 + 0.7)  # the default assumed acceptance


def test_verify_bench_csv_is_raw_numbers(bench_outputs):
    rows = parse("csv", bench_outputs["csv"])
    for r in rows:
        for key in ("ms_median", "ms_p10", "rows_per_s", "accepted_tok_per_s", "model_bytes", "depth"):
            assert NUMBER.match(r[key]), (key, r[key])  # never "1,090" or "12.3 ms"
        assert r["capture_ms"] == "" and r["floor_ms"] == ""  # CPU: no capture, no floor (empty, not "None")


@pytest.mark.parametrize("fmt", ["table", "md"])
def test_verify_bench_reading_formats(bench_outputs, fmt):
    rows = parse(fmt, bench_outputs[fmt])
    assert [r["T"] for r in rows] == ["1", "2"]
    assert all(float(r["ms/window"]) > 0 for r in rows)
    assert "device cpu" in bench_outputs[fmt]
    if fmt == "md":
        assert "### verify windows" in bench_outputs[fmt] and "|---:|" in bench_outputs[fmt]


def test_model_sha256_covers_header_not_data(model, tmp_path):
    from strata_cli.model.gguf_file import open_model
    from strata_cli.report.records import ModelIdentity

    ident = ModelIdentity.of(open_model(model))
    copy = tmp_path / "copy.gguf"
    data = bytearray(open(model, "rb").read())
    data[-1] ^= 0x55  # a tensor byte: the header hash stays
    copy.write_bytes(bytes(data))
    assert ModelIdentity.of(open_model(copy)).header_sha256 == ident.header_sha256
    other = tmp_path / "other.gguf"
    write_model(other, load_preset("tiny").with_overrides(layers=4, experts=4, vocab=72), seed=1, ggml_type="F32")
    assert ModelIdentity.of(open_model(other)).header_sha256 != ident.header_sha256


# ---------------------------------------------------------------- deprecated spellings

@pytest.mark.parametrize("old, new, key, value", [
    (["--windows", "2"], ["-r", "2"], "repetitions", 2),
    (["--context", "3"], ["-d", "3"], "depth", 3),
])
def test_deprecated_bench_spellings_still_work(model, old, new, key, value):
    base = ["verify-bench", model, "--device", "cpu", "--window", "1", "--format", "json"]
    fresh = run(*base, *new)
    assert fresh.stderr == ""
    stale = run(*base, *old)
    assert stale.stderr.strip() == f"strata: warning: {old[0]} is deprecated: use {'-r/--repetitions' if key == 'repetitions' else '-d/--depth'}"
    assert json.loads(stale.stdout)["rows"][0][key] == json.loads(fresh.stdout)["rows"][0][key] == value


def test_deprecated_info_json(model):
    stale = run("info", model, "--json")
    assert stale.stderr.strip() == "strata: warning: --json is deprecated: use --format json"
    assert json.loads(stale.stdout) == json.loads(run("info", model, "--format", "json").stdout)


# ---------------------------------------------------------------- info

def test_info_json_is_numbers(model):
    doc = json.loads(run("info", model, "--format", "json").stdout)["meta"]
    g = doc["geometry"]
    assert (g["layers"], g["hidden"], g["vocab"], g["layout"]) == (4, 64, 64, "GGGA")
    assert g["attention"] == {"heads_q": 4, "heads_kv": 2, "head_dim": 32, "rope_dims": 8, "rope_base": 1e7}
    assert g["moe"] == {"experts": 4, "experts_used": 4, "ff": 32, "shared_ff": 32}
    assert g["qsa"]["compress_ratios"] == [0, 0, 0, 4] and g["ple"]["layer"] == 1

    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str):  # names (tensors, roles, types, layout) only: no prose
            assert " " not in value or value == "gated deltanet", value

    walk({k: v for k, v in doc.items() if k != "path"})
    assert doc["layers"][3] == {"layer": 3, "kind": "attention", "qsa_ratio": 4, "ple": False,
                                "bytes": doc["layers"][3]["bytes"]}


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_info_tensor_rows(model, fmt):
    doc = json.loads(run("info", model, "--format", "json").stdout)["meta"]
    rows = parse(fmt, run("info", model, "--format", fmt).stdout)
    assert [r["name"] for r in rows] == [t["name"] for t in doc["tensors"]]
    assert sum(int(r["bytes"]) for r in rows) == sum(t["bytes"] for t in doc["tensors"])
    if fmt == "csv":
        assert all(NUMBER.match(r["bytes"]) for r in rows)


@pytest.mark.parametrize("fmt", ["table", "md"])
def test_info_reading_formats(model, fmt):
    out = run("info", model, "--format", fmt, "--tensors").stdout
    cells = table_rows(out)
    assert ["layout", "GGGA"] in cells
    assert any(c[:2] == ["3", "attention"] and "QSA ratio 4" in c[2] for c in cells)
    assert any(c[0] == "token_embd.weight" for c in cells)


# ---------------------------------------------------------------- logprobs and compare

@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokens.txt"
    path.write_text("1 5 9 13 17 21 25 29 33 37 41 45 49 53\n")
    return path


@pytest.mark.parametrize("fmt", ["tsv"] + list(RECORD_FORMATS))
def test_logprobs_every_format_parses_back_to_the_same_rows(model, token_file, fmt):
    from strata_cli.analysis.dumps import read_tsv

    reference = read_tsv(_write(token_file.parent / "ref.tsv",
                                run("logprobs", model, "--tokens", token_file, "--topk", 3, "--device", "cpu").stdout))
    out = run("logprobs", model, "--tokens", token_file, "--topk", 3, "--device", "cpu", "--format", fmt).stdout
    if fmt == "tsv":
        rows = [{"pos": r.pos, "target": r.target, "lp_target": r.lp_target} for r in read_tsv(
            _write(token_file.parent / "x.tsv", out))]
    else:
        rows = parse(fmt, out)
    assert len(rows) == len(reference) == 13
    for row, ref in zip(rows, reference):
        assert int(row["pos"]) == ref.pos and int(row["target"]) == ref.target
        assert float(row["lp_target"]) == pytest.approx(ref.lp_target, abs=1e-6)
    if fmt == "csv":
        pairs = rows[0]["topk"].split()
        assert len(pairs) == 3 and all(":" in p for p in pairs)


def _write(path, text):
    path.write_text(text)
    return path


def test_compare_every_format(model, token_file, tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.json"
    run("logprobs", model, "--tokens", token_file, "--window", 1, "--device", "cpu", "-o", a)
    run("logprobs", model, "--tokens", token_file, "--window", 5, "--device", "cpu", "--format", "json", "-o", b)
    summary = json.loads(run("compare", a, b, "--format", "json").stdout)["meta"]["summary"]
    assert summary["rows"] == 13 and summary["top1_agreement"] == 1.0
    assert summary["divergence"]["ppl_ratio"] == pytest.approx(1.0, abs=1e-6)
    (row,) = parse("csv", run("compare", a, b, "--format", "csv").stdout)
    assert int(row["rows"]) == 13 and NUMBER.match(row["ppl_base"]) and row["passed"] in ("True", "1")
    (row,) = parse("jsonl", run("compare", a, b, "--format", "jsonl").stdout)
    assert row["rows"] == 13 and row["ppl_base"] == pytest.approx(summary["divergence"]["ppl_base"])
    for fmt in ("table", "md"):
        cells = table_rows(run("compare", a, b, "--format", fmt).stdout)
        assert ["rows", "13"] in cells and any(c[0] == "PPL base" for c in cells)
    positions = parse("csv", run("compare", a, b, "--format", "csv", "--per-position").stdout)
    assert [int(p["pos"]) for p in positions] == list(range(13))


# ---------------------------------------------------------------- make-model

@pytest.mark.parametrize("fmt", RECORD_FORMATS)
def test_make_model_every_format(tmp_path, fmt):
    out = tmp_path / "m.gguf"
    result = run("make-model", out, "--layers", 4, "--experts", 4, "--vocab", 64, "--seed", 2, "--format", fmt)
    if fmt == "json":
        row = json.loads(result.stdout)["rows"][0]
    else:
        (row,) = parse(fmt, result.stdout)
    assert row["path"] == str(out) and int(row["bytes"]) == out.stat().st_size
    assert row["type"] == "F32" and int(row["seed"]) == 2 and int(row["layers"]) == 4


def test_make_model_warns_without_attention(tmp_path):
    result = run("make-model", tmp_path / "g.gguf", "--layers", 3, "--experts", 4, "--vocab", 64)
    assert "no attention layer" in result.stderr


def test_make_model_preset_yaml(tmp_path):
    from strata_cli.synth.presets import presets_dir

    text = (presets_dir() / "tiny.yaml").read_text().replace("name: tiny", "name: mine") \
        .replace("num_hidden_layers: 8", "num_hidden_layers: 4").replace("vocab_size: 512", "vocab_size: 96") \
        .replace("eos_token_id: 509", "eos_token_id: 93")
    preset = tmp_path / "mine.yaml"
    preset.write_text(text)
    out = tmp_path / "mine.gguf"
    row = json.loads(run("make-model", out, "--preset", preset, "--format", "json").stdout)["rows"][0]
    assert row["preset"] == "mine" and row["layers"] == 4 and row["vocab"] == 96
    doc = json.loads(run("info", out, "--format", "json").stdout)["meta"]
    assert doc["geometry"]["vocab"] == 96
    bad = CliRunner().invoke(main, ["make-model", str(tmp_path / "x.gguf"), "--preset", "nonesuch"])
    assert bad.exit_code == 2 and "nonesuch" in bad.stderr and len(bad.stderr.splitlines()) == 1  # an option value


# ---------------------------------------------------------------- graph-nodes (GPU)

def test_every_command_offers_every_record_format():
    from strata_cli.cli import COMMANDS

    for name in set(COMMANDS) - {"stall-test"}:  # a GPU test hook: its output is the watchdog's line (README)
        command = main.get_command(None, name)
        fmt = next(p for p in command.params if p.name == "fmt")
        assert set(RECORD_FORMATS) <= set(fmt.type.choices), name


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", RECORD_FORMATS)
def test_graph_nodes_every_format(model, fmt):
    out = run("graph-nodes", model, "--window", 2, "--format", fmt).stdout
    rows = parse(fmt, out)
    counts = [int(r["count"]) for r in rows]
    assert counts and counts == sorted(counts, reverse=True)
