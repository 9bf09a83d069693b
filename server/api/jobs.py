"""``/v1/jobs`` routes (docs/api.md "REST"): submit, status, artifact download, cancel.

A job answers 202 at once and runs in the realtime sessions' slack. ``GET .../artifact``
answers 409 until the job succeeded (the message names its state), then streams the MP4/PNG.
Finished jobs stay readable from the store after the process restarts.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, StreamingResponse

from server.api.deps import AuthGrant, check_prompt, ctx_of, require_general
from server.edge import sse
from server.edge.errors import ApiError, creation_errors
from server.edge.schemas import JobBody, JobCreated, OfferBody, SdpAnswer
from server.media.job_preview import JobPreviewPeer
from sessions.job import Job
from sessions.moments import render_moment, session_of

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs")


@router.post("", status_code=202)
async def submit(body: JobBody, request: Request, grant: AuthGrant) -> JobCreated:
    require_general(grant)
    ctx = ctx_of(request)
    jobs = ctx.jobs
    check_prompt(request, "prompt", body.prompt)
    limit = ctx.config.limits.max_queued_jobs
    waiting = [job for job in jobs.jobs() if not job.terminal]
    if len(waiting) >= limit:
        retry = _retry_after_s(waiting)
        raise ApiError(
            429,
            "queue_full",
            f"{len(waiting)} jobs are queued or running; the limit is {limit}",
            headers={"Retry-After": str(retry)},
            retry_after_s=retry,
        )
    if session_of(body.program) is not None:  # render a moment of a session
        with creation_errors():
            job = await render_moment(ctx.host, jobs, body.program)
        return JobCreated(id=job.id)
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
            program=body.program,
        )
    return JobCreated(id=job.id)


def _retry_after_s(waiting: list[Job]) -> int:
    """When a queue slot is likely free: the running job's remaining time at its pace so far
    (progress per second since it was created), else 5 s; 1..600."""
    import time

    estimates = []
    for job in waiting:
        elapsed_s = time.time() - job.created_at
        if 0 < job.progress < 1 and elapsed_s > 0:
            estimates.append(elapsed_s * (1 - job.progress) / job.progress)
    return int(min(600, max(1, round(min(estimates)) if estimates else 5)))


async def _job_view(request: Request, job_id: str) -> dict[str, object]:
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
    program = (row["params"] or {}).get("program")
    if program is not None:
        view["program"] = program["name"]
    if row["error"]:
        view["error"] = row["error"]
    return view


@router.get("/{job_id}")
async def get_job(job_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
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
    path = Path(str(view["_artifact_path"]))
    if not path.exists():
        raise ApiError(410, "gone", f"the artifact of job {job_id!r} is no longer on disk")
    media_type = view["_media_type"]
    return FileResponse(
        path, media_type=media_type if isinstance(media_type, str) else None, filename=path.name
    )


@router.get("/{job_id}/events")
async def events(job_id: str, request: Request, grant: AuthGrant) -> StreamingResponse:
    """Server-Sent Events of a job (``job.state``, ``job.progress``, a program's
    ``job.preview``, ``job.artifact``), as for a session: replays after ``Last-Event-ID`` (or
    ``?after=``), then follows live until the job ends; a job no longer in memory replays its
    stored events."""
    require_general(grant)
    ctx = ctx_of(request)
    after = sse.after_id(request)
    job = ctx.jobs.job(job_id)
    if job is None:
        rows = await ctx.store.run(ctx.store.events, job_id)
        if not rows and await ctx.store.run(ctx.store.get_job, job_id) is None:
            raise ApiError(404, "not_found", f"no job {job_id!r}")
        return sse.response(sse.stored_frames(r for r in rows if r["event_id"] > after))
    return sse.response(sse.live_frames(job.events.subscribe(after_id=after)))


@router.post("/{job_id}/preview")
async def preview(job_id: str, body: OfferBody, request: Request, grant: AuthGrant) -> SdpAnswer:
    """A WebRTC viewer of a program job's preview stream (``server.media.job_preview``): the frames
    previewed so far, then each as it is decoded; the track ends with the job."""
    require_general(grant)
    ctx = ctx_of(request)
    job = ctx.jobs.job(job_id)
    if job is None:
        raise ApiError(404, "not_found", f"no job {job_id!r} is running here")
    if job.terminal:
        message = f"job {job_id!r} is {job.state.value}: its previews are in its events"
        raise ApiError(409, "conflict", message)
    if not job.previews:
        raise ApiError(409, "conflict", f"job {job_id!r}'s program has no preview stream")
    peer = JobPreviewPeer(job, ice_servers=ctx.config.ice_servers, on_closed=ctx.job_peers.discard)
    ctx.job_peers.add(peer)
    try:
        answer = await peer.answer(body.sdp)
    except BaseException:
        await peer.close()
        raise
    return SdpAnswer(sdp=answer.sdp, type="answer")


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
