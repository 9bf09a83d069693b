"""No import circles among the product's modules (docs/architecture.md §1).

The walk reads every import statement of every module of runtime/, models/, sessions/, server/
and clients/ (those inside functions and under ``TYPE_CHECKING`` included: a circle hidden in a
function is still a circle), resolves each to the deepest repository module it names, and finds
the strongly connected components of that graph. Any component of more than one module fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "models", "sessions", "server", "clients")


def modules(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name (a package by its own)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from .x import y
        parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    # `from a import b` imports the module a.b when there is one, else a name of a
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the repository modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(node, package, known):
                while target and target not in known:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_import_cycles() -> None:
    known = modules()
    assert len(known) > 250  # the walk really saw the product
    found = [sorted(c) for c in cycles(import_graph(known))]
    assert found == []


def test_the_walk_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    package = tmp_path / "server"
    (package / "edge").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "edge" / "__init__.py").write_text("")
    (package / "app.py").write_text("from server.edge.routes import router\nDEFAULT = 1\n")
    (package / "edge" / "routes.py").write_text(
        "router = None\ndef handler():\n    from server.app import DEFAULT\n    return DEFAULT\n"
    )
    (package / "edge" / "leaf.py").write_text("from . import routes\n")
    graph = import_graph(modules(tmp_path, ["server"]))
    assert graph["server.edge.leaf"] == {"server.edge.routes"}  # relative imports resolve
    assert cycles(graph) == [{"server.app", "server.edge.routes"}]
