"""Expert profiles: YAML and STRP v1 round trips, every malformed case as one InputError naming the file, and the
residency built from a profile (`--expert-cache` specs)."""

from __future__ import annotations

import re
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from strata_cli.errors import InputError
from strata_cli.tiers.expert_profile import (STRP_HEADER, ExpertProfile, geometry_fingerprint, load_profile,
                                            rank_by_counts, save_profile)
from strata_cli.tiers.residency import parse_cache_spec


def geom(n_layers=3, n_expert=7, used=2, path="m.gguf"):
    return SimpleNamespace(n_layers=n_layers, n_expert=n_expert, n_expert_used=used, n_embd=64, n_ff_exp=32,
                           path=path)


def profile(seed=0, n_layers=3, n_expert=7):
    counts = np.random.default_rng(seed).integers(1, 50, size=(n_layers, n_expert))
    counts[0, 3] = counts[1, 1] = 0
    return ExpertProfile.from_counts(counts, geom(n_layers, n_expert), "/x/model.gguf", tokens_seen=123)


def test_ranked_is_descending_with_ties_to_lower_pair():
    counts = np.array([[5, 9, 5], [9, 0, 5]])
    assert rank_by_counts(counts).tolist() == [[0, 1], [1, 0], [0, 0], [0, 2], [1, 2], [1, 1]]


def test_yaml_round_trip(tmp_path):
    p = profile()
    save_profile(p, tmp_path / "p.yaml")
    q = load_profile(tmp_path / "p.yaml")
    np.testing.assert_array_equal(q.counts, p.counts)
    np.testing.assert_array_equal(q.ranked, p.ranked)
    assert (q.slots, q.tokens_seen, q.n_layers, q.n_expert, q.model_file, q.fingerprint, q.n_expert_used) == (
        p.slots, 123, 3, 7, "model.gguf", p.fingerprint, 2)
    assert p.slots == 19  # pairs ever routed: 21 minus the two zeroed
    assert not list(tmp_path.glob(".*partial"))


def test_strp_round_trip_and_layout(tmp_path):
    p = profile(1)
    p.ranked = p.ranked[:15]  # a partial ranking: the rest follows by count
    save_profile(p, tmp_path / "p.bin")
    data = (tmp_path / "p.bin").read_bytes()
    assert data[:4] == b"STRP" and struct.unpack_from("<IIIII", data, 4) == (1, 3, 7, p.slots, 15)
    assert len(data) == 24 + 4 * 15 + 4 * 21
    ranks = np.frombuffer(data, "<i4", offset=24 + 60).reshape(3, 7)
    assert ranks[tuple(p.ranked[4])] == 4 and (ranks == -1).sum() == 6
    q = load_profile(tmp_path / "p.bin")
    assert q.counts is None and q.slots == p.slots
    np.testing.assert_array_equal(q.ranked, p.ranked)
    assert q.order().shape == (21, 2) and len({tuple(r) for r in q.order()}) == 21
    save_profile(q, tmp_path / "q.yaml")  # STRP -> YAML keeps the ranking, counts null
    r = load_profile(tmp_path / "q.yaml")
    assert r.counts is None
    np.testing.assert_array_equal(r.ranked, p.ranked)


def test_strp_frequency_table_is_read_as_counts(tmp_path):
    counts = np.arange(21, dtype="<i4").reshape(3, 7)
    ranked = rank_by_counts(counts)
    (tmp_path / "f.bin").write_bytes(STRP_HEADER.pack(b"STRP", 1, 3, 7, 5, 21) + ranked.astype("<u2").tobytes()
                                     + counts.tobytes())
    q = load_profile(tmp_path / "f.bin")
    np.testing.assert_array_equal(q.counts, counts)
    assert q.coverage(21) == 1.0


def _strp(tmp_path, mutate=None, body=None):
    p = profile(2)
    save_profile(p, tmp_path / "ok.bin")
    data = bytearray((tmp_path / "ok.bin").read_bytes())
    if mutate:
        mutate(data)
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(data) if body is None else body)
    return path


@pytest.mark.parametrize("case,mutate,message", [
    ("magic", lambda d: d.__setitem__(slice(0, 4), b"STRQ"), "bad magic"),
    ("version", lambda d: d.__setitem__(slice(4, 8), struct.pack("<I", 2)), "version 2"),
    ("truncated", lambda d: d.__delitem__(slice(-5, None)), "truncated STRP"),
    ("header", lambda d: d.__delitem__(slice(10, None)), "truncated STRP profile (10 bytes"),
    ("trailing", lambda d: d.extend(b"\0\0\0\0"), "trailing bytes"),
    ("layer", lambda d: d.__setitem__(slice(24, 26), struct.pack("<H", 3)), "layer 3 out of range 0..2"),
    ("expert", lambda d: d.__setitem__(slice(26, 28), struct.pack("<H", 9)), "expert 9 out of range 0..6"),
    ("duplicate", lambda d: d.__setitem__(slice(28, 32), d[24:28]), "repeats pair"),
    ("n_ranked", lambda d: d.__setitem__(slice(20, 24), struct.pack("<I", 22)), "ranks 22 pairs"),
    ("slots", lambda d: d.__setitem__(slice(16, 20), struct.pack("<I", 99)), "slots = 99"),
    ("table", lambda d: d.__setitem__(slice(-4, None), struct.pack("<i", -7)), "neither that pair's rank"),
])
def test_malformed_strp(tmp_path, case, mutate, message):
    path = _strp(tmp_path, mutate)
    with pytest.raises(InputError) as exc:
        load_profile(path)
    assert str(path) in str(exc.value) and message in str(exc.value), str(exc.value)


def _yaml(tmp_path, edit):
    save_profile(profile(3), tmp_path / "ok.yaml")
    text = (tmp_path / "ok.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(edit(text))
    return path


@pytest.mark.parametrize("case,edit,message", [
    ("not-profile", lambda t: "just: text\n", "not an expert profile"),
    ("syntax", lambda t: t.replace("ranked:", "ranked: [", 1), "not a valid YAML profile"),
    ("version", lambda t: t.replace("version: 1", "version: 7"), "profile version 7"),
    ("layers", lambda t: t.replace("layers: 3", "layers: 0"), "model.layers = 0"),
    ("counts-shape", lambda t: t.replace("layers: 3", "layers: 4"), "counts has shape [3, 7], expected [4, 7]"),
    ("counts-negative", lambda t: re.sub(r"(counts:.*\n- \[)\d+", r"\g<1>-4", t), "counts[0][0] = -4 is negative"),
    ("counts-ragged", lambda t: re.sub(r"(counts:.*\n- \[)\d+, ", r"\g<1>", t), "rows of integers"),
    ("ranked-range", lambda t: re.sub(r"(ranked:.*\n- \[)\d+", r"\g<1>5", t), "layer 5 out of range 0..2"),
    ("ranked-expert", lambda t: re.sub(r"(ranked:.*\n- \[\d+, )\d+", r"\g<1>7", t), "expert 7 out of range 0..6"),
    ("ranked-shape", lambda t: re.sub(r"(ranked:.*\n- \[)", r"\g<1>1, ", t), "rows of integers"),
    ("ranked-too-many", lambda t: t + "- [0, 0]\n", "ranked lists 22 pairs"),
    ("slots", lambda t: t.replace("slots: ", "slots: -"), "slots = -"),
    ("tokens", lambda t: t.replace("tokens_seen: 123", "tokens_seen: lots"), "tokens_seen = 'lots'"),
])
def test_malformed_yaml(tmp_path, case, edit, message):
    path = _yaml(tmp_path, edit)
    with pytest.raises(InputError) as exc:
        load_profile(path)
    assert str(path) in str(exc.value) and message in str(exc.value), str(exc.value)


def test_missing_file_directory_and_unknown_extension(tmp_path):
    with pytest.raises(InputError, match="nope.yaml: cannot read expert profile: no such file"):
        load_profile(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="is a directory"):
        load_profile(tmp_path)
    with pytest.raises(InputError, match="unknown profile extension"):
        save_profile(profile(), tmp_path / "p.txt")
    with pytest.raises(InputError, match="no such directory"):
        save_profile(profile(), tmp_path / "sub" / "p.yaml")


def test_another_geometry_is_refused():
    p = profile()
    p.check_model(geom(), "p.yaml")
    with pytest.raises(InputError, match=r"p.yaml: profile of another geometry \(3 layers x 7 experts; the model "
                                         r"m.gguf has 4 layers x 7 experts\)"):
        p.check_model(geom(n_layers=4), "p.yaml")
    with pytest.raises(InputError, match="fingerprint"):
        p.check_model(geom(used=3), "p.yaml")
    assert geometry_fingerprint(geom()) != geometry_fingerprint(geom(used=3))


def test_coverage_and_hit_rate():
    counts = np.array([[10, 0, 5], [0, 3, 2]])
    p = ExpertProfile.from_counts(counts, geom(2, 3), None, 10)
    assert [p.coverage(n) for n in (0, 1, 2, 6)] == [0.0, 0.5, 0.75, 1.0]
    held = np.array([[1, 1, 0], [0, 0, 2]])
    assert p.hit_rate(held, 2) == 0.25 and p.hit_rate(np.zeros((2, 3), int), 2) is None


@pytest.mark.parametrize("text,kind,value", [("all", "all", 0), ("AUTO", "auto", 0), ("0", "slots", 0),
                                             ("4096", "slots", 4096), ("12GiB", "bytes", 12 * 2**30),
                                             ("1.5G", "bytes", int(1.5 * 2**30)), ("500MB", "bytes", 500 * 10**6)])
def test_cache_spec(text, kind, value):
    spec = parse_cache_spec(text)
    assert (spec.kind, spec.value) == (kind, value)


@pytest.mark.parametrize("text", ["", "-3", "12 parsecs", "1e3", "GiB"])
def test_bad_cache_spec(text):
    with pytest.raises(InputError, match="--expert-cache"):
        parse_cache_spec(text)
