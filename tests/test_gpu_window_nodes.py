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


def test_graph_nodes_shows_the_listing_per_layer(monkeypatch, fixture_dir):
    """`strata graph-nodes --format json`: meta.layer_nodes and the node total are the CPU listing's."""
    import json

    from click.testing import CliRunner

    from strata_cli.cli import main

    path = fixture_dir / "model-q8_0.gguf"
    with monkeypatch.context() as mp:
        listed = window_launches(mp, host_engine(mp, open_model(path)), 4)
    res = CliRunner().invoke(main, ["graph-nodes", str(path), "--window", "4", "--format", "json"])
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)["meta"]
    assert meta["layer_nodes"] == listed.per_layer() and meta["nodes"] == listed.total
