"""--expert-policy lru / lfu on the GPU: logits and greedy ids of speculative windows with commits equal the
all-resident engine's while the slot table changes between windows (copies on the side stream, no recapture)."""

from __future__ import annotations

import pytest
from test_gpu_tiers import _equal_all_resident, _model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["fixture-q8_0", "tiny-f16-5layers", "fixture-bf16"])
def test_adaptive_policies_equal_all_resident(fixture_dir, tmp_path, name):
    from strata_cli.tiers.residency import expert_bytes

    model = _model(name, fixture_dir, tmp_path)
    one = int(expert_bytes(model).max())  # --expert-max-copy of one expert: at most one swap per window
    configs = [dict(cache="7", policy="lru"), dict(cache="7", policy="lfu"), dict(cache="7", policy="lru", max_copy=one),
               dict(cache="7", policy="lfu", pcie_frac=0.5), dict(cache="7", policy="lru", wait="stream")]
    for cfg, eng, total in _equal_all_resident(name, model, configs):
        history = eng.tier_host.history
        swaps = [h["swaps"] for h in history]
        assert sum(swaps) > 0, f"{name} {cfg}: the policy never swapped"
        if cfg.get("max_copy"):
            assert max(swaps) <= 1
        assert total["vram"] > 0
        assert (eng.tiers.table_host >= 0).sum() + len(eng.tiers.fill.policy.pending) == 7  # the slots stay
        assert len(eng.graphs) >= 1  # replayed graphs, captured once per T
        eng.close()



@pytest.mark.parametrize("cache", ["auto", "0"])
def test_gpu_trace_equals_numpy(fixture_dir, cache):
    """make-profile --device gpu --trace: the same picks as the numpy engine's trace, in the same windows and rows
    (each row's top-k as a set, and a near-tie in the router may flip a pick, as in the counts test), from the
    all-resident engine's route tap (auto) and from the host's rings (0)."""
    import numpy as np

    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.residency import expert_bytes
    from strata_cli.engine.routing import count_routing
    from strata_cli.tiers.trace import TraceRecorder

    model = open_model(fixture_dir / "model-q8_0.gguf")
    g = model.geometry
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:24]
    traces = {}
    for device in ("gpu", "cpu"):
        rec = TraceRecorder(g.n_layers, g.n_expert, expert_bytes(model))
        count_routing(model, tokens, 8, 64, device=device, trace=rec, cache=cache)
        traces[device] = rec.trace()
    a, b = traces["gpu"], traces["cpu"]
    for key in ("window", "row", "layer"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    K = g.n_expert_used
    same = (np.sort(a.expert.reshape(-1, K), axis=1) == np.sort(b.expert.reshape(-1, K), axis=1)).all(axis=1)
    assert same.mean() >= 0.95
