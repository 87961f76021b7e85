"""make-profile's counting run on the GPU engine without a GPU: --expert-cache parsed, the auto choice (every
expert resident when they fit, else as many as fit), the all-resident engine's route tap (its host side against
the numpy engine's picks, its copy nodes in the counting graph only). tests/test_gpu_tiers.py and
tests/test_gpu_cache_policy.py hold the real engines' counts and traces to numpy at every placement."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from window_launches import host_engine, window_launches

from strata_cli.engine import routing
from strata_cli.errors import OptionError
from strata_cli.model.gguf_file import open_model
from strata_cli.tiers.trace import TraceRecorder


@pytest.fixture
def model(fixture_dir):
    return open_model(fixture_dir / "model-q8_0.gguf")


def test_counting_tiers_parse_every_spec():
    for text, kind in [("auto", "auto"), ("all", "all"), ("0", "slots"), ("4096", "slots"), ("12GiB", "bytes")]:
        cfg = routing.counting_tiers(text)
        assert cfg.cache.kind == kind and cfg.pcie_frac == 0.0
    assert routing.counting_tiers().cache.kind == routing.COUNTING_CACHE == "auto"
    with pytest.raises(OptionError, match=r"^--expert-cache 'lots': expected all, auto"):
        routing.counting_tiers("lots")


def _free_bytes(monkeypatch, free: int) -> None:
    """memGetInfo of a card with `free` bytes free (tiers/setup.py reads it for auto)."""
    from strata_cli.tiers import setup

    runtime = SimpleNamespace(memGetInfo=lambda: (free, free))
    monkeypatch.setattr(setup, "cupy", lambda: SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))


def test_auto_keeps_every_expert_when_they_fit_else_what_fits(monkeypatch, model):
    """The counting run's auto is the engine's: free memory less dense weights, arena and AUTO_MARGIN; all experts
    fit -> no table (the doorbell-free graph), else the largest prefix of the fill order that fits."""
    from strata_cli.engine.gpu.buffers import plan_buffers
    from strata_cli.tiers import setup
    from strata_cli.tiers.config import TierConfig
    from strata_cli.tiers.residency import AUTO_MARGIN, choose_residency, expert_bytes

    monkeypatch.delenv("STRATA_TEST_VERIFY_STALL", raising=False)
    g = model.geometry
    arena = plan_buffers(g, 64, 8).planned_bytes()
    fixed = setup._dense_bytes(model, (0, g.n_layers)) + arena + AUTO_MARGIN
    every = int(expert_bytes(model).sum()) * g.n_expert
    _free_bytes(monkeypatch, fixed + every)
    table, note, _ = setup.residency_for(model, routing.counting_tiers(), arena, 8)
    assert table is None and "zero-doorbell graph" in note
    assert f"{g.n_layers * g.n_expert} of {g.n_layers * g.n_expert} (layer, expert) pairs" in note
    budget = every - 1  # one byte short: every pair but the last of the fill order
    _free_bytes(monkeypatch, fixed + budget)
    table, note, cfg = setup.residency_for(model, routing.counting_tiers(), arena, 8)
    want, _ = choose_residency(model, TierConfig(cache=f"{budget}B"), None, 0)
    np.testing.assert_array_equal(table, want)
    assert int((table >= 0).sum()) == g.n_layers * g.n_expert - 1 and cfg.pcie_frac == 0.0
    _free_bytes(monkeypatch, fixed // 2)  # not even the dense weights' room: no expert in VRAM
    table, note, _ = setup.residency_for(model, routing.counting_tiers(), arena, 8)
    assert (table < 0).all() and note.startswith("expert cache: 0 of")


class _AllResidentEngine:
    """The all-resident GPU engine as count_routing sees it (no tiers, graphs captured on first use), its windows
    the numpy engine's: each layer's ids [T, K] land in the route tap as the graph's copy puts them there, every
    other layer with the shared expert's id as a (K + 1)-th column (router_gemv_topk's fused slots)."""

    tiers = None

    def __init__(self, model, n_ctx):
        from strata_cli.engine.reference import ReferenceEngine

        self.ref = ReferenceEngine(model, n_ctx=n_ctx)
        self.max_t, self.n_ctx, self.graphs, self.route_tap = 16, self.ref.n_ctx, {}, None
        self.ref.route_hook = self._copy

    def _copy(self, layer, ids):
        T, K = ids.shape
        wide = np.concatenate([ids, np.full((T, 1), 999, ids.dtype)], axis=1) if layer % 2 else ids
        self.route_tap.rows(layer, wide.shape)[...] = wide

    n_past = property(lambda self: self.ref.n_past)

    def run(self, tokens):
        self.route_tap.ids[...] = -1  # what a layer did not write this window would show as a bad id
        return self.ref.run(tokens)

    def commit(self, n):
        self.ref.commit(n)

    def reset(self):
        self.ref.reset()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ref.close()


def test_route_tap_counts_and_trace_equal_numpy(monkeypatch, model):
    from strata_cli import engine as engine_pkg
    from strata_cli.gpu import runtime

    built = []

    def make_engine(m, device, n_ctx, tiers=None):
        assert device == "gpu" and tiers.cache.kind == "auto" and tiers.pcie_frac == 0.0
        built.append(_AllResidentEngine(m, n_ctx))
        return built[-1]

    monkeypatch.setattr(engine_pkg, "make_engine", make_engine)
    monkeypatch.setattr(runtime, "cupy", lambda: SimpleNamespace(zeros=np.zeros, asnumpy=np.array))
    g = model.geometry
    tokens = np.random.default_rng(4).integers(0, g.n_vocab, 21)  # windows of 8, 8, 5; a context restart at 16
    traces = {}
    for device in ("gpu", "cpu"):
        traces[device] = TraceRecorder(g.n_layers, g.n_expert, np.ones(g.n_layers))
        counts = routing.count_routing(model, tokens, 8, 16, device=device, trace=traces[device])
        assert counts.sum() == len(tokens) * g.n_layers * g.n_expert_used
        traces[device + " counts"] = counts
    np.testing.assert_array_equal(traces["gpu counts"], traces["cpu counts"])
    a, b = traces["gpu"].trace(), traces["cpu"].trace()
    for key in ("window", "row", "layer", "expert"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert isinstance(built[0].route_tap, routing.RouteTap) and built[0].route_tap.width[1] == g.n_expert_used + 1


def test_route_tap_refuses_another_width():
    tap = routing.RouteTap(2, 4, 3, zeros=np.zeros)
    assert tap.rows(0, (4, 3)).shape == (4, 3) and tap.rows(1, (2, 4)).shape == (2, 4)
    with pytest.raises(ValueError, match="width 5"):
        tap.rows(0, (1, 5))


def test_the_tap_adds_one_copy_a_layer_to_the_counting_graph_only(monkeypatch, model):
    """The window recorder with a route tap: one memcpy more per layer, from the ids the router wrote; without
    one (every engine but a counting run's) the nodes are the doorbell-free graph's, unchanged."""
    g = model.geometry
    engine = host_engine(monkeypatch, model)
    for T in (1, 8):
        plain = window_launches(monkeypatch, engine, T)
        engine.route_tap = routing.RouteTap(g.n_layers, 16, g.n_expert_used, zeros=np.zeros)
        try:
            tapped = window_launches(monkeypatch, engine, T)
        finally:
            engine.route_tap, tap = None, engine.route_tap
        assert [b - a for a, b in zip(plain.per_layer(), tapped.per_layer())] == [1] * g.n_layers
        assert tapped.kinds() - plain.kinds() == {"memcpy": g.n_layers}
        assert set(tap.width) <= {g.n_expert_used, g.n_expert_used + 1} and all(tap.width)
        assert window_launches(monkeypatch, engine, T).per_layer() == plain.per_layer()


def test_the_tap_copies_the_routers_ids(monkeypatch, model):
    from strata_cli.engine.gpu import window

    g = model.geometry
    engine = host_engine(monkeypatch, model)
    engine.route_tap = routing.RouteTap(g.n_layers, 16, g.n_expert_used, zeros=np.zeros)
    copies = []
    window_launches(monkeypatch, engine, 4)
    monkeypatch.setattr(window, "copy_async", lambda dst, src, nbytes, stream: copies.append((dst, src, nbytes)))
    from strata_cli.gpu import compile as nvrtc

    monkeypatch.setattr(nvrtc, "_function", lambda module, function, defines=(): lambda *a, **k: None)
    window.record_window(engine, 4, None)
    ids_buffers = {engine.buf[name].ctypes.data for name in ("route_ids", "route_ids1")}
    taps = [(dst, src, n) for dst, src, n in copies if dst.ctypes.data in
            {engine.route_tap.ids[layer].ctypes.data for layer in range(g.n_layers)}]
    assert len(taps) == g.n_layers
    for dst, src, nbytes in taps:
        assert src.ctypes.data in ids_buffers and src.shape[0] == 4 and dst.shape == src.shape
        assert nbytes == src.nbytes == 4 * src.shape[1] * 4


def test_a_partial_static_cache_without_a_profile_warns(capfd, model):
    """--expert-cache N (some, not all, pairs) without --expert-profile fills each layer's lowest expert ids: the
    engine says so on stderr, once per build, naming the fix. Nothing is said for a profile, an adaptive policy, a
    cache of none or all, or make-profile's counting run (its cache sets only its speed)."""
    from strata_cli.engine.gpu.buffers import plan_buffers
    from strata_cli.tiers import setup
    from strata_cli.tiers.config import TierConfig
    from strata_cli.tiers.expert_profile import ExpertProfile

    arena = plan_buffers(model.geometry, 64, 8).planned_bytes()
    g = model.geometry

    def said(cfg) -> str:
        capfd.readouterr()
        setup.residency_for(model, cfg, arena, 8)
        return capfd.readouterr().err

    err = said(TierConfig(cache="5", pcie_frac=0.0))
    assert err.count("strata: warning:") == 1
    assert "--expert-cache 5 without --expert-profile" in err and "make-profile" in err and "--expert-profile P" in err
    counts = np.zeros((g.n_layers, g.n_expert), np.int64)
    counts[:, 1] = 3
    profile = ExpertProfile.from_counts(counts, g, None, 16)
    quiet = [TierConfig(cache="5", pcie_frac=0.0, policy="lru"), TierConfig(cache="0", pcie_frac=0.0),
             TierConfig(cache="all", pcie_frac=0.0), TierConfig(cache="5", pcie_frac=0.0, counting=True),
             TierConfig(cache="5", pcie_frac=0.0, loaded_profile=profile)]
    for cfg in quiet:
        assert "warning" not in said(cfg), cfg
    assert routing.counting_tiers("5").counting
