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
               dict(cache="7", policy="lfu", pcie_frac=0.5, split=True), dict(cache="7", policy="lru", wait="stream")]
    for cfg, eng, total in _equal_all_resident(name, model, configs):
        history = eng.tier_host.history
        swaps = [h["swaps"] for h in history]
        assert sum(swaps) > 0, f"{name} {cfg}: the policy never swapped"
        if cfg.get("max_copy"):
            assert max(swaps) <= 1
        assert total["vram"] > 0
        assert (eng.tiers.table_host >= 0).sum() + len(eng.tiers.fill.policy.pending) == 7  # the slots stay
        assert len(eng.graphs) >= 1  # replayed graphs, captured once per T
        eng.tiers.free()

