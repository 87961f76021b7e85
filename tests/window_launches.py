"""The graph nodes of a window without a GPU: the real window recorder (engine/gpu/window.py) and the real launchers
(strata_cli/gpu/launch_*.py) run over host arrays, and every kernel launch (compile.kernel(module, name)(...): the
lookup behind it replaced, so compile.observing's observers see the launches as on the device) and device copy
(window.copy_async) is listed instead of issued. Each is one node of the captured graph, so the listing
is what `strata graph-nodes` counts: per layer (GPUEngine.layer_nodes' "embed" / "gap" boundaries) and per kernel
function name (graph-nodes' kinds). The launchers' argument checks run as on the device (host arrays pass them),
so a window that would be refused there is refused here too.

Buffers are the engine's arena plan (engine/gpu/buffers.plan_buffers) carved from one host allocation at its
offsets, weights the engine's DeviceWeights (Q8_0 repacked by the numpy reference of the device packer)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from strata_cli.model import packed


@dataclass
class WindowLaunches:
    """The nodes of one T-row window: `layers[l]` the labels of layer l's nodes in launch order, `inputs` those
    before layer 0 (copies, embedding), `head` those after the last layer (output read, head, argmax)."""

    inputs: list[str]
    layers: list[list[str]]
    head: list[str]

    def per_layer(self) -> list[int]:
        return [len(nodes) for nodes in self.layers]

    def kinds(self) -> Counter:
        """Node label -> count over the whole window (graph-nodes' kinds: kernel names and "memcpy")."""
        return Counter(self.inputs + [n for nodes in self.layers for n in nodes] + self.head)

    @property
    def total(self) -> int:
        return sum(self.kinds().values())


def _host_cupy():
    """The part of CuPy DeviceWeights uses, on the host."""
    device = SimpleNamespace(synchronize=lambda: None)
    return SimpleNamespace(asarray=np.array, empty=np.empty, empty_like=np.empty_like,
                           cuda=SimpleNamespace(Device=lambda: device))


def _host_arena(arena) -> dict:
    """Views of one zeroed host allocation at the offsets Arena.allocate gives them on the device."""
    from strata_cli.engine.gpu import buffers

    total = sum(buffers._aligned_bytes(shape, dtype) for _, shape, dtype in arena.specs)
    base = np.zeros(max(total, buffers.ALIGN) + buffers.ALIGN, dtype=np.uint8)
    off = -base.ctypes.data % buffers.ALIGN  # the device arena starts aligned
    views = {}
    for name, shape, dtype in arena.specs:
        views[name] = np.ndarray(shape, dtype, buffer=base, offset=off)
        off += buffers._aligned_bytes(shape, dtype)
    return views


def host_engine(monkeypatch, model, max_t: int = 16, n_ctx: int = 256, window_paths=None):
    """A stand-in GPUEngine for record_window: the engine's buffers and weights on the host, no tiers, every
    layer. window_paths: T -> WindowPath (default launch_util.window_path, the engine's)."""
    from strata_cli.engine.gpu import weights
    from strata_cli.engine.gpu.buffers import plan_buffers
    from strata_cli.gpu import launch_pack
    from strata_cli.gpu.launch_util import window_path

    g = model.geometry
    monkeypatch.setattr(weights, "cupy", _host_cupy)
    monkeypatch.setattr(launch_pack, "pack_q8_0", lambda raw, n_in, out=None: packed.pack_q8_0(raw, n_in))
    w = weights.DeviceWeights(model)
    buf = _host_arena(plan_buffers(g, n_ctx, max_t))
    stage = SimpleNamespace(**{name: SimpleNamespace(device=np.zeros(max_t, dtype)) for name, dtype in (
        ("tokens", np.int64), ("positions", np.int32), ("out_ids", np.int32), ("out_nonfinite", np.int32))})
    return SimpleNamespace(buf=buf, w=w, g=g, stage=stage, stamper=None, route_tap=None, tiers=None,
                           window_paths=window_paths or window_path, layers=(0, g.n_layers))


def window_launches(monkeypatch, engine, T: int) -> WindowLaunches:
    """The nodes record_window(engine, T) launches, split at the layer boundaries GPUEngine.layer_nodes uses."""
    from strata_cli.engine.gpu import window

    nodes: list[str] = []
    ends: list[int] = []

    def kernel(module: str, function: str):
        def launch(grid, block, args, **kwargs):
            assert all(int(n) >= 1 for n in (*grid, *block)), (function, grid, block)
            nodes.append(function)

        return launch

    def count(layer: int, stage: str, stream) -> None:
        if stage in ("embed", "gap"):
            ends.append(len(nodes))

    _list_launches(monkeypatch, kernel, lambda dst, src, nbytes, stream: nodes.append("memcpy"))
    engine.stamper = count
    try:
        window.record_window(engine, T, None)
    finally:
        engine.stamper = None
    assert len(ends) == engine.g.n_layers + 1, ends
    layers = [nodes[a:b] for a, b in zip(ends, ends[1:])]
    return WindowLaunches(nodes[:ends[0]], layers, nodes[ends[-1]:])


def _list_launches(monkeypatch, kernel, copy) -> None:
    """Launches go to kernel(module, function)(grid, block, args, ...) and device copies to copy: compile.kernel's
    lookup is replaced, not compile.kernel itself, so its observers (compile.observing) see every launch."""
    from strata_cli.engine.gpu import window
    from strata_cli.gpu import compile as nvrtc

    monkeypatch.setattr(nvrtc, "_function", lambda module, function, defines=(): kernel(module, function))
    monkeypatch.setattr(window, "copy_async", copy)


def window_reads(monkeypatch, engine, T: int):
    """The profiling window of T rows recorded as the engine records it (engine/gpu/stamps.record_profiled: the real
    Stamper, the byte ledger told of every launch): (its stage_timing.Plan, the ledger's StageReads per stamp)."""
    from strata_cli.engine.gpu import stamps, window

    def kernel(module: str, function: str):
        return lambda grid, block, args, **kwargs: None

    _list_launches(monkeypatch, kernel, lambda dst, src, nbytes, stream: None)
    return stamps.record_profiled(engine, T, None, window.record_window)
