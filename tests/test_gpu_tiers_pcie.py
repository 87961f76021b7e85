"""The PCIe share at Flash-Next width: expert matrices of 1.7 MB (2560 x 640 Q8_0), far above the 64 KB that a
driver copies inline, copied from the memory-mapped file while the window's graph waits on flagB. Logits and greedy
ids must equal the all-resident engine's; a second engine over the same mapped model shares the registration."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_engines import rel_err, synthetic_model, tiered_engine
from spec_windows import speculative_run

pytestmark = pytest.mark.gpu


def test_pcie_share_of_flash_next_sized_experts_equals_all_resident(tmp_path):
    model = synthetic_model(tmp_path, "flash-next", 4, "Q8_0", layers=4, experts=16, vocab=4096, ngram_vocab=100)
    assert model.info("blk.0.ffn_down_exps.weight").n_bytes // 16 > 1 << 20  # over 1 MB per expert
    tokens = np.random.default_rng(3).integers(0, model.geometry.n_vocab, 24)
    base, base_ids = speculative_run(tiered_engine(model), tokens, np.random.default_rng(6), 8)
    engines = []
    for cfg in (dict(cache="0", pcie_frac=0.5), dict(cache="20", pcie_frac=1.0),
                dict(cache="0", pcie_frac=0.5, split=True)):
        eng = tiered_engine(model, **cfg)
        engines.append(eng)  # kept alive: the next engine registers the same spans again (counted, not refused)
        got, ids = speculative_run(eng, tokens, np.random.default_rng(6), 8)
        err = rel_err(got, base)
        assert err <= 1e-4, f"{cfg}: max relative error {err:.2e}"
        np.testing.assert_array_equal(ids, base_ids, err_msg=str(cfg))
        assert eng.tier_host.history[-1]["pcie"] > 0, cfg
    for eng in engines:
        eng.tiers.free()


def test_a_refused_page_lock_keeps_staged_copies_and_says_so(fixture_dir, monkeypatch):
    """A host that refuses cudaHostRegister (no read-only registration, a locked-memory limit): the engine runs with
    driver-staged copies (the fixture's experts are small) and its tier line says why."""
    from strata_cli.gpu import runtime
    from strata_cli.model.gguf_file import open_model

    def refuse(ranges):
        raise RuntimeError("cudaHostRegister of 4096 bytes of the model file failed: cudaErrorNotSupported")

    monkeypatch.setattr(runtime, "PinnedHostSpans", refuse)
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"][:16]
    base, base_ids = speculative_run(tiered_engine(model), tokens, np.random.default_rng(1), 4)
    eng = tiered_engine(model, cache="0", pcie_frac=1.0)
    assert eng.tiers.pinned is None and "could not be page-locked" in eng.tier_note
    got, ids = speculative_run(eng, tokens, np.random.default_rng(1), 4)
    assert rel_err(got, base) <= 1e-4
    np.testing.assert_array_equal(ids, base_ids)
