"""docs/architecture.md §1: in server/, only the composition roots import runtime/ or model code.

Every other server module sees the engine and the models through sessions/, and may import
from models/ only card data: the registry and the card types.
The walk reads every import statement, those inside functions included.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"
# What wires concrete things together: the app and what it runs before serving, the `--gpus N`
# world, a replay's own model, and the CLI entry points that check flags against the models.
COMPOSITION_ROOTS = {
    "app.py",
    "context.py",
    "ops/warm_up.py",
    "ops/warm_start.py",
    "compile_cli.py",
    "spmd_serving.py",
    "data/replay.py",
    "cli.py",
    "serve_cli.py",
}
# the card package (models/card/) and its parts, the registry, the request types
CARD_DATA = {"models.card", "models.registry", "models.loops.requests"}
# standard-library-only modules of runtime/ every layer may use: the error root and TaskSet
SHARED_RUNTIME = {"runtime.errors", "runtime.task_set"}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (an annotation's import runs nothing:
    a Protocol of an edge may name the engine it reads)."""
    out: list[ast.AST] = []
    todo = deque([tree])  # breadth first, as ast.walk
    while todo:
        node = todo.popleft()
        out.append(node)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)
    return out


def _imported_modules(path: Path) -> list[str]:
    names: list[str] = []
    for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in {"models", "runtime"}:  # `from models import registry`
                names += [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                names.append(node.module)
    return names


def _offenders(path: Path) -> list[str]:
    out = []
    for name in _imported_modules(path):
        top = name.split(".")[0]
        if (top == "runtime" and name not in SHARED_RUNTIME) or (
            top == "models" and name not in CARD_DATA and not name.startswith("models.card.")
        ):
            out.append(f"{path.name}: {name}")
    return out


def test_only_composition_roots_import_runtime_or_model_code() -> None:
    modules = {path.relative_to(SERVER).as_posix(): path for path in SERVER.rglob("*.py")}
    others = [path for name, path in sorted(modules.items()) if name not in COMPOSITION_ROOTS]
    offenders = [o for path in others for o in _offenders(path)]
    assert offenders == []
    assert len(modules) > 40  # the walk really saw the server package
    assert COMPOSITION_ROOTS <= set(modules)  # no root is a stale name


def test_the_walk_finds_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "route.py"
    module.write_text(
        "from models import registry\n"
        "def handler():\n"
        "    from runtime.admission import Reject\n"
        "    import models.instance\n"
        "if TYPE_CHECKING:\n"
        "    from runtime.engine import Engine\n"  # an annotation's: not a dependency
        "else:\n"
        "    import runtime.cost\n"
    )
    assert sorted(_offenders(module)) == [
        "route.py: models.instance",
        "route.py: runtime.admission",
        "route.py: runtime.cost",
    ]
