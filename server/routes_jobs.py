"""``/v1/jobs`` routes (docs/api.md "REST"): submit, status, artifact download, cancel.

A job answers 202 at once and runs in the realtime sessions' slack. ``GET .../artifact``
answers 409 until the job succeeded (the message names its state), then streams the MP4/PNG.
Finished jobs stay readable from the store after the process restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from server.routes_system import (
    ApiError,
    AuthGrant,
    creation_errors,
    ctx_of,
    require_general,
)
from server.schemas import JobBody, JobCreated

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs")


@router.post("", status_code=202)
async def submit(body: JobBody, request: Request, grant: AuthGrant) -> JobCreated:
    require_general(grant)
    jobs = ctx_of(request).jobs
    with creation_errors():
        job = jobs.submit_job(
            task=body.task,
            prompt=body.prompt,
            model=body.model,
            num_frames=body.num_frames,
            width=body.width,
            height=body.height,
            steps=body.steps,
            seed=body.seed,
            extensions=body.extensions or {},
            exact=body.exact,
        )
    return JobCreated(id=job.id)


async def _job_view(request: Request, job_id: str) -> dict[str, Any]:
    ctx = ctx_of(request)
    job = ctx.jobs.job(job_id)
    if job is not None:
        view = job.snapshot()
        view["_artifact_path"] = str(job.artifact.path) if job.artifact is not None else None
        view["_media_type"] = job.artifact.media_type if job.artifact is not None else None
        return view
    row = await ctx.store.run(ctx.store.get_job, job_id)
    if row is None:
        raise ApiError(404, "not_found", f"no job {job_id!r}")
    view = {
        "id": row["id"],
        "state": row["state"],
        "progress": row["progress"],
        "task": row["task"],
        "model": row["model_id"],
        "created_at": row["created_at"],
        "_artifact_path": row["artifact_path"],
        "_media_type": row["media_type"],
    }
    if row["error"]:
        view["error"] = row["error"]
    return view


@router.get("/{job_id}")
async def get_job(job_id: str, request: Request, grant: AuthGrant) -> dict[str, Any]:
    require_general(grant)
    view = await _job_view(request, job_id)
    return {k: v for k, v in view.items() if not k.startswith("_")}


@router.get("/{job_id}/artifact")
async def artifact(job_id: str, request: Request, grant: AuthGrant) -> FileResponse:
    require_general(grant)
    view = await _job_view(request, job_id)
    if view["state"] != "succeeded" or not view["_artifact_path"]:
        raise ApiError(
            409,
            "not_ready",
            f"job {job_id!r} is {view['state']}; its artifact exists once it succeeded",
        )
    path = Path(view["_artifact_path"])
    if not path.exists():
        raise ApiError(410, "gone", f"the artifact of job {job_id!r} is no longer on disk")
    return FileResponse(path, media_type=view["_media_type"], filename=path.name)


@router.delete("/{job_id}", status_code=204)
async def cancel(job_id: str, request: Request, grant: AuthGrant) -> Response:
    require_general(grant)
    ctx = ctx_of(request)
    if (
        not await ctx.jobs.cancel_job(job_id)
        and await ctx.store.run(ctx.store.get_job, job_id) is None
    ):
        raise ApiError(404, "not_found", f"no job {job_id!r}")
    return Response(status_code=204)
