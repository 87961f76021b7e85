"""Graph capture, replay and node listing on the device (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void scale_add(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void square(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * y[i];
}
"""


def test_capture_replay_equals_eager_and_nodes_are_named():
    import cupy as cp

    from strata_cli.gpu.graphs import CapturedGraph, new_stream

    mod = cp.RawModule(code=SOURCE)
    scale_add, square = mod.get_function("scale_add"), mod.get_function("square")
    n = 1000
    x = cp.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    y = cp.zeros(n, cp.float32)
    cp.cuda.Device().synchronize()      # x and y are written on CuPy's current stream, which `stream` (non-blocking)
    # does not wait on: an eager window started before the zeros land saw two of its three adds (2026-12-03, 2e31918)

    def record(stream):
        for _ in range(3):
            scale_add(((n + 127) // 128,), (128,), (y, x, np.float32(0.5), np.int32(n)), stream=stream)
        square(((n + 127) // 128,), (128,), (y, np.int32(n)), stream=stream)

    stream = new_stream()
    record(stream)                      # eager warm-up loads the kernels before capture
    stream.synchronize()
    eager = cp.asnumpy(y)
    y.fill(0)
    graph = CapturedGraph(record, stream)
    y.fill(0)                           # on CuPy's current stream, which `stream` does not wait on:
    cp.cuda.Device().synchronize()      # the zeros land before the replay reads y (else the two race)
    graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(y), eager)
    summary = graph.summary()
    assert summary.nodes == 4 and summary.edges == 3
    assert dict(summary.kinds) == {"scale_add": 3, "square": 1}
    graph.destroy()
