"""A base install (no ``reference`` extra: neither transformers nor diffusers) imports the server
and serves the default card; a Wan card then fails with an error that names the extra.

Each check runs in a fresh interpreter where ``sys.modules[name] = None`` makes any import of the
optional packages fail, as on a machine that never installed them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_BLOCK = "import sys\nsys.modules['transformers'] = None\nsys.modules['diffusers'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + code], cwd=REPO, capture_output=True, text=True, timeout=240
    )


def test_default_card_imports_and_serves_without_the_reference_extra(tmp_path: Path) -> None:
    code = f"""
import asyncio
from fastapi.testclient import TestClient
import models, models.checkpoint, models.instance, models.loops.diffusion_denoise
import server.app, server.cli
from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.driver import run_inline
from server.app import DEFAULT_MODEL, ServerConfig, create_app

instance = load_instance(get(DEFAULT_MODEL), device="cpu")
result, emissions = asyncio.run(run_inline(
    instance.loop("chunk_rollout"), SessionRequest(prompt="a red ball", max_chunks=1), instance))
frames = sum(e.output.shape[0] for e in emissions if e.spec.stream == "media")
config = ServerConfig.of(data_dir=r"{tmp_path}", device="cpu", web_dir=None)
with TestClient(create_app(config)) as client:
    created = client.post("/v1/sessions", json={{"prompt": "a red ball"}}).status_code
print(DEFAULT_MODEL, frames > 0, created, [m for m in ("transformers", "diffusers")
                                          if sys.modules.get(m) is not None])
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "tiny-world True 201 []"


def test_wan_card_without_transformers_names_the_extra() -> None:
    code = """
from models.instance import load_instance
from models.registry import get
from models.wan.text_encoder import MissingExtraError
try:
    load_instance(get("wan-tiny-random"), device="cpu")
except MissingExtraError as exc:
    print("error:", exc)
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert "needs the optional package 'transformers'" in done.stdout
    assert "pip install 'dreamrt[reference]'" in done.stdout
