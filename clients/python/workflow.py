"""``dreamrt run workflow.json``: run a ComfyUI API-format workflow on a dreamrt server.

Posts the file to ``POST /v1/workflows`` (a file holding ComfyUI's ``/prompt`` body, with the
graph under ``"prompt"``, or the bare graph), prints where each ComfyUI node went in the
compiled program, follows the job like ``dreamrt job`` and downloads its artifact (default
``<id>.mp4`` / ``.png``). A workflow the server does not cover fails with the server's list of
every node and parameter it does not cover.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from clients.python.api import DreamrtClient
from clients.python.job import follow_job

__all__ = ["run_workflow"]


def workflow_body(path: Path, model: str | None) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    body = {k: v for k, v in data.items() if k in ("prompt", "client_id")}
    if not isinstance(data.get("prompt"), dict):
        body = {"prompt": data}  # the bare API-format graph
    if model is not None:
        body["model"] = model
    return body


async def run_workflow(
    url: str,
    path: Path,
    *,
    model: str | None = None,
    out: Path | None = None,
    token: str | None = None,
    poll_s: float = 0.25,
    timeout_s: float = 3600.0,
    stream: TextIO = sys.stdout,
) -> dict[str, Any]:
    async with DreamrtClient(url, token=token) as api:
        response = await api.request("POST", "/v1/workflows", json=workflow_body(path, model))
        created = response.json()
        stream.write(f"workflow {path.name} -> job {created['job']} on {created['model']}\n")
        for node, role in sorted(created["nodes"].items(), key=lambda kv: (len(kv[0]), kv[0])):
            stream.write(f"  node {node}: {role}\n")
        task = "t2i" if _artifact_format(created["program"]) == "png" else "t2v"
        return await follow_job(
            api, created["job"], task, out=out, poll_s=poll_s, timeout_s=timeout_s, stream=stream
        )


def _artifact_format(program: dict[str, Any]) -> str:
    for node in program["nodes"].values():
        if node["kind"] == "artifact":
            return str(node.get("format", "mp4"))
    return "mp4"
