"""Import rules (docs/architecture.md §1): pure modules import without torch or asyncio.

import-linter holds the rest ([tool.importlinter] in pyproject.toml, `make lint`): runtime/
imports none of models/, sessions/, server/ (the product layers), and a pure module's own
imports name neither torch nor asyncio. This probe adds what a contract cannot say: each pure
module, with everything it imports at import time, loads with torch and asyncio absent.
"""

from __future__ import annotations

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
