"""Programmatic dependent launch without a GPU (issue 18): every kernel of kernels/ but the excluded ones starts with
pdl_begin() (after weight prefetches only), the excluded ones hold no griddepcontrol, and the edge selection of
strata_cli/gpu/pdl.py."""

from __future__ import annotations

import re

import pytest

from strata_cli.gpu.compile import kernels_dir
from strata_cli.gpu.pdl import EXCLUDED, programmatic_edges

# The weight pointers a kernel may prefetch before pdl_wait: the dense GEMVs' W (gate/up Wg, Wu), the router's W
# and hc_up_mix's up_w; nothing a kernel writes has one of these names.
WEIGHT_ARGS = {"W", "Wg", "Wu", "up_w"}


def _strip_comments(code: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", code, flags=re.S))


def _body(code: str, start: int) -> str:
    """The text inside the braces opening at code[start] (a macro's line continuations removed)."""
    depth = 0
    for i in range(start, len(code)):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            return code[start + 1:i]
    raise AssertionError("unbalanced braces")


def kernels() -> dict[str, tuple[str, str]]:
    """name (a macro's, e.g. 'gemv_q8r_t##NT'; gemv.cu's the macro's own, e.g. 'GEMV_DENSE_KERNEL') -> (file, body)
    of every __global__ function of kernels/*.cu."""
    found = {}
    for path in sorted(kernels_dir().glob("*.cu")):
        code = _strip_comments(path.read_text()).replace("\\\n", "\n")
        for m in re.finditer(r"__global__", code):
            head_end = code.index("{", m.end())
            head = code[m.end():head_end]
            name = re.search(r"([A-Za-z_]\w*(?:##\w+)?)\s*\(", re.sub(r"__launch_bounds__\s*\([^)]*\)*", "", head))
            key = name.group(1)
            if key == "NAME":  # gemv.cu's families: named by their macro
                key = re.findall(r"#define (\w+)\(", code[:m.start()])[-1]
            assert key not in found, key
            found[key] = (path.name, _body(code, head_end))
    return found


KERNELS = kernels()


def test_every_kernel_file_is_seen():
    assert len(KERNELS) >= 40
    assert EXCLUDED <= KERNELS.keys()
    assert {"stamp.cu", "tiers.cu", "gemv.cu", "gemv_q8r.cu", "gemv_quant.cu", "moe.cu", "hyper.cu"} <= {
        f for f, _ in KERNELS.values()}


@pytest.mark.parametrize("name", sorted(set(KERNELS) - EXCLUDED))
def test_kernel_starts_with_pdl_begin(name):
    """Before pdl_begin() a kernel may only prefetch weights: everything else may read what the kernel before
    writes, which is visible only after griddepcontrol.wait."""
    body = KERNELS[name][1]
    head, sep, _ = body.partition("pdl_begin();")
    assert sep, f"{name} ({KERNELS[name][0]}) never calls pdl_begin()"
    statements = [s.strip() for s in head.split(";") if s.strip()]
    for statement in statements:
        m = re.fullmatch(r"pdl_prefetch_rows\(\s*(\w+)\s*,.*\)", statement, flags=re.S)
        assert m, f"{name}: '{statement[:60]}' comes before pdl_begin()"
        assert m.group(1) in WEIGHT_ARGS, f"{name} prefetches {m.group(1)}, not a weight"
    assert body.count("pdl_begin();") == 1


@pytest.mark.parametrize("name", sorted(EXCLUDED))
def test_excluded_kernels_hold_no_griddepcontrol(name):
    body = KERNELS[name][1]
    assert "pdl_" not in body and "griddepcontrol" not in body


def test_the_weight_streaming_kernels_prefetch():
    prefetching = {n for n, (_, body) in KERNELS.items() if "pdl_prefetch_rows" in body}
    assert prefetching == {"GEMV_DENSE_KERNEL", "gemv_q8r_t##NT", "gemv_q8r_tc_t##NT", "gemv_q8r_gateup_dense_t##NT",
                           "qgemv_t##NT", "router_gemv_topk", "hc_up_mix"}


def test_griddepcontrol_only_from_sm90():
    code = _strip_comments((kernels_dir() / "common.cuh").read_text())
    for fn, asm in (("pdl_wait", "griddepcontrol.wait;"),
                    ("pdl_launch_dependents", "griddepcontrol.launch_dependents;")):
        body = _body(code, code.index("{", code.index(f"void {fn}()")))
        assert re.search(r"#if __CUDA_ARCH__ >= 900\s+asm volatile\(\"" + re.escape(asm), body), fn
    begin = _body(code, code.index("{", code.index("void pdl_begin()")))
    assert begin.split() == ["pdl_launch_dependents();", "pdl_wait();"]


# ---- edge selection: nodes 1..n by id; names None for memcpy / memset / host nodes
OURS = {"gemv_q8_0_t1", "hc_write_norm", "router_gemv_topk", "moe_combine", "tier_wait", "tier_publish",
        "stamp_globaltimer"}


def ready(name: str) -> bool:
    return name in OURS


def test_a_chain_of_kernels_is_all_programmatic():
    names = {1: "gemv_q8_0_t1", 2: "hc_write_norm", 3: "router_gemv_topk"}
    assert programmatic_edges(names, [(1, 2), (2, 3)], ready) == [(1, 2), (2, 3)]


def test_excluded_kernel_keeps_both_its_edges_ordinary():
    for excluded in ("stamp_globaltimer", "tier_wait", "tier_publish"):
        names = {1: "gemv_q8_0_t1", 2: excluded, 3: "hc_write_norm", 4: "moe_combine"}
        assert programmatic_edges(names, [(1, 2), (2, 3), (3, 4)], ready) == [(3, 4)]


def test_non_kernel_nodes_and_foreign_kernels_keep_ordinary_edges():
    # 2: a memcpy; 4: CuPy's own fill (no griddepcontrol.wait in it)
    names = {1: "gemv_q8_0_t1", 2: None, 3: "hc_write_norm", 4: "cupy_fill", 5: "moe_combine", 6: "router_gemv_topk"}
    edges = [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (1, 3)]
    assert programmatic_edges(names, edges, ready) == [(5, 6), (1, 3)]


def test_unknown_nodes_and_no_edges():
    assert programmatic_edges({}, [(1, 2)], ready) == []
    assert programmatic_edges({1: "moe_combine"}, [], ready) == []


def test_loaded_functions_are_what_kernel_handed_out(monkeypatch):
    from strata_cli.gpu import compile as C
    from strata_cli.gpu import pdl

    monkeypatch.setattr(C, "_LOADED", {"moe_combine"})
    assert pdl.project_kernel("moe_combine") and not pdl.project_kernel("cupy_fill")


class _FakeRuntime:
    """cudaGraphGetEdges / Remove / AddDependencies over a list of (from, to) edges of default type; node handles
    are ints. The enums and the edge data class are cuda-bindings' own."""

    def __init__(self, edges):
        from cuda.bindings import runtime as rt

        self.rt, self.edges, self.calls = rt, list(edges), []
        self.cudaGraphDependencyType = rt.cudaGraphDependencyType
        self.cudaGraphEdgeData = rt.cudaGraphEdgeData
        self.cudaGraphKernelNodePortProgrammatic = rt.cudaGraphKernelNodePortProgrammatic

    def cudaGraphGetEdges(self, graph, n=0):
        data = [self.rt.cudaGraphEdgeData() for _ in self.edges]
        if not n:
            return 0, None, None, None, len(self.edges)
        return 0, [a for a, _ in self.edges], [b for _, b in self.edges], data, len(self.edges)

    def cudaGraphRemoveDependencies(self, graph, froms, tos, data, n):
        self.calls.append(("remove", list(zip(froms, tos)), data, n))
        return (0,)

    def cudaGraphAddDependencies(self, graph, froms, tos, data, n):
        self.calls.append(("add", list(zip(froms, tos)), [(int(d.type), d.from_port, d.to_port) for d in data], n))
        return (0,)


def test_make_programmatic_removes_and_adds_the_chosen_edges(monkeypatch):
    pytest.importorskip("cuda.bindings.runtime")
    from strata_cli.gpu import pdl

    fake = _FakeRuntime([(1, 2), (2, 3), (3, 4), (4, 5)])
    monkeypatch.setattr(pdl, "cudart", lambda: fake)
    monkeypatch.setattr(pdl, "supported", lambda: True)
    names = {1: "gemv_q8_0_t1", 2: "hc_write_norm", 3: None, 4: "moe_combine", 5: "router_gemv_topk"}
    assert pdl.make_programmatic("graph", names, ready) == 2
    programmatic = int(fake.rt.cudaGraphDependencyType.cudaGraphDependencyTypeProgrammatic)
    port = int(fake.rt.cudaGraphKernelNodePortProgrammatic)
    assert fake.calls == [("remove", [(1, 2), (4, 5)], None, 2),
                          ("add", [(1, 2), (4, 5)], [(programmatic, port, 0)] * 2, 2)]


def test_make_programmatic_is_a_no_op_below_sm90(monkeypatch):
    pytest.importorskip("cuda.bindings.runtime")
    from strata_cli.gpu import pdl

    fake = _FakeRuntime([(1, 2)])
    monkeypatch.setattr(pdl, "cudart", lambda: fake)
    monkeypatch.setattr(pdl, "supported", lambda: False)
    assert pdl.make_programmatic("graph", {1: "moe_combine", 2: "hc_write_norm"}, ready) == 0
    assert fake.calls == []
