"""The package's layers hold (pyproject.toml [tool.importlinter], checked by `lint-imports`), and no module
or package imports itself back through others: every import counts, function-level and TYPE_CHECKING ones
included."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
from helpers import ROOT


def _cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each a cycle's members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("llmbuild", cache_dir=None)


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    modules = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert _cycles(modules, edges) == []


def test_no_package_imports_itself_back() -> None:
    graph = _graph()

    def package(module: str) -> str:
        # A family folder's role modules sit at different layers (its `verify` above llmbuild.verify, its
        # `family` below the frontend): each is a unit of its own, like a package.
        parts = module.split(".")
        return module if parts[:2] == ["llmbuild", "families"] and len(parts) > 3 else ".".join(parts[:2])

    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        for target in graph.find_modules_directly_imported_by(m):
            if package(target) != package(m) and target.startswith("llmbuild.") and m.startswith("llmbuild."):
                edges.setdefault(package(m), set()).add(package(target))
    assert _cycles(set(edges) | {t for ts in edges.values() for t in ts}, edges) == []


def test_the_cycle_scan_finds_a_cycle() -> None:
    assert _cycles({"a", "b", "c"}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a", "b"}, {"a": {"b"}}) == []


def test_lint_imports_keeps_the_layer_contracts() -> None:
    command = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    result = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    contracts = len(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert f"{contracts} kept, 0 broken" in result.stdout  # every contract was read and kept
