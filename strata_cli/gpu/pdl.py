"""Programmatic dependent launch (PDL) in a captured graph (issue 18; sm_90+).

A window is ~580 small, latency-bound kernels; on an ordinary edge the GPU drains one grid before it starts the
next one cold. On a programmatic edge the next kernel launches as soon as every block of the one before has issued
griddepcontrol.launch_dependents, runs its prologue (an L2 prefetch of its own weights) and blocks in
griddepcontrol.wait until the grid before has completed and its memory is visible (kernels/common.cuh pdl_begin,
which every kernel of kernels/ starts with). After capture, before instantiate, make_programmatic turns each
kernel -> kernel edge whose both ends wait so into a programmatic one (removed and added again with edge data).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .runtime import check, cudart

# Never a programmatic dependent or predecessor (and no griddepcontrol in their source): the tier doorbell pair spins
# on host memory the host writes in answer to the graph's progress (tiers.cu), and stamp_globaltimer stamps the end
# of the kernel before it (stamp.cu): launched early, it would stamp that kernel's middle.
EXCLUDED = frozenset({"tier_publish", "tier_wait", "stamp_globaltimer"})


def programmatic_edges(names: Mapping[int, str | None], edges: Iterable[tuple[int, int]],
                       ready: Callable[[str], bool]) -> list[tuple[int, int]]:
    """The edges (from, to) of `edges` to make programmatic: both ends kernel nodes (names[node] is the kernel's
    function name; None: a memcpy, memset, host or other node) whose kernels start with pdl_begin (ready(name)),
    neither excluded. The order of `edges` is kept."""
    def pdl(node: int) -> bool:
        name = names.get(node)
        return name is not None and name not in EXCLUDED and ready(name)

    return [(a, b) for a, b in edges if pdl(a) and pdl(b)]


def project_kernel(name: str) -> bool:
    """Whether `name` is a kernel this process loaded from kernels/ (compile.kernel): CuPy's own kernels (fills,
    copies) and a test's or bench's RawModule never call griddepcontrol.wait, so their edges stay ordinary."""
    from .compile import loaded_functions

    return name in loaded_functions()


def supported() -> bool:
    """Programmatic edges need compute capability 9.0 (Hopper) or newer; below, griddepcontrol compiles to nothing."""
    from .runtime import device_arch

    return int(device_arch().removeprefix("sm_")) >= 90


def graph_edges(graph):
    """(from, to, edge data) lists of every edge of `graph`."""
    rt = cudart()
    n = int(check(rt.cudaGraphGetEdges(graph, 0), "cudaGraphGetEdges")[-1])
    if not n:
        return [], [], []
    src, dst, data, _ = check(rt.cudaGraphGetEdges(graph, n), "cudaGraphGetEdges")
    return list(src[:n]), list(dst[:n]), list(data[:n])


def count_programmatic(graph) -> int:
    """The programmatic edges of `graph`."""
    programmatic = int(cudart().cudaGraphDependencyType.cudaGraphDependencyTypeProgrammatic)
    return sum(int(d.type) == programmatic for d in graph_edges(graph)[2])


def make_programmatic(graph, names: Mapping[int, str | None], ready: Callable[[str], bool] = project_kernel) -> int:
    """Turn `graph`'s kernel -> kernel edges (programmatic_edges's; names: graphs.node_names) programmatic, before
    instantiate; returns how many. A no-op (0) below compute capability 9.0."""
    if not supported():
        return 0
    rt = cudart()
    src, dst, data = graph_edges(graph)
    default = int(rt.cudaGraphDependencyType.cudaGraphDependencyTypeDefault)
    by_id = {int(node): node for node in (*src, *dst)}
    plain = [(int(a), int(b)) for a, b, d in zip(src, dst, data) if int(d.type) == default]
    chosen = programmatic_edges(names, plain, ready)
    if not chosen:
        return 0
    froms, tos = [by_id[a] for a, _ in chosen], [by_id[b] for _, b in chosen]
    check(rt.cudaGraphRemoveDependencies(graph, froms, tos, None, len(chosen)), "cudaGraphRemoveDependencies")
    edge = rt.cudaGraphEdgeData()
    edge.type = rt.cudaGraphDependencyType.cudaGraphDependencyTypeProgrammatic
    edge.from_port = rt.cudaGraphKernelNodePortProgrammatic  # triggered by launch_dependents (or the block's exit)
    check(rt.cudaGraphAddDependencies(graph, froms, tos, [edge] * len(chosen), len(chosen)),
          "cudaGraphAddDependencies")
    return len(chosen)
