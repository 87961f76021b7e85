"""CUDA graphs through cuda-bindings: capture a recorded stream of launches, replay it, list what it holds.

Capture uses cudaStreamBeginCapture in thread-local mode on a non-default stream, so anything that would
allocate or synchronise during capture fails loudly instead of being baked into the graph. Kernel nodes
captured from CuPy launches carry a driver CUfunction: the runtime's cudaGraphKernelNodeGetParams fails on
them, so names come from cuGraphKernelNodeGetParams + cuFuncGetName (driver API).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .runtime import capture_guard, check, cudart, cudrv, cupy, free_later_if_capturing

NODE_KINDS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child graph", 5: "empty",
              6: "event wait", 7: "event record", 8: "semaphore signal", 9: "semaphore wait", 10: "mem alloc",
              11: "mem free", 12: "batch mem op", 13: "conditional"}


@dataclass
class GraphSummary:
    nodes: int
    edges: int
    kinds: list[tuple[str, int]] = field(default_factory=list)   # (label, count), most frequent first


class CapturedGraph:
    """One captured, instantiated and uploaded graph (a window or the commit graph)."""

    def __init__(self, record, stream):
        """record(stream) issues the launches on `stream` (a cupy Stream); no allocation may happen inside."""
        rt = cudart()
        self.stream = stream
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self.exec = None
        with capture_guard():  # no finalizer may free device resources inside the capture (runtime.py)
            check(rt.cudaStreamBeginCapture(stream.ptr, mode), "cudaStreamBeginCapture")
            try:
                with stream:
                    record(stream)
            except BaseException:
                rt.cudaStreamEndCapture(stream.ptr)  # ends the failed capture so the stream is usable again
                raise
            self.graph = check(rt.cudaStreamEndCapture(stream.ptr), "cudaStreamEndCapture")
        self.exec = check(rt.cudaGraphInstantiate(self.graph, 0), "cudaGraphInstantiate")
        check(rt.cudaGraphUpload(self.exec, stream.ptr), "cudaGraphUpload")

    def launch(self, stream=None) -> None:
        check(cudart().cudaGraphLaunch(self.exec, (stream or self.stream).ptr), "cudaGraphLaunch")

    def summary(self) -> GraphSummary:
        return summarize(self.graph)

    def destroy(self) -> None:
        rt = cudart()
        if self.exec is not None:
            rt.cudaGraphExecDestroy(self.exec)
            rt.cudaGraphDestroy(self.graph)
            self.exec = self.graph = None

    def __del__(self):
        try:
            free_later_if_capturing(self.destroy)
        except Exception:
            pass


def kernel_name(node) -> str:
    drv = cudrv()
    params = check(drv.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
    func = params.func if int(params.func) else params.kern
    getter = drv.cuFuncGetName if int(params.func) else drv.cuKernelGetName
    name = check(getter(func), "cuFuncGetName")
    return name.decode() if isinstance(name, bytes) else str(name)


def _count_edges(graph) -> int:
    ret = cudart().cudaGraphGetEdges(graph, 0)
    check(ret, "cudaGraphGetEdges")
    return int(ret[-1])


def summarize(graph) -> GraphSummary:
    rt = cudart()
    _, n = check(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")
    nodes, _ = check(rt.cudaGraphGetNodes(graph, n), "cudaGraphGetNodes") if n else ([], 0)
    labels = Counter()
    for node in nodes:
        kind = int(check(rt.cudaGraphNodeGetType(node), "cudaGraphNodeGetType"))
        labels[kernel_name(node) if kind == 0 else NODE_KINDS.get(kind, f"type {kind}")] += 1
    kinds = sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))
    return GraphSummary(nodes=int(n), edges=_count_edges(graph), kinds=kinds)


def captured_nodes(stream) -> int:
    """The nodes captured so far into the graph that `stream` is being captured into."""
    rt = cudart()
    info = check(rt.cudaStreamGetCaptureInfo(stream.ptr), "cudaStreamGetCaptureInfo")
    graphs = [v for v in info if isinstance(v, rt.cudaGraph_t)]  # the outputs differ across CUDA versions
    graph = graphs[0] if graphs else info[2]  # (status, id, graph, ...)
    return int(check(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")[1])


def new_stream():
    """A non-blocking stream: capture is refused on the legacy default stream."""
    return cupy().cuda.Stream(non_blocking=True)
