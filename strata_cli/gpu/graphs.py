"""CUDA graphs through cuda-bindings: capture a recorded stream of launches, replay it, list what it holds.

Capture uses cudaStreamBeginCapture in thread-local mode on a non-default stream, so anything that would
allocate or synchronise during capture fails loudly instead of being baked into the graph. Kernel nodes
captured from CuPy launches carry a driver CUfunction: the runtime's cudaGraphKernelNodeGetParams fails on
them, so names come from cuGraphKernelNodeGetParams + cuFuncGetName (driver API). Kernel -> kernel edges are made
programmatic between capture and instantiate (gpu/pdl.py) unless asked not to.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .pdl import count_programmatic, make_programmatic, project_kernel
from .runtime import capture_guard, check, cudart, cudrv, cupy, free_later_if_capturing

NODE_KINDS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child graph", 5: "empty",
              6: "event wait", 7: "event record", 8: "semaphore signal", 9: "semaphore wait", 10: "mem alloc",
              11: "mem free", 12: "batch mem op", 13: "conditional"}


@dataclass
class GraphSummary:
    nodes: int
    edges: int
    kinds: list[tuple[str, int]] = field(default_factory=list)   # (label, count), most frequent first
    programmatic: int = 0   # of the edges, those that are programmatic (gpu/pdl.py)


class CapturedGraph:
    """One captured, instantiated and uploaded graph (a window or the commit graph)."""

    def __init__(self, record, stream, programmatic: bool | Callable[[str], bool] = True):
        """record(stream) issues the launches on `stream` (a cupy Stream); no allocation may happen inside.
        programmatic: make the kernel -> kernel edges between kernels of kernels/ programmatic (pdl.make_programmatic;
        a callable: the kernel names that wait so, for a test's own kernels); False: every edge stays ordinary
        (the bench's A/B)."""
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
        if programmatic:
            try:
                make_programmatic(self.graph, node_names(self.graph),
                                  project_kernel if programmatic is True else programmatic)
            except BaseException:
                rt.cudaGraphDestroy(self.graph)
                raise
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


def _nodes_and_kinds(graph) -> list[tuple[object, int]]:
    """Each node of `graph` with its kind (NODE_KINDS: the driver's CUgraphNodeType numbers). The kind comes from
    the driver: the runtime's cudaGraphNodeGetType answers cudaErrorUnknown for a batch mem op node (a captured
    cuStreamWaitValue32: the tier doorbell of --tier-wait stream), which the runtime's node types do not name."""
    rt, drv = cudart(), cudrv()
    _, n = check(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")
    nodes, _ = check(rt.cudaGraphGetNodes(graph, n), "cudaGraphGetNodes") if n else ([], 0)
    return [(node, int(check(drv.cuGraphNodeGetType(drv.CUgraphNode(int(node))), "cuGraphNodeGetType")))
            for node in nodes[:n]]


def node_names(graph) -> dict[int, str | None]:
    """Each node of `graph` (by handle value): its kernel's function name, None for a node of another kind."""
    return {int(node): kernel_name(node) if kind == 0 else None for node, kind in _nodes_and_kinds(graph)}


def summarize(graph) -> GraphSummary:
    nodes = _nodes_and_kinds(graph)
    labels = Counter(kernel_name(node) if kind == 0 else NODE_KINDS.get(kind, f"type {kind}") for node, kind in nodes)
    kinds = sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))
    return GraphSummary(nodes=len(nodes), edges=_count_edges(graph), kinds=kinds,
                        programmatic=count_programmatic(graph))


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
