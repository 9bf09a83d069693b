"""A text-to-video job as OpenAI's video API shows it: the ``video`` object, the list, the
thumbnail, and the checks a new video's parameters pass before its job is queued.

A video *is* a ``t2v`` job (same id, same scheduler class, limits, cancellation, persistence;
``GET /v1/jobs/{id}`` reads it too). Its object is built from the job's store row (read after
the store's queued writes, so it is current) with the live progress of the job in memory:

    job state   queued  running      succeeded  failed  cancelled
    status      queued  in_progress  completed  failed  failed (error code "cancelled")

A job whose ``error`` is ``"deleted"`` (``DELETE /v1/videos/{id}``, or a cancel by
``DELETE /v1/jobs/{id}``) is gone from this API: 404, and not listed.
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from server.openai.errors import OpenAIError, invalid
from sessions.store_rows import JobRow

if TYPE_CHECKING:
    from models.card import ModelCard
    from server.config.serve import ServerConfig
    from sessions.job import Job
    from sessions.job_host import JobHost
    from sessions.store import Store

__all__ = [
    "DELETED",
    "MAX_FRAMES",
    "VideoContext",
    "check_queue",
    "frames_for",
    "parse_size",
    "poll_after_ms",
    "thumbnail_png",
    "video_object",
]

DELETED = "deleted"
MAX_FRAMES = 1024  # the job limit on frames (server.edge.schemas.JobBody.num_frames)
_STATUS = {
    "queued": "queued",
    "running": "in_progress",
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "failed",
}
_SIZE = re.compile(r"^([1-9][0-9]{0,3})x([1-9][0-9]{0,3})$")
_MAX_RETRY_AFTER_S = 10.0
_MAX_SIDE = 4096  # the job limit on width and height (server.edge.schemas.Dimension)


class VideoContext(Protocol):
    """What the video routes read of the live context (``server.context.ServerContext``, which
    this edge does not import)."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def jobs(self) -> JobHost: ...

    @property
    def store(self) -> Store: ...


def is_deleted(row: JobRow) -> bool:
    return row.get("error") == DELETED


def fps_of(ctx: VideoContext, model_id: str) -> int | None:
    """The frame rate a job of ``model_id`` ran at (jobs use the card's default profile);
    None for a card this build does not know (a video of an older build's data dir)."""
    try:
        return int(ctx.jobs.models.resolve(model_id).card.default_profile.fps)
    except KeyError:  # a video made by an earlier process that served another card
        from models import registry

        try:
            return int(registry.get(model_id).default_profile.fps)
        except LookupError:  # UnknownModelError
            return None


def _seconds(num_frames: int | None, fps: int | None) -> str:
    if fps is None:
        return "unknown"
    frames = num_frames or 2 * fps  # the loops' default clip is two seconds
    return str(frames // fps) if frames % fps == 0 else f"{frames / fps:g}"


def _error(state: str, error: str | None) -> dict[str, str] | None:
    if state == "cancelled":
        return {"code": "cancelled", "message": error or "cancelled"}
    if state != "failed":
        return None
    code, _, message = (error or "failed").partition(": ")
    return {"code": code, "message": message or code}


def video_object(row: JobRow, job: Job | None, fps: int | None) -> dict[str, object]:
    """The ``video`` object of the job whose store ``row`` this is (``job``: the job held in
    memory, whose state and progress are live; None for an older one)."""
    params = row["params"]
    state = job.state.value if job is not None else row["state"]
    progress = job.progress if job is not None else row["progress"]
    error = job.error if job is not None else row["error"]
    finished = state in ("succeeded", "failed", "cancelled")
    return {
        "id": row["id"],
        "object": "video",
        "model": row["model_id"],
        "status": _STATUS[state],
        "progress": 100 if state == "succeeded" else int(progress * 100),
        "created_at": int(row["created_at"]),
        "completed_at": int(row["updated_at"]) if finished else None,
        "expires_at": None,  # kept until deleted
        "size": f"{params.get('width')}x{params.get('height')}",
        "seconds": _seconds(params.get("num_frames"), fps),
        "prompt": row["prompt"],
        "remixed_from_video_id": None,
        "error": _error(state, error),
    }


def poll_after_ms(job: Job | None, now_s: float | None = None) -> int:
    """How long a client polling ``job`` should wait (the ``openai-poll-after-ms`` header the
    official client's ``poll`` honours): its remaining time at its pace so far, 0.2–5 s."""
    if job is None or job.terminal:
        return 1000
    elapsed_s = (now_s if now_s is not None else time.time()) - job.created_at
    if 0 < job.progress < 1 and elapsed_s > 0:
        remaining_ms = 1000 * elapsed_s * (1 - job.progress) / job.progress
        return int(min(5000, max(200, remaining_ms)))
    return 500


def parse_size(card: ModelCard, size: str | None) -> tuple[int | None, int | None]:
    """``"WxH"`` -> (width, height) the card allows; (None, None) for its default. 400 names
    ``size``."""
    if size is None:
        return None, None
    match = _SIZE.match(size)
    if match is None:
        raise invalid("size", f"size {size!r} is not WIDTHxHEIGHT (e.g. '96x96')")
    width, height = int(match.group(1)), int(match.group(2))
    if max(width, height) > _MAX_SIDE:
        raise invalid("size", f"size {size!r}: at most {_MAX_SIDE} pixels a side")
    try:
        card.resolve_profile(width=width, height=height)
    except ValueError as exc:  # the card's ProfileError names what it allows
        raise invalid("size", f"size {size!r}: {exc}") from None
    return width, height


def frames_for(card: ModelCard, seconds: str | int | None) -> int:
    """Frames of a clip of ``seconds`` (default 4, OpenAI's) at the card's fps, within the
    job limit. 400 names ``seconds``."""
    text = "4" if seconds is None else str(seconds).strip()
    if not text.isdigit() or int(text) < 1:
        raise invalid("seconds", f"seconds must be a positive integer, not {seconds!r}")
    fps = card.default_profile.fps
    frames = int(text) * fps
    if frames > MAX_FRAMES:
        raise invalid(
            "seconds",
            f"{text} s at {fps} fps is {frames} frames; model {card.model_id!r} makes at most "
            f"{MAX_FRAMES // fps} s ({MAX_FRAMES} frames) per video",
        )
    return frames


def check_queue(ctx: VideoContext, needed: int = 1, *, now_s: float | None = None) -> None:
    """429 + ``Retry-After`` when ``needed`` more jobs would pass ``--max-queued-jobs``. The
    wait is the soonest a running job should end at its pace so far, 0.5–10 s
    (``retry-after-ms`` to the millisecond, which the official client prefers; ``Retry-After``
    in whole seconds). At most 10 s: a pace measured since creation overstates what is left
    early on (a job's first plans are its slowest), and a slot frees as soon as any job ends or
    is cancelled, so a client asks again rather than sleeping through it."""
    limit = ctx.config.limits.max_queued_jobs
    if needed > limit:  # can never fit: not worth a retry
        raise invalid("n", f"{needed} jobs can never fit a queue of {limit} (--max-queued-jobs)")
    waiting = [job for job in ctx.jobs.jobs() if not job.terminal]
    if len(waiting) + needed <= limit:
        return
    now = now_s if now_s is not None else time.time()
    estimates = [
        (now - job.created_at) * (1 - job.progress) / job.progress
        for job in waiting
        if 0 < job.progress < 1 and now > job.created_at
    ]
    wait_s = min(_MAX_RETRY_AFTER_S, max(0.5, min(estimates) if estimates else 2.0))
    raise OpenAIError(
        429,
        f"{len(waiting)} jobs are queued or running and {needed} more were asked for; "
        f"the limit is {limit} (--max-queued-jobs)",
        code="queue_full",
        headers={
            "Retry-After": str(max(1, round(wait_s))),
            "retry-after-ms": str(int(wait_s * 1000)),
        },
    )


def thumbnail_png(mp4: Path) -> bytes:
    """A PNG of the first frame of the MP4 at ``mp4`` (blocking: run it on a worker thread)."""
    import av

    with av.open(str(mp4)) as container:
        frame = next(container.decode(video=0))
        image = frame.to_image()
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
