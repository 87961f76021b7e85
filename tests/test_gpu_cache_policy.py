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


@pytest.mark.parametrize("name,share", [("fixture-q8_0", 0.0), ("fixture-bf16", 0.0), ("fixture-q8_0", 0.5)])
def test_a_fill_batch_lands_the_files_rows_in_its_slots(fixture_dir, tmp_path, name, share):
    """DeviceSlots.copy_batch (engine/gpu/residency_fill.py): without a PCIe share the batch gathered into the
    pinned staging (one strata_gather call on the pool's team) and copied by one DMA per run of consecutive slots on
    the side stream; with one, DMA'd from the page-locked store (every expert under an adaptive policy) and no
    staging made; once done() every copied slot holds the file's bytes of its expert, every other slot what it held
    (the slots hold the file's raw blocks: the check is on bytes). No window runs after (the table was not updated)."""
    import cupy as cp
    import numpy as np

    from gpu_engines import tiered_engine
    from strata_cli.tiers.cache_policy import Copy
    from strata_cli.tiers.gather import expert_bytes_view
    from strata_cli.tiers.residency import expert_names

    model = _model(name, fixture_dir, tmp_path)
    E = model.geometry.n_expert
    eng = tiered_engine(model, None, cache="24", policy="lru", pcie_frac=share)  # 3 slots a layer: experts 0, 1, 2
    try:
        t = eng.tiers
        dev = t.fill.device
        assert dev.done() and dev.staging is None and (t.store is not None) == (share > 0)

        def slot_bytes():
            return {layer: [cp.asnumpy(arr).reshape(int(arr.shape[0]), -1).view(np.uint8) for arr, _ in arrays]
                    for layer, (arrays, _) in t.resident.items()}

        before = slot_bytes()
        # layer 2: slots 2, 0, 1 (one run of three, given out of order); layer 5: slot 1 (a run of one)
        copies = [Copy(2, 9, 2), Copy(2, 12, 0), Copy(5, 15, 1), Copy(2, 5, 1)]
        dev.copy_batch(copies)
        dev.stream.synchronize()
        assert dev.done()
        # the staging: the default --expert-max-copy (what the 24 slots hold), made by the first batch without a store
        assert dev.staging is None if share > 0 else dev.staging.nbytes == t.cfg.max_copy
        after = slot_bytes()
        want = {(c.layer, c.slot): c.expert for c in copies}
        for layer in t.resident:
            rows = [expert_bytes_view(model.info(n).raw, E) for n in expert_names(layer)]
            for p in range(3):
                for slot in range(after[layer][p].shape[0]):
                    expect = rows[p][want[layer, slot]] if (layer, slot) in want else before[layer][p][slot]
                    np.testing.assert_array_equal(after[layer][p][slot], expect, err_msg=f"{layer} {p} {slot}")
        dev.copy_batch([Copy(5, 3, 0)])  # the staging is reused once the last batch is done
        dev.stream.synchronize()
        np.testing.assert_array_equal(slot_bytes()[5][0][0], expert_bytes_view(model.info(expert_names(5)[0]).raw,
                                                                                E)[3])
    finally:
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
