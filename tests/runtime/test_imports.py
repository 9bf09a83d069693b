"""Import rules (docs/architecture.md §1): pure modules import without torch or asyncio.

import-linter holds the rest ([tool.importlinter] in pyproject.toml, `make lint`): runtime/
imports none of models/, sessions/, server/ (the product layers), and a pure module's own
imports name neither torch nor asyncio. This probe adds what a contract cannot say: each pure
module, with everything it imports at import time, loads with torch and asyncio absent.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# the same list as the pure-modules contract in pyproject.toml
PURE = [
    "runtime.scheduler",
    "runtime.step_edf",
    "runtime.baseline_schedulers",
    "runtime.policies",
    "runtime.engine_stats",
    "runtime.admission",
    "runtime.cost",
    "runtime.pools",
    "runtime.contract",
    "runtime.live_inputs",
    "runtime.emissions",
    "runtime.plans",
    "runtime.loop_protocol",
    "runtime.extensions",
    "runtime.loop_failures",
    "runtime.media_clock",
    "runtime.lead",
    "runtime.input_trace",
    "runtime.plan_timing",
    "runtime.engine_state",
]


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_without_torch_or_asyncio(module: str) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['asyncio'] = None\n"
        f"import {module}\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=RUNTIME.parent, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_probe_would_catch_a_torch_import() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['torch'] = None; import runtime.observers, torch",
        ],
        capture_output=True,
        text=True,
        cwd=RUNTIME.parent,
        timeout=60,
    )
    assert proc.returncode != 0 and "torch" in proc.stderr


def _runtime_import_graph() -> dict[str, set[str]]:
    """Each runtime module's imports of other runtime modules, every import statement counted:
    at module level, inside functions and under ``TYPE_CHECKING``."""
    modules = {f"runtime.{path.stem}": path for path in RUNTIME.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[module] = {d for d in deps if d in modules and d != module}
    return graph


def test_runtime_has_no_import_cycle() -> None:
    graph = _runtime_import_graph()
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for dep in sorted(graph[module]):
            if found := cycle_from(dep, [*path, module]):
                return found
        done.add(module)
        return None

    cycles = [c for m in sorted(graph) if (c := cycle_from(m, []))]
    assert cycles == []
    assert "runtime.driver" in graph["runtime.contract"]  # the lazy re-export is counted


def test_the_driver_and_the_snapshot_codec_import_below_the_contract() -> None:
    graph = _runtime_import_graph()
    assert "runtime.contract" not in graph["runtime.driver"]
    assert "runtime.contract" not in graph["runtime.snapshot"]
