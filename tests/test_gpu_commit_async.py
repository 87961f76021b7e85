"""The asynchronous commit on the device (engine/gpu/engine.py): speculative windows with commits (random window
sizes, random accepted prefixes, zero kept included) with the commit left in flight while the host reads the
window's logits and stages the next one, against the same engine with every commit waited for at once (the
synchronous commit), bit for bit: logits, greedy ids and the committed state. Graph replay and eager launches; expert
tiers off and on (a 3-slot VRAM cache with a PCIe share of 0.5); the layer split (every stage's commit in flight).
The order of the host's writes, waits and reads: tests/test_commit_async_cpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_engines import tiered_engine
from spec_windows import assert_same_state, committed_state, speculative_run

from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu

N_TOKENS = 40


class Commits:
    """An engine whose run/commit take `eager`, and whose commit is waited for at once when sync (the commit as it
    was before it was asynchronous: launch, then wait for the stream)."""

    def __init__(self, engine, eager: bool, sync: bool):
        self.engine, self.eager, self.sync = engine, eager, sync

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run(self, tokens, pos0=None):
        return self.engine.run(tokens, pos0, eager=self.eager)

    def commit(self, n_keep: int) -> None:
        self.engine.commit(n_keep, eager=self.eager)
        if self.sync:
            self.engine.wait_commit()


def _pending(engine) -> bool:
    stages = getattr(engine, "stages", None) or [engine]
    return all(s._commit_pending for s in stages)


def _async_equals_sync(engine, tokens, what: str) -> None:
    for eager in (False, True):
        runs = {}
        for sync in (True, False):
            e = Commits(engine, eager, sync)
            logits, ids = speculative_run(e, tokens, np.random.default_rng(7), 8, allow_zero=True)
            if not sync:  # the loop's last commit was left in flight: the asynchronous path really ran
                assert _pending(engine), f"{what}: the commit was waited for"
            runs[sync] = logits, ids, committed_state(e)
        (a, a_ids, a_state), (b, b_ids, b_state) = runs[False], runs[True]
        how = f"{what} {'eager' if eager else 'graph'}"
        assert np.isfinite(a).all(), how
        np.testing.assert_array_equal(a, b, err_msg=how)
        np.testing.assert_array_equal(a_ids, b_ids, err_msg=how)
        assert_same_state(a_state, b_state, what=how)


def _tokens(model):
    tokens = np.random.default_rng(3).integers(0, model.geometry.n_vocab, N_TOKENS)
    if model.geometry.eos_token_id is not None:
        tokens[N_TOKENS // 2] = model.geometry.eos_token_id  # the PLE n-gram reset inside a committed window
    return tokens


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_async_commit_equals_sync_commit(fixture_dir, kind):
    model = open_model(fixture_dir / f"model-{kind}.gguf")
    with tiered_engine(model) as engine:
        _async_equals_sync(engine, _tokens(model), kind)


def test_async_commit_equals_sync_commit_tiered(fixture_dir):
    model = open_model(fixture_dir / "model-q8_0.gguf")
    with tiered_engine(model, cache="3", pcie_frac=0.5) as engine:
        assert engine.tiers is not None and not engine.tiers.all_resident
        _async_equals_sync(engine, _tokens(model), "tiers cache 3 pcie 0.5")
        served = engine.tier_host.history
        assert sum(w["pcie"] for w in served) > 0 and sum(w["cpu"] for w in served) > 0


def test_async_commit_equals_sync_commit_layer_split(fixture_dir):
    from strata_cli.engine.gpu.layer_split import GPUSplitEngine
    from strata_cli.engine.layer_plan import SplitConfig, plan_split
    from strata_cli.gpu.runtime import cupy

    model = open_model(fixture_dir / "model-q8_0.gguf")
    n = int(cupy().cuda.runtime.getDeviceCount())
    devices = (0, 1, 2) if n >= 3 else (0, 0, 0)
    with GPUSplitEngine(model, plan_split(SplitConfig(3, (2, 3, 3), devices), model, n)) as split:
        _async_equals_sync(split, _tokens(model), f"split (2, 3, 3) on {devices}")
