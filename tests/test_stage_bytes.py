"""What each stage of the profiling window reads (engine/stage_bytes.py's ledger, analysis/traffic.stage_bytes), on the
CPU: the ledger on its own, then filled by the real recorder and launchers over host arrays (tests/window_launches.py)
on the fixture and random geometries, against verify-bench's read_bytes (analysis/traffic.window_bytes) of the same
window. tests/test_gpu_profile.py holds `strata profile`'s columns to it on the device.

Run with -s to see the fixture's stage bytes table."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from random_models import random_preset, write_random
from window_launches import host_engine, window_reads

from strata_cli.analysis.traffic import (cells_read, expected_distinct_experts, floor_line, floor_summary, stage_bytes,
                                         window_bytes)
from strata_cli.engine import stage_bytes as sb
from strata_cli.engine.stage_timing import Plan, aggregate, table_rows
from strata_cli.model.gguf_file import open_model

# stamps whose launches read no weight: the reference stamp, the embedding (a gathered table), a layer's end, the
# argmax (its logits are an activation); the QSA mixer reads its norms' weights beside the K/V cache and pooled keys
NO_WEIGHTS = {"begin", "embed", "gap", "argmax"}


# ---- the ledger alone

def _ledger(*named):
    return sb.Ledger([sb.region(name, kind, arr) for name, kind, arr in named])


def test_ledger_counts_each_weight_argument_at_its_slice_once_per_launch():
    w = np.zeros((8, 16), np.float32)
    exps = np.zeros((5, 3, 4), np.uint8)           # 5 experts of 12 bytes
    state = np.zeros((4, 10), np.float32)
    x = np.zeros((2, 16), np.float32)              # an activation: no region
    ledger = _ledger(("blk.0.w.weight", sb.WEIGHT, w), ("blk.0.ffn_up_exps.weight", sb.EXPERTS, exps),
                     ("S.0", sb.STATE, state), ("token_embd.weight", sb.TABLE, np.zeros((3, 4), np.float32)))
    ledger.launch("f", (w[2:4], x, np.int32(3), None, 0, w[2:4], np.float32(1.0)))
    ledger.launch("g", (w, exps, state))
    ledger.close(0, "qkv")
    ledger.launch("h", (x,))
    ledger.close(0, "gap")
    reads = ledger.finish()
    assert [(r.layer, r.stage, r.launches) for r in reads] == [(0, "qkv", 2), (0, "gap", 1)]
    assert reads[0].dense == w[2:4].nbytes + w.nbytes == 128 + 512
    assert reads[0].weights == [("blk.0.w.weight", 128), ("blk.0.w.weight", 512)]
    assert reads[0].experts == [("blk.0.ffn_up_exps.weight", 12, 5)]
    assert reads[0].state == [("S.0", state.nbytes, 40)]
    assert reads[1].dense == 0 and not reads[1].experts and not reads[1].state


def test_ledger_refuses_overlaps_and_launches_after_the_last_stamp():
    w = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _ledger(("a", sb.WEIGHT, w[:40]), ("b", sb.WEIGHT, w[32:]))
    ledger = _ledger(("a", sb.WEIGHT, w))
    ledger.close(0, "begin")
    ledger.launch("late", (w,))
    with pytest.raises(ValueError, match="after the window's last stamp"):
        ledger.finish()
    assert sb.region("empty", sb.WEIGHT, np.zeros((0, 4))) is None


def test_weight_kinds_and_state_names():
    assert sb.weight_kind("blk.3.ffn_gate_exps.weight") == sb.EXPERTS
    assert sb.weight_kind("blk.3.ffn_gate_shexp.weight") == sb.WEIGHT
    assert sb.weight_kind("token_embd.weight") == sb.TABLE
    assert [sb.state_name(n) for n in ("S.0", "kc.3", "pooled.7", "ple_history", "qkv.0", "sel_keys")] == \
        [True, True, True, True, False, False]


def test_observing_shows_this_threads_launches_and_leaves_them_as_they_were(monkeypatch):
    import threading

    from strata_cli.gpu import compile as nvrtc

    class Kernel:
        def __call__(self, grid, block, args, shared_mem=0):
            launched.append((args, shared_mem))

    fn, launched, seen = Kernel(), [], []
    monkeypatch.setattr(nvrtc, "_function", lambda module, function, defines=(): fn)
    assert nvrtc.kernel("m", "f") is fn  # nothing observing: the kernel itself
    with nvrtc.observing(lambda name, args: seen.append((name, args))):
        k = nvrtc.kernel("m", "f")
        k.max_dynamic_shared_size_bytes = 4096  # launch_quant raises a kernel's shared memory so
        assert fn.max_dynamic_shared_size_bytes == k.max_dynamic_shared_size_bytes == 4096
        k((1, 1, 1), (32, 1, 1), (1, 2), shared_mem=64)
        other = []
        thread = threading.Thread(target=lambda: other.append(nvrtc.kernel("m", "g")))
        thread.start()
        thread.join()
        assert other == [fn]  # another thread's launches are not this recording's
    assert seen == [("f", (1, 2))] and launched == [((1, 2), 64)]
    assert nvrtc.kernel("m", "f") is fn


# ---- the arithmetic

def test_cells_read_is_the_selections_count():
    from strata_cli.ops.qsa import select_cells

    rng = np.random.default_rng(5)
    for _ in range(300):
        ratio, n_cells = int(rng.integers(1, 6)), int(rng.integers(1, 90))
        budget = ratio * int(rng.integers(1, 5))
        scores = rng.standard_normal(max(n_cells // ratio, 1)).astype(np.float32)
        assert cells_read(n_cells, ratio, budget) == len(select_cells(scores, n_cells, ratio, budget))
        assert cells_read(n_cells, 0, budget) == n_cells  # no indexer: the dense path attends to every cell


def test_stage_bytes_prices_experts_and_state():
    from types import SimpleNamespace

    g = SimpleNamespace(n_expert=10, n_expert_used=3, compress_ratios=[0, 4], idx_budget=8)
    reads = [sb.StageReads(1, "experts", experts=[("e.gate", 100, 11), ("e.down", 50, 10)]),
             sb.StageReads(1, "qsa-mix", state=[("kc.1", 4096, 64), ("vc.1", 4096, 64), ("pooled.1", 999, 16)]),
             sb.StageReads(1, "kvq", dense=7, state=[("kc.1", 4096, 64), ("pooled.1", 999, 16)]),
             sb.StageReads(0, "gdn-mix", dense=3, state=[("S.0", 256, 64), ("conv.0", 12, 4)])]
    T, depth = 5, 30
    d = expected_distinct_experts(10, 3, T)
    got = stage_bytes(reads, g, T, depth)
    assert got[0]["experts"] == pytest.approx(100 * (d + 1) + 50 * d)  # the shared expert: the 11th of gate's tensor
    n = depth + T  # 35 cells: 8 blocks > the budget's 2, so 2 blocks and the 3 tail cells, and the 8 blocks scored
    assert got[1]["state"] == 2 * 64 * (2 * 4 + 3) + n // 4 * 16 and got[1]["weights"] == 0
    assert got[2] == {"layer": 1, "stage": "kvq", "weights": 7, "experts": 0, "state": 0, "bytes": 7}
    assert got[3]["state"] == 268 and got[3]["bytes"] == 271
    # below the budget no block is scored: no pooled key read
    low = stage_bytes(reads[1:2], g, 1, 6)[0]
    assert low["state"] == 2 * 64 * 7
    assert all(r["bytes"] == r["weights"] + r["experts"] + r["state"] for r in got)


def test_table_rows_floor_columns():
    plan = Plan(1, ("GDN",))
    for layer, stage in [(1, "begin"), (0, "qkv"), (0, "experts"), (0, "gap"), (1, "lm-head"), (1, "argmax")]:
        plan.add(layer, stage)
    stamps = np.zeros((2, plan.slots[-1] + 1), np.uint64)
    stamps[:, plan.slots] = np.array([1000, 3000, 13000, 14000, 18000, 20000], np.uint64)  # ns
    nbytes = [0, 2e6, 30e6, 0, 4e6, 0]
    rep = aggregate(stamps, plan, [0.02, 0.02], 1, nbytes)
    assert rep.read_bytes == 36e6
    rate = 4e12
    rows = {(r["layer"], r["group"], r["stage"]): r for r in table_rows(rep, True, rate)}
    qkv = rows[("all", "GDN", "qkv")]
    assert qkv["bytes"] == 2e6 and qkv["floor_us"] == pytest.approx(0.5) and qkv["x_floor"] == pytest.approx(4.0)
    assert rows[("all", "GDN", "experts")]["x_floor"] == pytest.approx(10 / 7.5)
    assert rows[("0", "GDN", "experts")]["bytes"] == 30e6
    assert rows[("all", "GDN", "gap")]["x_floor"] is None  # reads nothing counted: no floor
    assert rows[("all", "GDN", "(all stages)")]["bytes"] == 32e6
    window = rows[("", "total", "event-timed window")]
    assert window["bytes"] == 36e6 and window["x_floor"] == pytest.approx(20 / 9)
    assert rows[("", "total", "unaccounted")]["bytes"] is None
    bare = table_rows(aggregate(stamps, plan, [0.02, 0.02], 1))  # no bytes tallied (STRATA_VERIFY_PROFILE)
    assert all(r["bytes"] is None and r["x_floor"] is None for r in bare)
    with pytest.raises(ValueError):
        aggregate(stamps, plan, None, 1, nbytes[:-1])


def test_floor_summary():
    reads = [{"weights": 3e6, "experts": 5e6, "state": 1e6}, {"weights": 1e6, "experts": 0, "state": 0}]
    f = floor_summary(reads, 8.5e6, 4.5e12, 0.02)
    assert f["read_bytes"] == 10e6 and f["floor_ms"] == pytest.approx(10e6 / 4.5e12 * 1e3)
    assert f["x_floor"] == pytest.approx(0.02 / f["floor_ms"]) and f["upload_growth_bytes"] == pytest.approx(0.5e6)
    line = floor_line(f, 32)
    assert "10.000 MB" in line and "state at depth 32 1.000" in line and "4500 GB/s" in line and "+0.500 MB" in line


# ---- the window's launches on the CPU

def _upload_growth(model, w) -> int:
    """What the device's copies of the dense tensors hold beyond the file's bytes, from the uploads against the file:
    each HC read's down + inject rows padded to a multiple of 32 (zero rows), and tensors uploaded as f32 (vectors,
    conv taps, the shared expert's scalar gate, an HC up matrix of a block type) that the file holds narrower."""
    from strata_cli.engine.gpu.weights import STACKS

    growth = 0
    for name, arr in w.arrays():
        if sb.weight_kind(name) != sb.WEIGHT:
            continue
        if name.endswith("_down_inject"):
            prefix = name[:-len("_down_inject")]
            parts = [model.info(prefix + p) for p in ("_down.weight", "_inject.weight") if prefix + p in model.specs]
            pad = arr.shape[0] - sum(int(p.shape[1]) for p in parts)
            assert 0 <= pad < 32 and arr.shape[0] % 32 == 0
            assert arr.nbytes - sum(p.n_bytes for p in parts) == pad * (arr.nbytes // arr.shape[0])
            growth += pad * (arr.nbytes // arr.shape[0])
            continue
        blk = name[:name.index(".", 4) + 1] if name.startswith("blk.") else ""
        role = name[len(blk):]
        held = [blk + r for r in STACKS[role] if blk + r in model.specs] if role in STACKS else [name]
        file_bytes = sum(model.info(n).n_bytes for n in held)
        assert arr.nbytes == file_bytes or arr.dtype == np.float32, name
        growth += arr.nbytes - file_bytes
    return growth


def _check_window(monkeypatch, engine, T: int, depth: int = 32) -> list[dict]:
    model, g, w = engine.w.model, engine.g, engine.w
    plan, reads = window_reads(monkeypatch, engine, T)
    assert [(r.layer, r.stage) for r in reads] == list(zip(plan.layers, plan.stages))
    # every dense upload is read by exactly one launch of the window, whole
    counted = Counter(name for r in reads for name, _ in r.weights)
    dense = {name: arr.nbytes for name, arr in w.arrays() if sb.weight_kind(name) == sb.WEIGHT}
    assert counted == Counter(dense.keys())
    assert all(nbytes == dense[name] for r in reads for name, nbytes in r.weights)
    rows = stage_bytes(reads, g, T, depth)
    for r in rows:
        reads_weights = r["stage"] not in NO_WEIGHTS
        assert (r["weights"] + r["experts"] > 0) == reads_weights, r
    # the sum against verify-bench's read_bytes of the same window
    traffic = window_bytes(model, T)
    total = sum(r["weights"] + r["experts"] for r in rows)
    assert total == pytest.approx(traffic["total"] + _upload_growth(model, w), rel=1e-12)
    experts = [r for r in rows if r["experts"]]
    assert {r["stage"] for r in experts} == {"experts"} and len(experts) == g.n_layers
    d = expected_distinct_experts(g.n_expert, g.n_expert_used, T)
    for r in experts:
        per = [model.info(f"blk.{r['layer']}.ffn_{p}_exps.weight").n_bytes // g.n_expert for p in ("gate", "up", "down")]
        shared = 1 if w.shared_expert_id(r["layer"]) is not None else 0
        assert r["experts"] == pytest.approx(sum(per) * (d + shared))
    b = engine.buf
    for r in rows:  # the state each stage reads, and no other stage any
        layer, stage = r["layer"], r["stage"]
        want = 0
        if stage == "gdn-mix":
            want = b[f"S.{layer}"].nbytes + b[f"conv.{layer}"].nbytes
        elif stage == "qsa-mix":
            ratio = g.compress_ratios[layer]
            want = 2 * cells_read(depth + T, ratio, g.idx_budget) * b[f"kc.{layer}"][0].nbytes
            if ratio and (depth + T) // ratio > g.idx_budget // ratio:  # the row is scored
                want += (depth + T) // ratio * b[f"pooled.{layer}"][0].nbytes
        elif stage == "hc0-write+norm" and layer == g.ple.layer:  # the PLE's conv step over its history
            want = b["ple_history"].nbytes
        assert r["state"] == want, r
    assert sum(r["stage"] == "qsa-mix" for r in rows) == len(g.attn_layers)
    return rows


@pytest.fixture
def fixture_model(fixture_dir):
    return open_model(fixture_dir / "model-q8_0.gguf")


@pytest.mark.parametrize("T", [1, 8])
def test_fixture_stage_bytes(monkeypatch, fixture_model, T):
    engine = host_engine(monkeypatch, fixture_model)
    rows = _check_window(monkeypatch, engine, T)
    plan, reads = window_reads(monkeypatch, engine, T)
    rep = aggregate(np.zeros((1, len(engine.buf["stamps"])), np.uint64), plan, None, T, [r["bytes"] for r in rows])
    print(f"\nT = {T}: stage bytes per window (depth 32), the fixture; verify-bench's read_bytes "
          f"{window_bytes(fixture_model, T)['total']:.0f}")
    print(f"{'group':6} {'stage':16} {'n':>3} {'MB':>9} {'floor µs @ 4.4 TB/s':>20}")
    for r in table_rows(rep, False, 4.4e12):
        if r["bytes"] is not None:
            print(f"{r['group']:6} {r['stage']:16} {r['layers'] or '':>3} {r['bytes'] / 1e6:9.4f} "
                  f"{r['floor_us']:20.3f}")


def test_fixture_dense_bytes_do_not_depend_on_T(monkeypatch, fixture_model):
    engine = host_engine(monkeypatch, fixture_model)
    one, eight = (stage_bytes(window_reads(monkeypatch, engine, T)[1], engine.g, T, 32) for T in (1, 8))
    assert [r["weights"] for r in one] == [r["weights"] for r in eight]
    assert sum(r["experts"] for r in eight) > sum(r["experts"] for r in one) > 0


@pytest.mark.parametrize("seed,ggml_type", [(11, "F32"), (12, "Q8_0"), (13, "F32"), (14, "Q8_0")])
@pytest.mark.parametrize("T", [1, 8])
def test_random_geometry_stage_bytes(monkeypatch, tmp_path, seed, ggml_type, T):
    rng = np.random.default_rng(seed)
    pins = {"shared_expert_intermediate_size": 48, "moe_intermediate_size": 32} if seed == 13 else {}
    if seed == 14:  # the PLE on the first layer: its conv step the window's first read's pending write
        pins = {"ple_layer": 0}
    model = write_random(tmp_path, random_preset(rng, **pins), seed=seed, ggml_type=ggml_type)
    engine = host_engine(monkeypatch, model, n_ctx=128)
    if seed == 13:  # a shared expert of its own width: launches of its own, its stage "shared"
        assert all(engine.w.shared_expert_id(layer) is None for layer in range(engine.g.n_layers))
    rows = _check_window(monkeypatch, engine, T, depth=int(rng.integers(0, 100)))
    for layer in range(engine.g.n_layers):  # the shared expert's own launches, or entries of the routed ones
        own = any(r["stage"] == "shared" and r["layer"] == layer and r["weights"] > 0 for r in rows)
        assert own == (engine.w.shared_expert_id(layer) is None)
