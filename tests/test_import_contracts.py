"""The import contracts of pyproject.toml ([tool.importlinter], run by `make lint`) hold, and
import-linter really fails a tree that breaks one: a copy of the product's modules with one
import added against a layer, and one between two edges of the server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "models", "sessions", "server", "clients")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    # the copy's packages first: the repository's own are installed (editable) in this venv
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The product's Python modules (no weights or assets) and pyproject.toml, in tmp_path."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=lambda _, names: [n for n in names if "." in n and not n.endswith(".py")],
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_contracts_hold() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_a_runtime_module_that_imports_the_server_breaks_the_layers(tree: Path) -> None:
    with (tree / "runtime" / "errors.py").open("a") as module:
        module.write("\nimport server.edge.auth  # noqa: E402,F401\n")
    proc = _lint(tree)
    assert proc.returncode == 1
    assert "Product layers: server -> sessions -> models -> runtime BROKEN" in proc.stdout
    assert "runtime.errors -> server.edge.auth" in proc.stdout


def test_livekit_importing_the_openai_api_breaks_the_edges(tree: Path) -> None:
    with (tree / "server" / "livekit" / "token.py").open("a") as module:
        module.write("\n\ndef _shape():\n    from server.openai.errors import OpenAIError\n")
    proc = _lint(tree)
    assert proc.returncode == 1
    assert "server/ edges do not import each other BROKEN" in proc.stdout
    assert "server.livekit.token -> server.openai.errors" in proc.stdout
