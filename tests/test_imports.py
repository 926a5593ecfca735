"""The package's import graph, read from its source (function-level imports included, those
under ``TYPE_CHECKING`` not): data flows one way, so no module imports, even lazily, one that
imports it back, and the library rooms never import the command line."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "haepo_ray"


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its code."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def own(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                node.body = []
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {own(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {own(f"{node.module}.{a.name}") for a in node.names}
        graph[module] = targets - {None, module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_lazy_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert "haepo_ray.sweep.kinds.llm.trainable" in graph["haepo_ray.sweep.kinds.llm.plan"]  # the graph sees lazy imports
    assert cycles(graph) == []


def test_the_library_never_imports_the_command_line():
    graph = import_graph()
    up = {module: sorted(t for t in targets if t.startswith("haepo_ray.cli"))
          for module, targets in graph.items() if not module.startswith("haepo_ray.cli")}
    assert {m: t for m, t in up.items() if t} == {}
