"""Expert tiers per stage of the layer split, host side (pure Python): each stage plans its own residency over its
layers with the whole --expert-cache budget (per GPU), from the profile's ranking restricted to those layers; its
prefault brings in its own layers' non-resident experts; make_engine hands the tier config to the split engine
instead of refusing it. The windows themselves: tests/test_tier_windows_cpu.py (stage cases), the GPU engine:
tests/test_gpu_layer_split.py."""

from __future__ import annotations

import numpy as np
import pytest

from strata_cli.errors import InputError
from strata_cli.tiers import prefault as pf
from strata_cli.tiers.config import TierConfig
from strata_cli.tiers.expert_profile import ExpertProfile
from strata_cli.tiers.residency import EXPERT_ROLES, choose_residency


class _Info:
    def __init__(self, raw):
        self.raw, self.n_bytes = raw, raw.nbytes


class _Geometry:
    def __init__(self, L, E):
        self.n_layers, self.n_expert, self.path = L, E, "m.gguf"


class _Model:
    """Routed expert tensors only, each layer's experts of a different size (bytes per projection and expert)."""

    def __init__(self, per_layer, E):
        self.geometry = _Geometry(len(per_layer), E)
        self.arrays = {f"blk.{layer}.{role}.weight": np.zeros((E, per), np.uint8)
                       for layer, per in enumerate(per_layer) for role in EXPERT_ROLES}

    def info(self, name):
        return _Info(self.arrays[name])


def _profile(L, E, rng, n_ranked):
    pairs = np.stack(np.meshgrid(np.arange(L), np.arange(E), indexing="ij"), -1).reshape(-1, 2)
    ranked = pairs[rng.permutation(len(pairs))[:n_ranked]].astype(np.int32)
    counts = rng.integers(0, 50, (L, E))
    return ExpertProfile(n_layers=L, n_expert=E, ranked=ranked, slots=n_ranked, counts=counts)


def _brute(model, order, layers, kind, value):
    """The stage's table by hand: walk the fill order, keep the stage's pairs, take them while they fit."""
    g = model.geometry
    lo, hi = layers
    per = [3 * model.arrays[f"blk.{layer}.ffn_gate_exps.weight"].shape[1] for layer in range(g.n_layers)]
    chosen, used = [], 0
    for layer, expert in order.tolist():
        if not lo <= layer < hi:
            continue
        if kind == "slots" and len(chosen) == value:
            break
        if kind == "bytes" and used + per[layer] > value:
            break  # a prefix of the ranking: the first pair that does not fit ends the cache
        chosen.append((layer, expert))
        used += per[layer]
    table = np.full((g.n_layers, g.n_expert), -1, np.int32)
    for layer in range(g.n_layers):
        ids = sorted(e for l_, e in chosen if l_ == layer)
        table[layer, ids] = np.arange(len(ids))
    return table, len(chosen)


@pytest.mark.parametrize("seed", range(6))
def test_stage_residency_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    L, E = int(rng.integers(3, 7)), int(rng.integers(2, 9))
    model = _Model(rng.integers(1, 40, L).tolist(), E)
    prof = _profile(L, E, rng, int(rng.integers(0, L * E + 1)))
    for _ in range(8):
        lo = int(rng.integers(0, L))
        hi = int(rng.integers(lo + 1, L + 1))
        for kind, value, text in [("slots", int(rng.integers(0, (hi - lo) * E + 3)), None),
                                  ("bytes", int(rng.integers(0, 3 * 40 * E * (hi - lo))), None),
                                  ("all", 0, "all"), ("bytes", 1, "1B")]:
            text = text or (str(value) if kind == "slots" else f"{value}B")
            for profile in (None, prof):
                cfg = TierConfig(cache=text, profile=None if profile is None else "p.yaml", loaded_profile=profile)
                table, note = choose_residency(model, cfg, None, 0, (lo, hi))
                order = (profile.order() if profile is not None else
                         np.stack(np.meshgrid(np.arange(L), np.arange(E), indexing="xy"), -1).reshape(-1, 2))
                want, n = _brute(model, np.asarray(order), (lo, hi), "slots" if kind == "all" else kind,
                                 (hi - lo) * E if kind == "all" else value)
                np.testing.assert_array_equal(table, want, err_msg=f"{text} layers {lo}..{hi - 1}")
                assert f"{n} of {(hi - lo) * E} (layer, expert) pairs of layers {lo}..{hi - 1}" in note
    # the whole model (no layers) is the stage [0, L)
    cfg = TierConfig(cache="5", profile="p.yaml", loaded_profile=prof)
    np.testing.assert_array_equal(choose_residency(model, cfg, None, 0)[0],
                                  choose_residency(model, cfg, None, 0, (0, L))[0])


def test_stage_budget_is_per_stage_and_auto_counts_the_stage():
    model = _Model([10, 10, 10, 10], 4)  # 30 bytes a pair
    for layers in [(0, 2), (2, 4)]:
        table, _ = choose_residency(model, TierConfig(cache="90B"), None, 0, layers)
        assert (table >= 0).sum() == 3 and (table[slice(*layers)] >= 0).sum() == 3  # each stage its 90 bytes
    table, _ = choose_residency(model, TierConfig(cache="auto"), (1 << 30) + 100, 10, (1, 3))
    assert (table >= 0).sum() == 3 and (table[[0, 3]] < 0).all()


def test_a_profile_of_another_model_is_refused_for_a_stage():
    model = _Model([10, 10, 10], 4)
    other = _profile(4, 4, np.random.default_rng(0), 5)
    with pytest.raises(InputError, match="p.yaml: profile of another geometry"):
        choose_residency(model, TierConfig(cache="3", profile="p.yaml", loaded_profile=other), None, 0, (1, 3))


def test_residency_for_a_stage_on_the_fixture(fixture_dir, monkeypatch):
    from strata_cli.engine.gpu.buffers import plan_buffers
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.setup import residency_for

    monkeypatch.delenv("STRATA_TEST_VERIFY_STALL", raising=False)
    model = open_model(fixture_dir / "model-q8_0.gguf")
    g = model.geometry
    arena = plan_buffers(g, 64, 8, (3, 8)).planned_bytes()
    # the stage's experts all fit: its zero-doorbell graph, though other layers hold no slot in its table
    table, note, _ = residency_for(model, TierConfig(cache=str(5 * g.n_expert)), arena, 8, (3, 8))
    assert table is None and "zero-doorbell" in note and "of layers 3..7" in note
    table, note, _ = residency_for(model, TierConfig(cache=str(5 * g.n_expert - 1), pcie_frac=0.5), arena, 8, (3, 8))
    assert table is not None and (table[:3] < 0).all() and (table[3:] >= 0).sum() == 5 * g.n_expert - 1
    table, note, _ = residency_for(model, TierConfig(cache="1B"), arena, 8, (3, 8))  # holds nothing: all misses
    assert table is not None and (table < 0).all() and "0 of" in note


def test_prefault_spans_are_the_stage_layers_only():
    model = _Model([100, 100, 100], 6)
    table = np.array([[-1, 0, -1, -1, -1, -1], [0, -1, -1, 1, -1, 2], [-1] * 6], dtype=np.int32)
    spans = pf.expert_spans(model, table, (1, 2))
    want = []
    for role in EXPERT_ROLES:
        base = model.arrays[f"blk.1.{role}.weight"].ctypes.data
        want += [(base + 100, 200), (base + 400, 100)]
    assert spans == want  # layers 0 and 2 are the other stages' to bring in
    assert len(pf.expert_spans(model, table)) == 3 * (2 + 2 + 1)


def test_make_engine_hands_the_tiers_to_every_stage(fixture_dir, monkeypatch):
    """--gpus with expert tiers: no refusal; the split engine gets the config (each stage builds its own tiers)."""
    import strata_cli.engine as engine_mod
    from strata_cli.engine.gpu import layer_split
    from strata_cli.engine.layer_plan import split_config
    from strata_cli.gpu import runtime
    from strata_cli.model.gguf_file import open_model

    model = open_model(fixture_dir / "model-q8_0.gguf")
    seen = {}

    class Split:
        def __init__(self, model, plan, n_ctx=None, max_t=None, tiers=None):
            seen.update(plan=[p.layers for p in plan], tiers=tiers)
            self.split_note, self.tier_note = "layer split: ...", "stage 0 (layers 0..3): expert cache: ..."

    monkeypatch.setattr(engine_mod, "gpu_probe", lambda: (None, None))
    monkeypatch.setattr(layer_split, "GPUSplitEngine", Split)
    monkeypatch.setattr(runtime, "cupy", lambda: type("cp", (), {"cuda": type("c", (), {"runtime": type(
        "r", (), {"getDeviceCount": staticmethod(lambda: 1)})})})())
    cfg = TierConfig(cache="1B", pcie_frac=0.5)
    engine_mod.make_engine(model, "gpu", tiers=cfg, split=split_config("0,0", "3,5"))
    assert seen == {"plan": [(0, 3), (3, 8)], "tiers": cfg}
