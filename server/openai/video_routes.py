"""``/v1/videos``: OpenAI's video API over dreamrt's text-to-video jobs (docs/api.md
"OpenAI-compatible API").

    POST   /v1/videos                  JSON or multipart: prompt, model?, seconds?, size?
                                       -> the video object (a t2v job, queued)
    GET    /v1/videos/{id}             -> the video object (+ openai-poll-after-ms)
    GET    /v1/videos                  ?after=&limit=&order= -> {"object": "list", "data", ...}
    DELETE /v1/videos/{id}             cancels it if unfinished, deletes its MP4
                                       -> {"id", "object": "video.deleted", "deleted": true}
    GET    /v1/videos/{id}/content     ?variant=video (MP4) | thumbnail (PNG of frame 0)

The job underneath is the one ``POST /v1/jobs`` makes (``sessions.job_host``): batch class,
``--max-queued-jobs`` (429 + ``Retry-After`` here), cancellation, resumed after a restart.
Errors answer in OpenAI's shape (``server.openai.errors``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse

from server.api.deps import AuthGrant, check_prompt, ctx_of, require_general
from server.edge.errors import creation_errors
from server.openai.errors import OpenAIError, OpenAIRoute, invalid
from server.openai.schemas import VIDEO_REQUEST_BODY, read_video_body
from server.openai.videos import (
    DELETED,
    VideoContext,
    check_queue,
    fps_of,
    frames_for,
    is_deleted,
    parse_size,
    poll_after_ms,
    thumbnail_png,
    video_object,
)
from sessions.store_rows import JobRow

if TYPE_CHECKING:
    from models.card import ModelCard
    from sessions.job import Job

__all__ = ["card_of", "router"]

router = APIRouter(prefix="/v1/videos", route_class=OpenAIRoute)


def card_of(ctx: VideoContext, model: str | None) -> ModelCard:
    """The served card ``model`` names (the default card for None); 404 naming ``model``."""
    try:
        return ctx.jobs.models.resolve(model).card
    except KeyError as exc:
        raise OpenAIError(404, str(exc.args[0]), param="model", code="model_not_found") from None


async def _find(ctx: VideoContext, video_id: str) -> tuple[JobRow, Job | None]:
    """(store row, job in memory or None) of video ``video_id``; 404 when there is none."""
    # read after the writes the store has queued: the row of a video made a moment ago exists
    row = await ctx.store.run(ctx.store.get_job, video_id)
    job = ctx.jobs.job(video_id)
    if (
        row is None
        or row["task"] != "t2v"
        or is_deleted(row)
        or (job is not None and job.error == DELETED)
    ):
        raise OpenAIError(404, f"no video {video_id!r}", param="video_id", code="not_found")
    return row, job


@router.post("", openapi_extra=VIDEO_REQUEST_BODY)
async def create_video(request: Request, grant: AuthGrant) -> JSONResponse:
    require_general(grant)
    body = await read_video_body(request)
    ctx = ctx_of(request)
    check_prompt(request, "prompt", body.prompt)
    card = card_of(ctx, body.model)
    if body.input_reference is not None:
        raise invalid(
            "input_reference",
            f"model {card.model_id!r} cannot condition on an image (its capabilities: "
            f"{sorted(card.capabilities)}); send the prompt alone",
            code="unsupported_parameter",
        )
    if "text_to_video" not in card.capabilities:
        raise invalid("model", f"model {card.model_id!r} does not make videos")
    num_frames = frames_for(card, body.seconds)
    width, height = parse_size(card, body.size)
    check_queue(ctx)
    with creation_errors():
        job = ctx.jobs.submit_job(
            task="t2v",
            prompt=body.prompt,
            model=card.model_id,
            num_frames=num_frames,
            width=width,
            height=height,
        )
    row, held = await _find(ctx, job.id)
    return JSONResponse(video_object(row, held, card.default_profile.fps))


@router.get("")
async def list_videos(
    request: Request,
    grant: AuthGrant,
    after: Annotated[str, Query(max_length=64)] | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, object]:
    """Videos newest first (``order=asc``: oldest first); ``after``: the last id of the page
    before."""
    require_general(grant)
    ctx = ctx_of(request)
    rows = await ctx.store.run(ctx.store.list_jobs, "t2v", newest_first=order == "desc")
    rows = [
        row
        for row in rows
        if not is_deleted(row) and getattr(ctx.jobs.job(row["id"]), "error", None) != DELETED
    ]
    if after is not None:
        at = next((i for i, row in enumerate(rows) if row["id"] == after), None)
        if at is None:
            raise invalid("after", f"no video {after!r} to list after")
        rows = rows[at + 1 :]
    fps: dict[str, int | None] = {}
    data = []
    for row in rows[:limit]:
        if row["model_id"] not in fps:
            fps[row["model_id"]] = fps_of(ctx, row["model_id"])
        data.append(video_object(row, ctx.jobs.job(row["id"]), fps[row["model_id"]]))
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }


@router.get("/{video_id}")
async def get_video(video_id: str, request: Request, grant: AuthGrant) -> JSONResponse:
    require_general(grant)
    ctx = ctx_of(request)
    row, job = await _find(ctx, video_id)
    return JSONResponse(
        video_object(row, job, fps_of(ctx, row["model_id"])),
        headers={"openai-poll-after-ms": str(poll_after_ms(job))},
    )


@router.delete("/{video_id}")
async def delete_video(video_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
    require_general(grant)
    ctx = ctx_of(request)
    await _find(ctx, video_id)
    await ctx.jobs.delete_job(video_id)
    return {"id": video_id, "object": "video.deleted", "deleted": True}


@router.get("/{video_id}/content")
async def video_content(
    video_id: str,
    request: Request,
    grant: AuthGrant,
    variant: Literal["video", "thumbnail", "spritesheet"] = "video",
) -> Response:
    require_general(grant)
    ctx = ctx_of(request)
    row, job = await _find(ctx, video_id)
    state = job.state.value if job is not None else row["state"]
    if state != "succeeded":
        status = video_object(row, job, 1)["status"]
        raise OpenAIError(
            409,
            f"video {video_id!r} is {status}; its content exists once it is completed",
            code="not_ready",
            headers={"x-should-retry": "false"},
        )
    if variant == "spritesheet":
        raise invalid("variant", "this server makes no spritesheet; ask for video or thumbnail")
    path = Path(row["artifact_path"]) if row["artifact_path"] else None
    if path is None or not path.exists():
        raise OpenAIError(410, f"the MP4 of video {video_id!r} is no longer on disk", code="gone")
    if variant == "thumbnail":
        return Response(await asyncio.to_thread(thumbnail_png, path), media_type="image/png")
    return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")
