"""Server-Sent Events of sessions and jobs (docs/api.md "Events"): ``id`` = event id,
``event`` = type, ``data`` = the event's JSON; a client resumes after ``Last-Event-ID`` (or
``?after=``). Stored events replay from SQLite; live ones follow an ``EventStream``
subscription, with a keepalive comment while nothing happens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from server.edge.errors import ApiError
from sessions.events import encode_event
from sessions.store_rows import EventRow

__all__ = [
    "SSE_HEADERS",
    "SSE_KEEPALIVE_S",
    "after_id",
    "frame",
    "live_frames",
    "response",
    "stored_frames",
]

SSE_KEEPALIVE_S = 15.0
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event_id: int, event_type: str, data: bytes) -> bytes:
    """One SSE message."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event_id, event_type.encode(), data)


def after_id(request: Request) -> int:
    """The id a client has seen (``Last-Event-ID`` or ``?after=``; 0: none) -> int; 400 if it
    is not an event id."""
    after = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not after.isdigit():
        message = f"Last-Event-ID/after must be an event id, got {after!r}"
        raise ApiError(400, "bad_request", message)
    return int(after)


def stored_frames(rows: Iterable[EventRow]) -> list[bytes]:
    """Frames of stored event rows (``Store.events``), in their order."""
    return [frame(row["event_id"], row["type"], row["body"].encode()) for row in rows]


async def live_frames(subscription: Any) -> AsyncIterator[bytes]:
    """The subscription's events as frames until its stream closes; a keepalive comment every
    ``SSE_KEEPALIVE_S`` of silence. Closes the subscription however it ends."""
    try:
        while True:
            event = await subscription.next(SSE_KEEPALIVE_S)
            if event is None:
                if subscription.closed:
                    break
                yield b": keepalive\n\n"
                continue
            tag = str(type(event).__struct_config__.tag)  # every event's is its type name
            yield frame(event.event_id, tag, encode_event(event))
    finally:
        subscription.close()


def response(frames: AsyncIterator[bytes] | Iterable[bytes]) -> StreamingResponse:
    """The ``text/event-stream`` response of ``frames``."""
    return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
