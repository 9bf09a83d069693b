"""``POST /v1/images/generations``: OpenAI's image API over dreamrt's text-to-image jobs
(docs/api.md "OpenAI-compatible API").

``n`` (1–4) t2i jobs of one prompt, each its own seed, queued like ``POST /v1/jobs`` (batch
class, ``--max-queued-jobs``: 429 + ``Retry-After`` when the ``n`` do not fit), and the answer
waits for all of them: ``{"created", "data": [{"b64_json"} | {"url"}], "size",
"output_format": "png"}``. ``response_format: "url"`` answers each job's artifact URL
(``GET /v1/jobs/{id}/artifact``, the same bearer token). A wait longer than ``IMAGE_WAIT_S``
is a 504 naming the job ids (they keep running; their artifacts stay readable).
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

from fastapi import APIRouter, Request

from server.api.deps import AuthGrant, check_prompt, ctx_of, require_general
from server.edge.errors import creation_errors
from server.openai.errors import OpenAIError, OpenAIRoute, invalid
from server.openai.schemas import ImageBody
from server.openai.video_routes import card_of
from server.openai.videos import check_queue, parse_size

__all__ = ["IMAGE_WAIT_S", "router"]

router = APIRouter(prefix="/v1/images", route_class=OpenAIRoute)

IMAGE_WAIT_S = 300.0  # the longest an answer waits for its jobs (read at each request)


@router.post("/generations")
async def generate(body: ImageBody, request: Request, grant: AuthGrant) -> dict[str, object]:
    require_general(grant)
    ctx = ctx_of(request)
    check_prompt(request, "prompt", body.prompt)
    card = card_of(ctx, body.model)
    if "text_to_image" not in card.capabilities:
        raise invalid("model", f"model {card.model_id!r} does not make images")
    width, height = parse_size(card, body.size)
    n = body.n or 1
    check_queue(ctx, needed=n)
    jobs = []
    with creation_errors():
        for _ in range(n):
            jobs.append(
                ctx.jobs.submit_job(
                    task="t2i",
                    prompt=body.prompt,
                    model=card.model_id,
                    width=width,
                    height=height,
                )
            )
    ids = [job.id for job in jobs]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(job.wait_finished() for job in jobs)), timeout=IMAGE_WAIT_S
        )
    except TimeoutError:
        raise OpenAIError(
            504,
            f"image jobs {ids} did not finish within {IMAGE_WAIT_S:g} s; they go on: "
            f"GET /v1/jobs/{{id}} and /v1/jobs/{{id}}/artifact",
            code="timeout",
            headers={"x-should-retry": "false"},
        ) from None
    failed = [job for job in jobs if job.artifact is None]
    if failed:
        job = failed[0]
        raise OpenAIError(
            500,
            f"image job {job.id!r} ended {job.state.value}: {job.error}",
            code="job_failed",
        )
    if body.response_format == "url":
        base = str(request.base_url).rstrip("/")
        data = [{"url": f"{base}/v1/jobs/{job.id}/artifact"} for job in jobs]
    else:
        artifacts = [job.artifact for job in jobs if job.artifact is not None]  # all (above)
        pngs = await asyncio.gather(*(asyncio.to_thread(_read, a.path) for a in artifacts))
        data = [{"b64_json": base64.b64encode(png).decode("ascii")} for png in pngs]
    profile = card.resolve_profile(width=width, height=height)
    return {
        "created": int(time.time()),
        "data": data,
        "size": f"{profile.width}x{profile.height}",
        "output_format": "png",
    }


def _read(path: Path) -> bytes:
    return path.read_bytes()
