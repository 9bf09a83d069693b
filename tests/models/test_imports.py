"""docs/architecture.md §1: models/ imports one module of the runtime, ``runtime/contract.py``
(which re-exports what a model needs of the rest: the PTS clock, loop failures, extension types,
and the driver for tools that run a loop alone); never sessions/ or server/ (import-linter's
product layers, [tool.importlinter], hold that part)."""

from __future__ import annotations

import ast
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_models_import_only_the_contract_of_the_runtime() -> None:
    offenders, files = [], sorted(MODELS.rglob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module == "runtime":  # `from runtime import driver`
                    names = [f"runtime.{alias.name}" for alias in node.names]
            offenders += [
                f"{path.relative_to(MODELS.parent)}: {name}"
                for name in names
                if name.split(".")[0] == "runtime" and name != "runtime.contract"
            ]
    assert offenders == []
    assert len(files) > 50  # the walk really saw the model plane
