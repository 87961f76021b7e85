"""Routing traces (`make-profile --trace`) and `strata cache-sim`: the trace format, every cache policy against a
brute-force reference, and the static policy's hit rate equal to profile-info --holdout's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_tiers_commands import cli, model, tokens  # noqa: F401 - the fixtures and the runner of those tests

from strata_cli.tiers.trace import load_trace


def test_trace_holds_every_pick_in_the_order_served(model, tokens, tmp_path):
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.expert_profile import load_profile
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


# ---- every policy against a brute-force reference


def _brute(windows, L, E, table0, kind, nbytes, budget):
    """Each policy straight from its definition (tiers/cache_policy.py's docstring), with dicts and sorted()."""
    table = {(l, e): int(table0[l, e]) for l in range(L) for e in range(E) if table0[l, e] >= 0}
    capacity = [int((table0[l] >= 0).sum()) for l in range(L)]
    last, freq, pending = {}, {}, []
    picks, hits, copies = np.zeros(L, int), np.zeros(L, int), np.zeros(L, int)
    for w, served in enumerate(windows):
        for l, e in served:
            picks[l] += 1
            hits[l] += (l, e) in table
        for l, e in served:
            last[(l, e)] = w
            freq[(l, e)] = freq.get((l, e), 0) + 1
        for l, e, s in pending:
            table[(l, e)] = s
        pending = []
        if kind == "static":
            continue
        swaps = []
        for l in range(L):
            held = {e for e in range(E) if (l, e) in table}

            def key(e):
                score = last.get((l, e), -1) if kind == "lru" else freq.get((l, e), 0)
                return (score, e in held, -e)

            ranked = sorted(range(E), key=key, reverse=True)
            want = set(ranked[:capacity[l]])
            admits = [e for e in ranked if e in want and e not in held]
            evicts = [e for e in reversed(ranked) if e in held and e not in want]
            swaps += [(rank, l, a, v) for rank, (a, v) in enumerate(zip(admits, evicts))]
        spent = 0
        for _, l, a, v in sorted(swaps, key=lambda s: (s[0], s[1])):
            if budget is not None and spent + nbytes[l] > budget:
                break
            spent += nbytes[l]
            pending.append((l, a, table.pop((l, v))))
            copies[l] += 1
    return picks, hits, copies


def _random_trace(rng, L, E, n_windows, k):
    from strata_cli.tiers.trace import RoutingTrace

    hot = rng.dirichlet(np.full(E, 0.3), size=L)  # skewed routing, drifting halfway
    cols = {key: [] for key in ("window", "row", "layer", "expert")}
    windows, row = [], 0
    for w in range(n_windows):
        if w == n_windows // 2:
            hot = hot[:, rng.permutation(E)]
        T = int(rng.integers(1, 5))
        served = []
        for layer in range(L):
            for t in range(T):
                for e in rng.choice(E, size=k, replace=False, p=hot[layer]):
                    served.append((layer, int(e)))
                    for key, v in zip(cols, (w, row + t, layer, int(e))):
                        cols[key].append(v)
        windows.append(served)
        row += T
    nbytes = rng.integers(100, 400, L).astype(np.int64)
    trace = RoutingTrace(L, E, nbytes, **{key: np.array(v, np.int32) for key, v in cols.items()})
    return trace, windows


@pytest.mark.parametrize("kind", ["static", "lru", "lfu"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_policy_equals_the_brute_force_reference(kind, seed):
    from strata_cli.tiers.cache_policy import replay
    from strata_cli.tiers.expert_profile import ExpertProfile
    from strata_cli.tiers.residency import fill_order, slot_table

    rng = np.random.default_rng(seed)
    L, E = 3, 9
    trace, windows = _random_trace(rng, L, E, n_windows=12, k=2)
    counts = rng.integers(0, 50, (L, E))
    geometry = type("G", (), {"n_layers": L, "n_expert": E, "n_expert_used": 2, "n_embd": 8, "n_ff_exp": 4})()
    profile = ExpertProfile.from_counts(counts, geometry, None, tokens_seen=1)
    for n_slots in (0, 4, 10, 27):
        for prof in (None, profile):
            for budget in (None, 500, 150):
                got = replay(trace, kind, n_slots, prof, budget)
                table0 = slot_table(L, E, fill_order(L, E, prof), n_slots)
                picks, hits, copies = _brute(windows, L, E, table0, kind, trace.expert_bytes, budget)
                where = f"{kind} slots {n_slots} profile {prof is not None} budget {budget}"
                np.testing.assert_array_equal(got.picks, picks, err_msg=where)
                np.testing.assert_array_equal(got.hits, hits, err_msg=where)
                np.testing.assert_array_equal(got.copies, copies, err_msg=where)
                np.testing.assert_array_equal(got.copied_bytes, copies * trace.expert_bytes, err_msg=where)
    assert kind == "static" or replay(trace, kind, 10).copies.sum() > 0  # the reference is not vacuous


def test_static_hit_rate_on_a_held_out_trace_equals_profile_info(model, tokens, tmp_path):
    """cache-sim's static policy and profile-info --holdout measure the same thing on the same held-out text."""
    assert cli("make-profile", model, "--tokens", tokens[0], "-o", tmp_path / "p.yaml").exit_code == 0
    assert cli("make-profile", model, "--tokens", tokens[1], "-o", tmp_path / "h.yaml",
               "--trace", tmp_path / "held.npz").exit_code == 0
    sizes = "0,8,20,33,64,100,128"
    info = cli("profile-info", tmp_path / "p.yaml", "--slots", sizes, "--holdout", tokens[1], "--model", model,
               "--format", "json")
    sim = cli("cache-sim", tmp_path / "held.npz", "--slots", sizes, "--policy", "static", "--profile",
              tmp_path / "p.yaml", "--format", "json")
    assert info.exit_code == 0 and sim.exit_code == 0, info.output + sim.output
    want = [r["holdout_hit"] for r in json.loads(info.stdout)["rows"]]
    rows = json.loads(sim.stdout)["rows"]
    assert [r["hit_rate"] for r in rows] == want
    assert 0 < want[2] < 1 and all(r["copied_bytes_per_window"] == 0 for r in rows)


def test_cache_sim_rows_and_per_layer(model, tokens, tmp_path):
    assert cli("make-profile", model, "--tokens", tokens[0], "-o", tmp_path / "p.yaml", "--window", 4,
               "--trace", tmp_path / "t.npz").exit_code == 0
    res = cli("cache-sim", tmp_path / "t.npz", "--slots", "16,64", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["policy"], r["slots"]) for r in rows] == [(p, n) for p in ("static", "lru", "lfu") for n in (16, 64)]
    assert {"policy", "slots", "hit_rate", "copied_bytes_per_window"} <= set(rows[0])
    per = json.loads(cli("cache-sim", tmp_path / "t.npz", "--slots", "16", "--policy", "lru", "--per-layer",
                         "--format", "json").stdout)["rows"]
    assert [r["layer"] for r in per] == list(range(8))
    trace = load_trace(tmp_path / "t.npz")
    picks = np.bincount(trace.layer, minlength=8)
    total = sum(r["hit_rate"] * p for r, p in zip(per, picks)) / picks.sum()
    assert abs(total - rows[2]["hit_rate"]) < 1e-12
    assert abs(sum(r["copied_bytes_per_window"] for r in per) - rows[2]["copied_bytes_per_window"]) < 1e-6
    table = cli("cache-sim", tmp_path / "t.npz", "--slots", "16")
    assert table.exit_code == 0 and "hit rate" in table.stdout and "lfu" in table.stdout


@pytest.mark.parametrize("args,message", [
    (["--slots", "16", "--policy", "fifo"], "--policy 'fifo'"),
    (["--slots", "999"], "--slots 999: the trace's model has 128"),
    (["--slots", "16", "--max-copy", "lots"], "--max-copy 'lots'"),
])
def test_cache_sim_errors(model, tokens, tmp_path, args, message):
    assert cli("make-profile", model, "--random", "4", "-o", tmp_path / "p.yaml",
               "--trace", tmp_path / "t.npz").exit_code == 0
    res = cli("cache-sim", tmp_path / "t.npz", *args)
    assert res.exit_code == 2 and message in res.output, res.output  # a bad option value: usage error
