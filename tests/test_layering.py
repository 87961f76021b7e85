"""The package layering of strata_cli (README "Architecture"), read from the source with ast: which package may
import which, and no import cycle between modules. Every import counts, a function's lazy one too: a lazy import
hides a cycle from Python at load time, not from the reader."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "strata_cli"

# package (or root module) of strata_cli -> what it may import (strata_cli/__init__.py, the version, is free to all)
BASE = {"errors"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "settings": {"errors"},
    "sysio": BASE | {"settings"},
    "model": BASE | {"settings", "sysio"},
    "ops": BASE | {"model"},
    "gpu": BASE | {"settings", "model", "ops"},
    "report": BASE | {"settings", "sysio", "model", "gpu"},
    "synth": BASE | {"settings", "sysio", "model", "report"},
    "tiers": BASE | {"settings", "sysio", "model", "ops", "gpu", "report"},
    "engine": BASE | {"settings", "sysio", "model", "ops", "gpu", "report", "tiers"},
    "analysis": BASE | {"settings", "sysio", "model", "ops", "report", "engine"},
    "commands": BASE | {"settings", "sysio", "model", "ops", "gpu", "report", "synth", "tiers", "engine", "analysis"},
    "cli": BASE | {"settings", "sysio", "engine", "commands"},  # cli loads commands by name (importlib)
    "__main__": {"cli"},
}



def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The strata_cli modules `name` imports: `from pkg import sub` names the submodule when there is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        else:
            continue
        found |= {t for t in targets if t == "strata_cli" or t.startswith("strata_cli.")}
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> str | None:
    """The ALLOWED key of a module: its top package under strata_cli, or a root module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: strata_cli/__init__.py


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        mine = layer_of(src)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is None or theirs is None or mine == theirs:
                continue
            if mine not in ALLOWED:
                bad.append(f"{src}: package {mine} is not in the layering table")
            elif theirs not in ALLOWED[mine]:
                bad.append(f"{src} imports {target}: {mine} may import only {sorted(ALLOWED[mine])}")
    return bad


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _top_names(path: Path) -> set[str]:
    """The names a module defines at import time (defs, classes, assignments, imports; through if / try / with)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            for field in ("body", "orelse", "finalbody", "handlers"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(node, field, []))

    visit(ast.parse(path.read_text(), str(path)).body)
    return names


def unresolved_imports() -> list[str]:
    """Imports of strata_cli modules (a function's lazy one too) that name no module or no name of it, or climb
    out of the package (`from ...x` in strata_cli/tiers/host.py): such an import fails only when its line runs,
    which for a lazy import may be on a path no CPU test takes (TierHost.close's, on the GPU)."""
    modules = _modules()
    bad = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                bad += [f"{where}: no module {a.name}" for a in node.names
                        if a.name.startswith("strata_cli") and a.name not in modules]
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                depth = len(package.split("."))
                if node.level > depth:
                    bad.append(f"{where}: {'.' * node.level}{node.module or ''} climbs out of strata_cli")
                    continue
                module = ".".join(package.split(".")[:depth - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not (module == "strata_cli" or module.startswith("strata_cli.")):
                continue
            if module not in modules:
                bad.append(f"{where}: no module {module}")
                continue
            defined = _top_names(modules[module])
            bad += [f"{where}: {module} has no {a.name}" for a in node.names
                    if a.name != "*" and f"{module}.{a.name}" not in modules and a.name not in defined]
    return bad


def test_every_import_names_a_module_and_name_that_exist():
    assert unresolved_imports() == []


def test_every_package_is_in_the_table():
    assert {layer_of(m) for m in import_graph()} - {None} <= set(ALLOWED)


def test_packages_import_only_what_the_table_allows():
    assert layering_violations(import_graph()) == []


def test_no_import_cycle():
    cycles = set(import_cycles(import_graph()))
    assert cycles == set(), sorted(map(sorted, cycles))


def test_the_table_itself_has_no_cycle():
    graph = {f"strata_cli.{k}": {f"strata_cli.{v}" for v in vs} for k, vs in ALLOWED.items()}
    assert import_cycles(graph) == []


def test_a_planted_upward_import_fails():
    graph = import_graph()
    graph["strata_cli.tiers.plan"] = graph["strata_cli.tiers.plan"] | {"strata_cli.engine.reference"}
    assert layering_violations(graph) == [
        "strata_cli.tiers.plan imports strata_cli.engine.reference: tiers may import only "
        f"{sorted(ALLOWED['tiers'])}"]
    graph["strata_cli.model.names"] = graph["strata_cli.model.names"] | {"strata_cli.model.quants"}
    graph["strata_cli.model.quants"] = graph["strata_cli.model.quants"] | {"strata_cli.model.names"}
    assert frozenset({"strata_cli.model.names", "strata_cli.model.quants"}) in import_cycles(graph)


def test_the_readme_architecture_table_is_this_table():
    import re

    readme = (ROOT.parent / "README.md").read_text()
    section = readme[readme.index("## Architecture"):readme.index("## Layout")]
    rows = re.findall(r"^\| `([\w]+)` \| [^|]+ \| ([^|]+) \|$", section, re.M)
    documented = {name: set() if cell.strip() == "-" else {c.strip() for c in cell.split(",")} for name, cell in rows}
    assert documented == ALLOWED
