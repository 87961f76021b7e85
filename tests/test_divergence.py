"""compare-models / compare statistics (KLD, PPL, Δp, top-1) against a plain numpy computation: on random logits,
on models the suite writes, through the CLI, and on the shared fixture's transformers logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from strata_cli.cli import main
from strata_cli.analysis.divergence import DivergenceStats, position_arrays
from strata_cli.engine.reference import ReferenceEngine
from strata_cli.model.gguf_file import open_model
from strata_cli.synth import load_preset, write_model


def plain(logits_base, logits_other, targets) -> dict:
    """The llama-perplexity --kl-divergence statistics, written out the long way in float64."""
    lb = np.asarray(logits_base, np.float64)
    lo = np.asarray(logits_other, np.float64)
    lb = lb - lb.max(1, keepdims=True)
    lo = lo - lo.max(1, keepdims=True)
    pb = np.exp(lb) / np.exp(lb).sum(1, keepdims=True)
    po = np.exp(lo) / np.exp(lo).sum(1, keepdims=True)
    n = len(targets)
    kld = np.array([sum(pb[i, v] * (np.log(pb[i, v]) - np.log(po[i, v])) for v in range(pb.shape[1]))
                    for i in range(n)])
    pt_b, pt_o = pb[np.arange(n), targets], po[np.arange(n), targets]
    nll_b, nll_o = -np.log(pt_b), -np.log(pt_o)
    dp = pt_o - pt_b
    agree = np.mean(pb.argmax(1) == po.argmax(1))
    d = nll_o - nll_b
    return {
        "kld_mean": kld.mean(), "kld_mean_err": kld.std() / np.sqrt(n - 1),
        "kld_median": np.median(kld), "kld_p90": np.percentile(kld, 90), "kld_p99": np.percentile(kld, 99),
        "kld_p99_9": np.percentile(kld, 99.9), "kld_max": kld.max(),
        "ppl_base": np.exp(nll_b.mean()), "ppl_other": np.exp(nll_o.mean()),
        "ppl_ratio": np.exp(nll_o.mean()) / np.exp(nll_b.mean()), "ln_ppl_ratio": d.mean(),
        "ln_ppl_ratio_err": d.std() / np.sqrt(n - 1), "top1_agreement": agree,
        "top1_agreement_err": np.sqrt(agree * (1 - agree) / (n - 1)),
        "dp_mean": dp.mean(), "dp_mean_err": dp.std() / np.sqrt(n - 1), "dp_rms": np.sqrt(np.mean(dp ** 2)),
        "dp_min": dp.min(), "dp_max": dp.max(), "dp_median": np.median(dp), "dp_p1": np.percentile(dp, 1),
        "dp_p99": np.percentile(dp, 99), "dp_p25": np.percentile(dp, 25),
    }


def assert_matches(flat: dict, expected: dict, rel=1e-9, abs_=1e-12):
    for key, value in expected.items():
        assert flat[key] == pytest.approx(value, rel=rel, abs=abs_), key


def test_stats_match_numpy_on_random_logits():
    rng = np.random.default_rng(7)
    n, V = 173, 61  # odd sizes
    base = rng.normal(0, 2, (n, V)).astype(np.float32)
    other = (base + rng.normal(0, 0.7, (n, V))).astype(np.float32)
    targets = rng.integers(0, V, n)
    stats = DivergenceStats.of(position_arrays(base, other, np.arange(n), targets))
    assert stats.n == n
    assert_matches(stats.flat(), plain(base, other, targets))
    assert 0 < stats.top1_agreement < 1 and stats.kld_mean > 0


def test_identical_logits_give_zero_divergence():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, (20, 33)).astype(np.float32)
    stats = DivergenceStats.of(position_arrays(base, base.copy(), np.arange(20), rng.integers(0, 33, 20)))
    assert stats.kld_mean == 0 and stats.kld_max == 0 and stats.ppl_ratio == 1 and stats.top1_agreement == 1
    assert stats.dp_rms == 0


def test_different_vocabularies_are_one_line():
    from strata_cli.errors import InputError

    with pytest.raises(InputError, match="shape"):
        position_arrays(np.zeros((3, 5)), np.zeros((3, 6)), np.arange(3), np.zeros(3, int))


# ---------------------------------------------------------------- through the CLI, on generated models

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    preset = load_preset("tiny").with_overrides(layers=4, experts=4, vocab=64)
    paths = []
    for seed in (1, 2):
        path = root / f"m{seed}.gguf"
        write_model(path, preset, seed=seed, ggml_type="F32")
        paths.append(path)
    tokens = np.random.default_rng(3).integers(0, 64, 29)
    token_file = root / "tokens.txt"
    token_file.write_text(" ".join(map(str, tokens)))
    return paths, tokens, token_file


def full_logits(path, tokens) -> np.ndarray:
    engine = ReferenceEngine(open_model(path))
    return engine.run(tokens[:-1], 0).logits


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def test_compare_models_matches_numpy(models):
    (m1, m2), tokens, token_file = models
    expected = plain(full_logits(m1, tokens), full_logits(m2, tokens), tokens[1:])
    for window in (1, 3, 8):
        doc = json.loads(run("compare-models", m1, m2, "--tokens", token_file, "--window", window,
                             "--format", "json").stdout)
        summary = doc["meta"]["summary"]
        assert summary["n"] == len(tokens) - 1
        assert_matches(summary, expected, rel=1e-4, abs_=1e-7)  # windowed vs one full run: float32 logits


def test_compare_models_same_model_and_per_position(models):
    (m1, _), tokens, token_file = models
    (row,) = [json.loads(line) for line in run("compare-models", m1, m1, "--tokens", token_file,
                                               "--format", "jsonl").stdout.splitlines()]
    assert row["kld_mean"] == 0 and row["ppl_ratio"] == 1 and row["top1_agreement"] == 1
    out = run("compare-models", m1, m1, "--tokens", token_file, "--per-position", "--format", "jsonl").stdout
    positions = [json.loads(line) for line in out.splitlines()]
    assert [p["pos"] for p in positions] == list(range(len(tokens) - 1))
    assert [p["target"] for p in positions] == [int(t) for t in tokens[1:]]


def test_compare_of_full_dist_dumps_equals_compare_models(models, tmp_path):
    (m1, m2), tokens, token_file = models
    dumps = []
    for m in (m1, m2):
        path = tmp_path / f"{m.stem}.json"
        run("logprobs", m, "--tokens", token_file, "--format", "json", "--full-dist", "-o", path)
        dumps.append(path)
    direct = json.loads(run("compare-models", m1, m2, "--tokens", token_file, "--format", "json").stdout)
    via_dumps = json.loads(run("compare", *dumps, "--format", "json").stdout)
    expected = direct["meta"]["summary"]
    got = via_dumps["meta"]["summary"]["divergence"]
    assert_matches(got, {k: v for k, v in expected.items() if isinstance(v, float)}, rel=1e-9, abs_=1e-12)
    # a TSV dump has no full distribution: the same statistics except KLD
    tsv = tmp_path / "m2.tsv"
    run("logprobs", m2, "--tokens", token_file, "-o", tsv)
    mixed = json.loads(run("compare", dumps[0], tsv, "--format", "json").stdout)["meta"]["summary"]["divergence"]
    assert mixed["kld_mean"] is None and "kld_median" not in mixed
    assert mixed["ppl_ratio"] == pytest.approx(expected["ppl_ratio"], rel=1e-7)
    assert mixed["top1_agreement"] == expected["top1_agreement"]


def test_compare_models_bad_inputs_are_one_line(models, tmp_path):
    (m1, m2), _, token_file = models
    other = tmp_path / "v72.gguf"
    write_model(other, load_preset("tiny").with_overrides(layers=4, experts=4, vocab=72), seed=1, ggml_type="F32")
    for args, needle, code in ((["compare-models", m1, other, "--tokens", token_file], "vocabulary", 1),
                               (["compare-models", m1, m2], "exactly one of", 2),  # no token source: usage error
                               (["compare-models", m1, m2, "--text", "hello"], "no tokenizer", 1)):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == code and needle in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


# ---------------------------------------------------------------- the shared fixture's transformers logits

def test_stats_on_the_fixture_reference_logits(fixture_dir):
    ref = np.load(fixture_dir / "reference.npz")
    tokens = ref["tokens"]
    base = ref["logits"][:-1]
    for other in (ref["logits_stepwise"][:-1], 0.5 * ref["logits"][:-1]):
        stats = DivergenceStats.of(position_arrays(base, other, np.arange(len(base)), tokens[1:]))
        assert_matches(stats.flat(), plain(base, other, tokens[1:]), rel=1e-7, abs_=1e-12)


def test_compare_models_on_the_fixture_matches_numpy(fixture_dir, tmp_path):
    ref = np.load(fixture_dir / "reference.npz")
    tokens = ref["tokens"][:24]
    token_file = tmp_path / "tokens.txt"
    token_file.write_text(" ".join(map(str, tokens)))
    f32, q8 = fixture_dir / "model-f32.gguf", fixture_dir / "model-q8_0.gguf"
    summary = json.loads(run("compare-models", f32, q8, "--tokens", token_file, "--format", "json").stdout)["meta"][
        "summary"]
    assert_matches(summary, plain(full_logits(f32, tokens), full_logits(q8, tokens), tokens[1:]), rel=1e-4,
                   abs_=1e-7)
    # strata's f32 run is the transformers reference to float32 precision: same statistics against q8_0
    vs_hf = plain(ref["logits"][:23], full_logits(q8, tokens), tokens[1:])
    assert summary["kld_mean"] == pytest.approx(vs_hf["kld_mean"], rel=1e-3)
    assert summary["top1_agreement"] == vs_hf["top1_agreement"]
