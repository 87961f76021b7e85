"""The CPU listing of the window's nodes (tests/window_launches.py, asserted per layer by test_window_nodes.py)
against the captured graph on the device: GPUEngine.layer_nodes (graph-nodes' per-layer line) and the graph's
node kinds (kernel function names via the driver, memcpy) are the listing's."""

from __future__ import annotations

import pytest
from window_launches import host_engine, window_launches

from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("T", (1, 3, 8))
def test_listing_is_the_captured_graph(monkeypatch, fixture_dir, T):
    from strata_cli.engine.gpu import GPUEngine

    model = open_model(fixture_dir / "model-q8_0.gguf")
    with monkeypatch.context() as mp:  # the listing's stand-ins are gone before the engine is built
        listed = window_launches(mp, host_engine(mp, model), T)
    eng = GPUEngine(model)
    try:
        assert eng.layer_nodes(T) == listed.per_layer()
        summary = eng.graph(T).summary()
        assert summary.nodes == listed.total
        assert dict(summary.kinds) == dict(listed.kinds())
    finally:
        eng.close()
