"""The stage-stamp aggregation (strata_cli/engine/stage_timing.py) on synthetic stamp arrays: exact recovery, gaps,
zeros, reordering, stale and runaway stamps, wrap-around of the 64-bit timer, missing layers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from strata_cli.engine import stage_timing as sp
from test_window_steps import _Buffers, _Rows

GDN_STAGES = ["hc0-norm", "hc0-down", "hc-read0", "qkv", "gdn-mix", "out-proj"]  # qkv + z: one GEMV
QSA_STAGES = ["hc0-norm", "hc0-down", "hc-read0", "kvq", "qsa-mix", "out-proj"]
MOE_STAGES = ["hc1-write+norm", "hc1-down", "hc-read1", "router", "experts"]  # the shared expert: an entry of them


def make_plan(kinds=("GDN", "GDN", "QSA")) -> sp.Plan:
    """The stamp order record_window produces for layers of these kinds."""
    n = len(kinds)
    plan = sp.Plan(n, tuple(kinds))
    plan.add(n, "begin")
    plan.add(n, "embed")
    for layer, kind in enumerate(kinds):
        if layer:
            plan.add(layer - 1, "gap")
        for stage in (GDN_STAGES if kind == "GDN" else QSA_STAGES) + MOE_STAGES:
            plan.add(layer, stage)
    plan.add(n - 1, "gap")
    for stage in ("hc-out", "lm-head", "argmax"):
        plan.add(n, stage)
    return plan


def stamps_for(plan: sp.Plan, durations, t0: int) -> np.ndarray:
    """[W, n_slots] stamps whose stage durations (ns, [W, K] with column 0 ignored) are `durations`."""
    durations = np.atleast_2d(np.asarray(durations, dtype=np.uint64))
    W, K = durations.shape
    out = np.zeros((W, sp.n_slots(plan.n_layers)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        times = np.uint64(t0) + np.cumsum(durations * (np.arange(K) > 0), axis=1, dtype=np.uint64)
    out[:, plan.slots] = times
    return out


@pytest.fixture
def plan():
    return make_plan()


@pytest.fixture
def durations(plan):
    rng = np.random.default_rng(0)
    d = rng.integers(1_000, 50_000, size=(4, len(plan.slots))).astype(np.int64)
    d[:, 0] = 0
    return d


def test_exact_recovery_and_groups(plan, durations):
    stamps = stamps_for(plan, durations, 1_700_000_000_000_000_000)
    got = sp.stage_durations(stamps, plan.slots)
    np.testing.assert_array_equal(got, durations)
    rep = sp.aggregate(stamps, plan, event_ms=durations.sum(axis=1) / 1e6 * 1.02, window_size=4)
    assert rep.windows == 4 and rep.window_size == 4
    assert rep.stamped_ms == pytest.approx(durations.sum() / 4 / 1e6)
    assert rep.unaccounted_share == pytest.approx(0.02 / 1.02)
    mean = durations.mean(axis=0) / 1e6
    by_key = {(r["group"], r["stage"]): r for r in rep.groups}
    # gdn-mix exists in both GDN layers (1 and 2 of the plan order) and nowhere else
    mix_cols = [i for i, s in enumerate(plan.stages) if s == "gdn-mix"]
    assert by_key[("GDN", "gdn-mix")]["ms"] == pytest.approx(mean[mix_cols].sum())
    assert by_key[("GDN", "gdn-mix")]["layers"] == 2
    assert by_key[("QSA", "qsa-mix")]["layers"] == 1
    assert ("QSA", "gdn-mix") not in by_key
    assert by_key[("head", "lm-head")]["ms"] == pytest.approx(mean[plan.stages.index("lm-head")])
    assert sum(r["ms"] for r in rep.groups) == pytest.approx(rep.stamped_ms)
    assert len(rep.layers) == len(plan.slots) - 1
    assert [r["layer"] for r in rep.layers if r["stage"] == "out-proj"] == [0, 1, 2]


def test_missing_stamp_moves_its_time_to_the_next_stage(plan, durations):
    stamps = stamps_for(plan, durations, 10**12)
    k = plan.stages.index("qkv")
    stamps[1, plan.slots[k]] = 0
    got = sp.stage_durations(stamps, plan.slots)
    assert got[1, k] == 0
    assert got[1, k + 1] == durations[1, k] + durations[1, k + 1]
    np.testing.assert_array_equal(got.sum(axis=1), durations.sum(axis=1))
    np.testing.assert_array_equal(got[[0, 2, 3]], durations[[0, 2, 3]])


def test_out_of_order_stamps_never_go_negative(plan, durations):
    stamps = stamps_for(plan, durations, 10**12)
    a, b = plan.slots[5], plan.slots[6]
    stamps[2, [a, b]] = stamps[2, [b, a]]      # two stamps swapped
    got = sp.stage_durations(stamps, plan.slots)
    assert (got >= 0).all()
    assert got[2, 5] == durations[2, 5] + durations[2, 6] and got[2, 6] == 0
    np.testing.assert_array_equal(got.sum(axis=1), durations.sum(axis=1))


def test_stale_and_runaway_stamps_contribute_nothing(plan, durations):
    stamps = stamps_for(plan, durations, 10**15)
    k, j = 7, 20
    stamps[0, plan.slots[k]] = 10**15 - 5_000_000        # left over from an earlier window
    stamps[0, plan.slots[j]] = 2**63 + 12345              # garbage far past the window's end
    got = sp.stage_durations(stamps, plan.slots)
    assert got[0, k] == 0 and got[0, j] == 0
    assert got[0].sum() == durations[0].sum()
    assert got.max() <= durations.max() * 2


def test_missing_end_stamp_is_bounded_by_the_event_time(plan, durations):
    stamps = stamps_for(plan, durations, 10**15)
    total = int(durations[0].sum())
    stamps[0, plan.slots[-1]] = 0
    stamps[0, plan.slots[30]] = 10**15 + 10**12           # a runaway stamp, 1000 s late
    unbounded = sp.stage_durations(stamps[:1], plan.slots)
    assert unbounded.sum() > 10**11                          # without a bound nothing tells it apart
    got = sp.stage_durations(stamps[:1], plan.slots, limit_ns=total * 1.1)
    assert got[0, 30] == 0 and got[0, -1] == 0
    assert got.sum() == total - durations[0, -1]


def test_wrap_around_of_the_64_bit_timer(plan, durations):
    # wraps halfway through window 0 (a stamp of exactly 0 would read as missing: the seed's convention too)
    t0 = 2**64 - int(durations[0, : len(plan.slots) // 2].sum()) + 7
    stamps = stamps_for(plan, durations, t0)
    assert (stamps[0, plan.slots] < np.uint64(t0)).any()           # the wrap really happens
    got = sp.stage_durations(stamps, plan.slots)
    np.testing.assert_array_equal(got, durations)


def test_missing_begin_uses_the_first_present_stamp(plan, durations):
    stamps = stamps_for(plan, durations, 10**12)
    stamps[:, plan.slots[0]] = 0
    got = sp.stage_durations(stamps, plan.slots)
    assert (got[:, 1] == 0).all()                 # the new reference: no stage ends there
    np.testing.assert_array_equal(got[:, 2:], durations[:, 2:])


def test_missing_layer(durations):
    plan = make_plan(("GDN", "QSA", "GDN", "GDN"))
    rng = np.random.default_rng(3)
    d = rng.integers(500, 9_000, size=(3, len(plan.slots))).astype(np.int64)
    d[:, 0] = 0
    stamps = stamps_for(plan, d, 5 * 10**14)
    layer1 = [i for i, layer in enumerate(plan.layers) if layer == 1]
    stamps[:, [plan.slots[i] for i in layer1]] = 0
    got = sp.stage_durations(stamps, plan.slots)
    assert (got[:, layer1] == 0).all()
    nxt = layer1[-1] + 1                                  # layer 1's gap stamp ends the absorbed span
    np.testing.assert_array_equal(got[:, nxt], d[:, layer1].sum(axis=1) + d[:, nxt])
    np.testing.assert_array_equal(got.sum(axis=1), d.sum(axis=1))
    rep = sp.aggregate(stamps, plan)
    assert not any(r["group"] == "QSA" and r["ms"] > 0 for r in rep.groups)
    assert rep.stamped_ms == pytest.approx(d.sum() / 3 / 1e6)


def test_all_zero_and_single_stamp_windows(plan):
    zeros = np.zeros((2, sp.n_slots(plan.n_layers)), dtype=np.uint64)
    assert not sp.stage_durations(zeros, plan.slots).any()
    one = zeros.copy()
    one[:, plan.slots[9]] = 123456789
    assert not sp.stage_durations(one, plan.slots).any()
    rep = sp.aggregate(zeros, plan, event_ms=[1.0, 1.0])
    assert rep.stamped_ms == 0.0 and rep.unaccounted_share == pytest.approx(1.0)


def test_summary_line_is_the_seed_format(plan, durations):
    rep = sp.aggregate(stamps_for(plan, durations, 10**12), plan)
    line = sp.summary_line(rep)
    m = re.fullmatch(r" GDN layers:(?: \S+(?: \S+)* \d+\.\d\d)+ \| QSA layers:(?: \S+(?: \S+)* \d+\.\d\d)+ "
                     r"\| total (\d+\.\d\d) ms/window over 4 windows", line)
    assert m, line
    assert float(m.group(1)) == pytest.approx(rep.stamped_ms, abs=0.006)
    gdn, qsa = line.split(" | ")[:2]
    assert " gdn-mix " in gdn and " gdn-mix " not in qsa and " qsa-mix " in qsa and " lm-head " in gdn


def test_table_rows_shares_bars_and_totals(plan, durations):
    stamps = stamps_for(plan, durations, 10**12)
    event = durations.sum(axis=1) / 1e6 / 0.9              # the stamps account for 90 %
    rep = sp.aggregate(stamps, plan, event_ms=event)
    rows = sp.table_rows(rep, per_layer=True)
    stage_rows = [r for r in rows if r["layer"] == "all" and r["stage"] != "(all stages)"]
    assert sum(r["share"] for r in stage_rows) == pytest.approx(0.9)
    assert [r["group"] for r in stage_rows] == sorted((r["group"] for r in stage_rows),
                                                      key=["head", "GDN", "QSA"].index)
    per_layer = [r for r in rows if r["layer"] not in ("all", "")]
    assert len(per_layer) == len(plan.slots) - 1
    total = {r["stage"]: r for r in rows if r["group"] == "total"}
    assert total["unaccounted"]["share"] == pytest.approx(0.1)
    assert total["event-timed window"]["bar"] == "█" * sp.BAR_WIDTH
    assert "NOT within 5 %" in sp.accounting_line(rep)
    close = sp.aggregate(stamps, plan, event_ms=durations.sum(axis=1) / 1e6 * 1.01)
    assert ", within 5 %" in sp.accounting_line(close)


def test_bar():
    assert sp.bar(0) == "" and sp.bar(float("nan")) == "" and sp.bar(-1) == ""
    assert sp.bar(1.0, 10) == "█" * 10 and sp.bar(2.0, 10) == "█" * 10
    assert sp.bar(0.5, 10) == "█" * 5
    assert sp.bar(1 / 80, 10) == "▏"


def test_accumulator_reports_then_resets(plan, durations):
    acc = sp.Accumulator()
    stamps = stamps_for(plan, durations, 10**12)
    for row in stamps:
        acc.add(4, plan, row)
    acc.add(1, plan, stamps[0], event_ms=1.0)
    lines = acc.report_lines()
    assert [line.split(":")[0] for line in lines] == ["strata verify profile T=1", "strata verify profile T=4"]
    assert lines[1].endswith("over 4 windows") and lines[0].endswith("over 1 windows")
    assert acc.report_lines() == []


def test_slots_and_plan_errors():
    assert sp.slot(3, 0, "hc0-norm") == 0
    assert sp.slot(3, 3, "ple") == 3 * sp.STAGES_PER_ROW + 1  # the PLE's inputs: a window stage after "begin"
    with pytest.raises(ValueError, match="unknown layer stage 'ple'"):
        sp.slot(3, 1, "ple")
    assert sp.slot(3, 3, "begin") == 3 * sp.STAGES_PER_ROW
    assert sp.n_slots(3) == 4 * sp.STAGES_PER_ROW
    with pytest.raises(ValueError, match="unknown layer stage 'nope'"):
        sp.slot(3, 1, "nope")
    with pytest.raises(ValueError, match="unknown window stage 'gdn-mix'"):
        sp.slot(3, 3, "gdn-mix")
    with pytest.raises(ValueError, match="layer 4 outside 0..3"):
        sp.slot(3, 4, "gdn-mix")
    plan = sp.Plan(2, ("GDN", "QSA"))
    plan.add(0, "gdn-mix")
    with pytest.raises(ValueError, match="stamped twice"):
        plan.add(0, "gdn-mix")
    # the tier stages have named slots already (stamped by the expert-tier code once it exists)
    for stage in ("waitA", "waitB", "pcie-group", "waitCPU"):
        assert sp.slot(2, 1, stage) < sp.n_slots(2)


class _Launches:
    """Stands in for a launcher module: every launcher is a no-op that calls its mark hook like the real one;
    scratch classes and geometry helpers are the real module's."""

    PARTS = {"hc_read": ("norm", "down")}

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        if name[0].isupper() or name in ("cell_capacity", "router_fuses"):
            return getattr(self.real, name)

        def launch(*args, mark=None, **kwargs):
            for part in self.PARTS.get(name, ()) if mark is not None else ():
                mark("write+norm" if part == "norm" and kwargs.get("pending") is not None else part)
            pair = name in ("hc_read", "router_topk", "router_gemv_topk", "ple_kv")
            return (_Rows(), _Rows()) if pair else _Rows()

        return launch


def test_window_recorder_stamps_every_stage_once_in_order(fixture_dir, monkeypatch):
    """record_window's stamp calls (launchers replaced by no-ops, so this runs without a GPU) give a plan with
    begin first, argmax last, every layer's stages once, and no stamps at all when not profiling."""
    from types import SimpleNamespace

    from strata_cli.engine.gpu import window
    from strata_cli.gpu.launch_util import WindowPath
    from strata_cli.model.gguf_file import open_model

    for mod in ("embed", "gdn", "launch_gemv", "hyper", "moe", "ple", "qsa", "sampling"):
        monkeypatch.setattr(window, mod, _Launches(getattr(window, mod)))
    for helper in ("split_k", "argmax_scratch", "copy_async"):
        monkeypatch.setattr(window, helper, lambda *a: None)
    g = open_model(fixture_dir / "model-q8_0.gguf").geometry
    assert g.ple is not None and any(g.compress_ratios) and g.gdn_layers  # every kind of stage is exercised
    weights = SimpleNamespace(raw=lambda name: (_Rows(), 0), f32=lambda name: _Rows(), blk_f32=lambda *a: _Rows(),
                              blk_raw=lambda *a: (_Rows(), 0), hc=lambda prefix: SimpleNamespace(n_inj=1),
                              stack=lambda layer, name: (_Rows(), 0, 10**6),
                              shared_expert_id=lambda layer: 99)
    calls = []
    e = SimpleNamespace(buf=_Buffers(), w=weights, g=g, stage=SimpleNamespace(
        tokens=SimpleNamespace(device=None), positions=SimpleNamespace(device=None),
        out_ids=SimpleNamespace(device=None), out_nonfinite=SimpleNamespace(device=_Rows())), stamper=None, route_tap=None,
        tiers=None, window_paths=lambda T: WindowPath(gemv_tc=False),
        layers=(0, g.n_layers), has_ple=g.ple is not None)
    window.record_window(e, 4, None)
    plan = sp.Plan(g.n_layers, tuple("QSA" if a else "GDN" for a in g.layer_is_attn))
    e.stamper = lambda layer, stage, stream: calls.append(plan.add(layer, stage))
    window.record_window(e, 4, None)
    assert calls == plan.slots and len(set(calls)) == len(calls)
    # the PLE's n-gram rows and key / value projection are the window's inputs, before the embedding
    assert plan.stages[:3] == ["begin", "ple", "embed"] and plan.stages[-3:] == ["hc-out", "lm-head", "argmax"]
    assert plan.layers[:3] == [g.n_layers] * 3 and plan.layers[-1] == g.n_layers
    assert plan.layers[3:-3] == sorted(plan.layers[3:-3])            # layers in order, one block each
    for layer in range(g.n_layers):
        stages = [s for s, lay in zip(plan.stages, plan.layers) if lay == layer]
        # the previous layer's MoE write goes into this layer's first read (at the PLE layer with the PLE's mix:
        # one kernel, ple.cu ple_mix_norm)
        want = ["hc0-norm" if layer == 0 else "hc0-write+norm"] + GDN_STAGES[1:3]
        # the projections, then the whole mixer one launch (norms, cache rows, pooled keys, scores, attention)
        want += ["kvq", "qsa-mix", "out-proj"] if g.layer_is_attn[layer] else GDN_STAGES[3:]
        assert stages == want + MOE_STAGES + ["gap"], layer
