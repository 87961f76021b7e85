"""Programmatic dependent launch on the device (issue 18; skipped without a GPU): a chain of kernels replayed on
programmatic edges gives the eager result, its dependent really launches early, an excluded kernel keeps ordinary
edges, and the window and commit graphs on programmatic edges equal eager launches and ordinary edges."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_engines import gpu_engine, tiered_engine

from strata_cli.model.gguf_file import open_model

pytestmark = pytest.mark.gpu

# y1 = 2x + 1 (block 0 first spins `spin_ns`: a dependent launched early finds y1 unwritten); y2 reads y1 reversed
# (another block's rows); y3 reads y1 again, two kernels back. started[b] / ended: globaltimer at k2's block b start
# (before its wait: test code only) and at the end of k1's spin.
SOURCE = r"""
#include "common.cuh"
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void pdl_k1(const float* x, float* y1, int n, long long spin_ns, unsigned long long* ended) {
    pdl_begin();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned long long t0 = now_ns();
        while (now_ns() - t0 < (unsigned long long)spin_ns) {}
        *ended = now_ns();
    }
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y1[i] = 2.0f * x[i] + 1.0f;
}
extern "C" __global__ void pdl_k2(const float* y1, float* y2, int n, unsigned long long* started) {
    if (threadIdx.x == 0) started[blockIdx.x] = now_ns();
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y2[i] = 3.0f * y1[n - 1 - i];
}
extern "C" __global__ void pdl_k3(const float* y1, const float* y2, float* y3, int n) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y3[i] = y2[i] - y1[i];
}
"""
N, BLOCK = 5003, 128  # odd: the last block is partial
GRID = (N + BLOCK - 1) // BLOCK
SPIN_NS = 50_000


def _chain(stamp_between: bool = False):
    """(record(stream), buffers): k1 -> [stamp_globaltimer ->] k2 -> k3 over N floats."""
    import cupy as cp

    from strata_cli.gpu.compile import kernels_dir
    from strata_cli.gpu.launch_stamp import stamp
    from strata_cli.gpu.runtime import device_arch

    mod = cp.RawModule(code=SOURCE, options=(f"-arch={device_arch()}", "--std=c++17", f"-I{kernels_dir()}"))
    k1, k2, k3 = (mod.get_function(f"pdl_k{i}") for i in (1, 2, 3))
    b = {"x": cp.zeros(N, cp.float32), "y1": cp.zeros(N, cp.float32), "y2": cp.zeros(N, cp.float32),
         "y3": cp.zeros(N, cp.float32), "ended": cp.zeros(1, cp.uint64), "started": cp.zeros(GRID, cp.uint64),
         "slots": cp.zeros(1, cp.uint64)}
    n = np.int32(N)

    def record(stream):
        k1((GRID,), (BLOCK,), (b["x"], b["y1"], n, np.int64(SPIN_NS), b["ended"]), stream=stream)
        if stamp_between:
            stamp(b["slots"], 0, stream=stream)
        k2((GRID,), (BLOCK,), (b["y1"], b["y2"], n, b["started"]), stream=stream)
        k3((GRID,), (BLOCK,), (b["y1"], b["y2"], b["y3"], n), stream=stream)

    return record, b


def _ours(name: str) -> bool:
    return name.startswith("pdl_k")


def _reference(x: np.ndarray) -> np.ndarray:
    y1 = 2.0 * x + 1.0
    return (3.0 * y1[::-1] - y1).astype(np.float32)


def _edge_kinds(graph) -> list[tuple[str, str, bool]]:
    """(from name, to name, programmatic) of every edge (None names: not a kernel)."""
    from strata_cli.gpu.graphs import node_names
    from strata_cli.gpu.pdl import graph_edges
    from strata_cli.gpu.runtime import cudart

    programmatic = int(cudart().cudaGraphDependencyType.cudaGraphDependencyTypeProgrammatic)
    names = node_names(graph)
    return [(names[int(a)], names[int(b)], int(d.type) == programmatic) for a, b, d in zip(*graph_edges(graph))]


def _needs_sm90():
    from strata_cli.gpu.pdl import supported

    if not supported():
        pytest.skip("programmatic edges need compute capability 9.0")


def test_chain_on_programmatic_edges_equals_eager_over_200_replays():
    import cupy as cp

    from strata_cli.gpu.graphs import CapturedGraph, new_stream

    _needs_sm90()
    record, b = _chain()
    stream = new_stream()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N).astype(np.float32)
    b["x"].set(x)
    record(stream)  # eager: loads the kernels before capture
    stream.synchronize()
    eager = cp.asnumpy(b["y3"])
    np.testing.assert_array_equal(eager, _reference(x))
    graph = CapturedGraph(record, stream, programmatic=_ours)
    summary = graph.summary()
    assert (summary.nodes, summary.edges, summary.programmatic) == (3, 2, 2)
    for i in range(200):
        x = rng.standard_normal(N).astype(np.float32)
        with stream:
            b["x"].set(x, stream=stream)
            for name in ("y1", "y2", "y3"):
                b[name].fill(np.nan)  # NaN-poisoned: a read before k1's write shows
        graph.launch()
        stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(b["y3"]), _reference(x), err_msg=f"replay {i}")
    graph.destroy()


@pytest.mark.parametrize("programmatic", [True, False])
def test_dependent_launches_before_its_predecessor_ends_only_when_programmatic(programmatic):
    """k2's blocks start (before their pdl_wait) while k1's block 0 still spins on a programmatic edge, and only
    after it on an ordinary one: the early launch is real, not just allowed."""
    import cupy as cp

    from strata_cli.gpu.graphs import CapturedGraph, new_stream

    _needs_sm90()
    record, b = _chain()
    stream = new_stream()
    record(stream)
    stream.synchronize()
    graph = CapturedGraph(record, stream, programmatic=_ours if programmatic else False)
    early = []
    for _ in range(5):
        graph.launch()
        stream.synchronize()
        early.append(int(cp.asnumpy(b["started"]).min()) < int(cp.asnumpy(b["ended"])[0]))
    graph.destroy()
    assert all(early) if programmatic else not any(early), early


def test_excluded_kernel_in_the_middle_keeps_ordinary_edges():
    import cupy as cp

    from strata_cli.gpu.graphs import CapturedGraph, new_stream
    from strata_cli.gpu.pdl import project_kernel

    _needs_sm90()
    record, b = _chain(stamp_between=True)
    stream = new_stream()
    x = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    b["x"].set(x)
    record(stream)
    stream.synchronize()
    graph = CapturedGraph(record, stream, programmatic=lambda name: _ours(name) or project_kernel(name))
    assert sorted(_edge_kinds(graph.graph)) == [("pdl_k1", "stamp_globaltimer", False), ("pdl_k2", "pdl_k3", True),
                                         ("stamp_globaltimer", "pdl_k2", False)]
    for _ in range(20):
        b["y3"].fill(np.nan)
        cp.cuda.Device().synchronize()
        graph.launch()
        stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(b["y3"]), _reference(x))
        # the stamp came after k1's end (its edge in is a full one)
        assert int(cp.asnumpy(b["slots"])[0]) >= int(cp.asnumpy(b["ended"])[0])
    graph.destroy()


def _plain_graphs(eng, windows):
    """Every graph `eng` replays for `windows`, captured again on ordinary edges (the old ones destroyed)."""
    from strata_cli.engine.gpu.window import record_commit, record_window
    from strata_cli.gpu.graphs import CapturedGraph

    for T in windows:
        eng.graph(T).destroy()
        eng.graphs[T] = CapturedGraph(lambda s, T=T: record_window(eng, T, s), eng.stream, programmatic=False)
    eng.commit_graph().destroy()
    eng._commit_graph = CapturedGraph(lambda s: record_commit(eng, s), eng.stream, programmatic=False)


def _windows(eng, tokens, windows, eager: bool) -> np.ndarray:
    """Logits of a run of windows of the sizes `windows` from a reset engine, each committed but its last row
    (NaN-poisoned logits buffer before each)."""
    eng.reset()
    rows, pos = [], 0
    for T in windows:
        with eng.stream:
            eng.buf["logits"].fill(np.nan)
        rows.append(eng.run(tokens[pos:pos + T], pos, eager=eager).logits)
        eng.commit(T - 1 if T > 1 else 1, eager=eager)
        pos += T - 1 if T > 1 else 1
    return np.concatenate(rows)


WINDOWS = [8, 1, 3, 8, 3, 1]


@pytest.mark.parametrize("tiers", [None, dict(cache="5", pcie_frac=0.5),
                                   dict(cache="5", pcie_frac=0.5, wait="stream")],
                         ids=["resident", "tiered", "tiered-stream-wait"])
def test_window_graphs_programmatic_equal_eager_and_ordinary(fixture_dir, tiers):
    """Eager, programmatic and ordinary window graphs write the same logits; programmatic edges exactly between
    kernels of kernels/. --tier-wait stream's doorbells are captured cuStreamWaitValue32 (batch mem op) nodes: the
    graph is walked through them (graphs._nodes_and_kinds: the runtime's node type call fails on them) and their
    edges stay ordinary. A fixed PCIe share: auto's tuner moves experts between the pool and the copies from window
    to window, and their sums differ in the last bits."""
    model = open_model(fixture_dir / "model-q8_0.gguf")
    tokens = np.load(fixture_dir / "reference.npz")["tokens"]
    eng = tiered_engine(model, **tiers) if tiers else gpu_engine(model)
    with eng:
        eager = _windows(eng, tokens, WINDOWS, eager=True)
        assert np.isfinite(eager).all()
        programmatic = _windows(eng, tokens, WINDOWS, eager=False)
        from strata_cli.gpu.pdl import EXCLUDED, project_kernel, supported

        for T in sorted(set(WINDOWS)):
            edges = _edge_kinds(eng.graph(T).graph)
            assert eng.graph(T).summary().programmatic == sum(prog for _, _, prog in edges)
            for a, b, prog in edges:  # programmatic exactly between kernels of kernels/, the excluded three apart
                pdl = all(n is not None and n not in EXCLUDED and project_kernel(n) for n in (a, b))
                assert prog == (pdl and supported()), (T, a, b, prog)
            assert any(prog for _, _, prog in edges) == supported()
        if tiers and tiers.get("wait") == "stream":
            assert all(dict(eng.graph(T).summary().kinds).get("batch mem op", 0) > 0 for T in set(WINDOWS))
        _plain_graphs(eng, sorted(set(WINDOWS)))
        assert all(eng.graph(T).summary().programmatic == 0 for T in set(WINDOWS))
        ordinary = _windows(eng, tokens, WINDOWS, eager=False)
    np.testing.assert_array_equal(programmatic, eager)
    np.testing.assert_array_equal(ordinary, eager)


def test_graph_nodes_counts_the_programmatic_edges(fixture_dir):
    import json

    from click.testing import CliRunner

    from strata_cli.cli import main

    _needs_sm90()
    path = str(fixture_dir / "model-q8_0.gguf")
    res = CliRunner().invoke(main, ["graph-nodes", path, "--window", "1", "--format", "json"])
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)["meta"]
    assert 0 < meta["programmatic"] < meta["edges"]  # the staging copies' edges stay ordinary
    res = CliRunner().invoke(main, ["graph-nodes", path, "--window", "1"])
    assert res.exit_code == 0, res.output
    assert f"{meta['edges']} edges ({meta['programmatic']} programmatic)" in res.output
