"""``dreamrt job``: submit a T2V/T2I job, show its progress, download the artifact.

Polls ``GET /v1/jobs/{id}`` every ``poll_s`` and draws a one-line progress bar; on success
streams the artifact to ``--out`` (default ``<job id>.mp4`` / ``.png``). Returns the final job
view; a failed or cancelled job raises ``JobFailed`` naming its error.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, TextIO

from clients.python.api import DreamrtClient

__all__ = ["JobFailed", "follow_job", "run_job"]

_EXT = {"t2v": ".mp4", "t2i": ".png"}


class JobFailed(RuntimeError):
    pass


def _bar(progress: float, width: int = 30) -> str:
    done = round(progress * width)
    return "[" + "#" * done + "." * (width - done) + f"] {progress * 100:5.1f}%"


async def run_job(
    url: str,
    *,
    task: str,
    prompt: str,
    out: Path | None = None,
    token: str | None = None,
    poll_s: float = 0.25,
    timeout_s: float = 3600.0,
    stream: TextIO = sys.stdout,
    **params: Any,
) -> dict[str, Any]:
    async with DreamrtClient(url, token=token) as api:
        job_id = await api.submit_job(task, prompt, **params)
        stream.write(f"job {job_id} submitted ({task})\n")
        return await follow_job(
            api, job_id, task, out=out, poll_s=poll_s, timeout_s=timeout_s, stream=stream
        )


async def follow_job(
    api: DreamrtClient,
    job_id: str,
    task: str,
    *,
    out: Path | None = None,
    poll_s: float = 0.25,
    timeout_s: float = 3600.0,
    stream: TextIO = sys.stdout,
) -> dict[str, Any]:
    """Polls ``job_id`` to its end drawing progress, then downloads its artifact."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        view = await api.job(job_id)
        stream.write(f"\r{view['state']:>9} {_bar(view['progress'])}")
        stream.flush()
        if view["state"] in ("succeeded", "failed", "cancelled"):
            break
        if loop.time() > deadline:
            raise TimeoutError(f"job {job_id} did not finish within {timeout_s} s")
        await asyncio.sleep(poll_s)
    stream.write("\n")
    if view["state"] != "succeeded":
        raise JobFailed(f"job {job_id} {view['state']}: {view.get('error', 'no error given')}")
    path = out or Path(f"{job_id}{_EXT.get(task, '')}")
    media_type, size = await api.download_artifact(job_id, path)
    stream.write(f"wrote {path} ({media_type}, {size} bytes)\n")
    view["out"] = str(path)
    return view
