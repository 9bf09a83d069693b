"""``/v1/sessions`` routes (docs/api.md "REST"): create, read, offer, inputs, feedback, fork/choose,
pause/resume, delete, and the SSE event stream.

Status codes: 201 created, 202 accepted (the two-phase ack follows on the event stream), 204
deleted, 400 malformed offer/audio, 401/403 auth, 404 unknown id, 409 the session's state
forbids it (the message names the state), 422 invalid body or an input the model cannot take
(naming the field), 501 LiveKit (the ``livekit`` extra is not installed), 503 +
``Retry-After`` when admission refuses. The domain's refusals (a state that forbids the
request, an input the model cannot take, a bad offer or audio upload) are
``runtime.errors.DreamrtError``s that carry their code and status: ``server.app``'s handler
answers them, the routes do not catch them. A ``livekit`` block joins the room in the background
(``server.livekit.participant``): a failed join makes the session ``failed``, after its 201.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from server.api.deps import AuthGrant, check_prompt, ctx_of, require_general
from server.edge import sse
from server.edge.auth import Grant
from server.edge.errors import ApiError, creation_errors, field_error
from server.edge.schemas import (
    ActionsBody,
    ChooseBody,
    FeedbackBody,
    ForkBody,
    LiveKitBody,
    OfferBody,
    Profile,
    PromptAccepted,
    PromptBody,
    RenderBody,
    SdpAnswer,
    SessionBody,
    SessionCreated,
)
from server.fleet.worker import write_session_manifest
from server.livekit.token import AVATAR_ATTRIBUTE, identity_for, mint_join_token, require_sdk
from server.media.webrtc import OfferError
from sessions.audio import decode_audio
from sessions.events import FeedbackRecorded
from sessions.host import Reject
from sessions.moments import render_moment
from sessions.resume import ResumeError
from sessions.session import PromptTooLongError, Session, SessionStateError
from sessions.store_rows import EventRow

if TYPE_CHECKING:
    from server.context import ServerContext

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/sessions")


def _live(request: Request, session_id: str, grant: Grant) -> Session:
    if not grant.allows_session(session_id):
        raise ApiError(403, "forbidden", f"this token does not grant session {session_id!r}")
    session = ctx_of(request).host.session(session_id)
    if session is None:
        raise ApiError(404, "not_found", f"no live session {session_id!r}")
    return session


async def _resumed(ctx: ServerContext, session_id: str, not_live: ApiError) -> Session:
    try:
        answer = await ctx.resumer.resume(session_id)
    except ResumeError as exc:
        log.info("session %s not resumed: %s", session_id, exc)
        raise not_live from None
    if isinstance(answer, Reject):
        raise _capacity(answer, f"no capacity to resume session {session_id!r}")
    return answer


def _capacity(reject: Reject, what: str) -> ApiError:
    retry = max(1, math.ceil(reject.retry_after_s))
    return ApiError(
        503,
        "capacity",
        f"{what}: {reject.reason} ({reject.detail})",
        headers={"Retry-After": str(retry)},
        reason=reject.reason,
        retry_after_s=retry,
        permanent=reject.permanent,
    )


@router.post("", status_code=201)
async def create_session(body: SessionBody, request: Request, grant: AuthGrant) -> SessionCreated:
    require_general(grant)
    ctx = ctx_of(request)
    check_prompt(request, "prompt", body.prompt)
    livekit_token = _livekit_token_check(ctx, body)
    with creation_errors():
        answer = ctx.host.create_session(
            prompt=body.prompt,
            model=body.model,
            fps=body.fps,
            width=body.width,
            height=body.height,
            seed=body.seed,
            priority_class=body.priority_class,
            start=body.start,
            adapters=tuple((a.name, a.strength) for a in body.adapters),
            decoder=body.decoder,
        )
    if isinstance(answer, Reject):
        raise _capacity(answer, "no capacity for another session")
    session = answer
    ctx.metrics.watch(session)  # time-to-steer histograms
    if body.livekit is not None:
        _join_room(ctx, session, body.livekit, livekit_token)
    token = ctx.auth.issue_session_token(session.id)
    if ctx.config.recording.snapshot_dir is not None:  # another engine of the fleet may resume it
        await asyncio.to_thread(write_session_manifest, ctx, session, token)
    config = session.config
    return SessionCreated(
        id=session.id,
        token=token,
        state=session.state.value,
        profile=Profile(fps=config.fps, width=config.width, height=config.height),
        decoder=config.decoder,
    )


def _livekit_token_check(ctx: ServerContext, body: SessionBody) -> str | None:
    """Before admission: 501 without the SDK, 422 when no token can be had for the room."""
    if body.livekit is None:
        return None
    require_sdk()  # LiveKitMissingError: 501
    if body.livekit.token is None and not ctx.livekit_credentials.complete:
        raise field_error(
            "livekit.token",
            "no token given and the server has no LiveKit API key/secret to mint one "
            "(dreamrt serve --livekit-key/--livekit-secret or LIVEKIT_API_KEY/LIVEKIT_API_SECRET)",
        )
    return body.livekit.token


def _join_room(ctx: ServerContext, session: Session, block: LiveKitBody, token: str | None) -> None:
    if token is None:
        attributes = {AVATAR_ATTRIBUTE: block.avatar_of} if block.avatar_of else None
        token = mint_join_token(
            ctx.livekit_credentials,
            room=block.room,
            identity=identity_for(session.id),
            name=session.config.model_id,
            attributes=attributes,
        )
    ctx.open_room(
        session,
        url=block.url,
        room=block.room,
        token=token,
        audio_identity=block.audio_identity,
        avatar_of=block.avatar_of,
    )


@router.get("/{session_id}")
async def get_session(session_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
    if not grant.allows_session(session_id):
        raise ApiError(403, "forbidden", f"this token does not grant session {session_id!r}")
    ctx = ctx_of(request)
    session = ctx.host.session(session_id)
    if session is not None:
        body = session.snapshot()
        room = ctx.rooms.get(session_id)
        if room is not None and room.avatar is not None:  # the speech's measured sync
            body["avatar"] = room.avatar.stats()
        return body
    row = await ctx.store.run(ctx.store.get_session, session_id)
    if row is None:
        raise ApiError(404, "not_found", f"no session {session_id!r}")
    stored: dict[str, object] = {
        key: row[key]
        for key in (
            "id",
            "state",
            "prompt",
            "segment",
            "frames_sent",
            "stalls",
            "fps_measured",
            "created_at",
            "error",
        )
    }
    return stored | {"model": row["model_id"]}


@router.post("/{session_id}/offer")
async def offer(session_id: str, body: OfferBody, request: Request, grant: AuthGrant) -> SdpAnswer:
    """Answers the viewer's offer; a session of the previous process that is not live here
    resumes from its last snapshot first, within the resume grace (``sessions.resume``)."""
    ctx = ctx_of(request)
    limit = ctx.config.limits.max_sdp_bytes
    if len(body.sdp) > limit:
        raise ApiError(
            413, "too_large", f"the offer's SDP is {len(body.sdp)} bytes; the limit is {limit}"
        )
    try:
        session = _live(request, session_id, grant)
    except ApiError as exc:
        if exc.status != 404:
            raise
        session = await _resumed(ctx, session_id, exc)
    session.latency.offer()
    previous = ctx.peers.get(session_id)
    if previous is not None:
        await previous.close()  # one viewer per session: the new offer replaces the old peer
    peer = ctx.open_peer(session)  # subscribes to the events first: the viewer sees "negotiating"
    try:
        session.begin_negotiation()
    except SessionStateError:  # a 409; the peer opened for it goes
        await peer.close()
        raise
    try:
        answer = await peer.answer(body.sdp)
    except OfferError as exc:  # a 400; the session and the peer are told first
        session.negotiation_failed(str(exc))
        await peer.close()
        raise
    session.latency.answered()
    return SdpAnswer(sdp=answer.sdp, type="answer")


@router.post("/{session_id}/prompt", status_code=202)
async def prompt(
    session_id: str, body: PromptBody, request: Request, grant: AuthGrant
) -> PromptAccepted:
    session = _live(request, session_id, grant)
    try:
        seq, applies_at = session.push_prompt(body.text, body.mode)
    except PromptTooLongError as exc:
        raise field_error("text", str(exc), code="prompt_too_long") from None
    return PromptAccepted(applies_at_chunk=applies_at, seq=seq)


@router.post("/{session_id}/actions", status_code=202)
async def actions(
    session_id: str, body: ActionsBody, request: Request, grant: AuthGrant
) -> dict[str, int]:
    session = _live(request, session_id, grant)
    return {"seq": session.push_action(body.keys, body.mouse)}


@router.post("/{session_id}/audio", status_code=202)
async def audio(session_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
    session = _live(request, session_id, grant)
    if "input.audio" not in session.config.capabilities:
        raise ApiError(
            422,
            "unsupported_input",
            f"model {session.config.model_id!r} does not accept audio "
            "(no 'input.audio' capability)",
        )
    limits = ctx_of(request).config.limits
    # server.edge.request_guard refuses a body over limits.max_audio_bytes before and while it is
    # read
    body = bytearray()
    async for part in request.stream():
        body += part
    clip = await asyncio.to_thread(
        decode_audio,
        bytes(body),
        content_type=request.headers.get("content-type", ""),
        max_seconds=limits.max_audio_seconds,
    )
    seq = session.push_audio(clip)
    return {"seq": seq, "seconds": round(clip.duration_s, 4)}


@router.post("/{session_id}/feedback", status_code=201)
async def feedback(
    session_id: str, body: FeedbackBody, request: Request, grant: AuthGrant
) -> dict[str, int]:
    session = _live(request, session_id, grant)
    store = ctx_of(request).store
    chunk = body.chunk if body.chunk is not None else max(session.last_chunk, 0)
    feedback_id = await store.run(
        store.add_feedback, session_id=session_id, rating=body.rating, chunk=chunk, note=body.note
    )
    session.publish(FeedbackRecorded(feedback_id=feedback_id, rating=body.rating, chunk=chunk))
    return {"id": feedback_id}


@router.post("/{session_id}/fork", status_code=201)
async def fork(
    session_id: str, body: ForkBody, request: Request, grant: AuthGrant
) -> dict[str, object]:
    """N candidate sessions from this session's state at its next chunk boundary
    (``sessions.forks``); 201 once the fork row is committed, 503 when they do not all fit."""
    session = _live(request, session_id, grant)
    check_prompt(request, "prompt", body.prompt)
    ctx = ctx_of(request)
    answer = await ctx.forks.fork(session, body.n, body.prompt, body.seeds)
    if isinstance(answer, Reject):
        raise _capacity(answer, f"no capacity for {body.n} fork candidates")
    config = session.config
    return {
        "candidates": list(answer.candidates),
        "sessions": [
            {
                "id": c.id,
                "token": ctx.auth.issue_session_token(c.id),
                "state": c.state.value,
                "seed": c.config.seed,
                "profile": {"fps": config.fps, "width": config.width, "height": config.height},
            }
            for c in answer.candidates.values()
        ],
        "context": answer.context_ref,
        "at_chunk": answer.at_chunk,
    }


@router.post("/{session_id}/render", status_code=202)
async def render(
    session_id: str, body: RenderBody, request: Request, grant: AuthGrant
) -> dict[str, object]:
    """Render a moment: the session's stream continued offline from its next chunk boundary
    for ``chunks`` more chunks, decoded by the full VAE into a job's MP4 (``sessions.moments``);
    the session goes on untouched."""
    session = _live(request, session_id, grant)
    ctx = ctx_of(request)
    program = {"preset": "render_moment", "session": session.id, "chunks": body.chunks}
    with creation_errors():
        job = await render_moment(ctx.host, ctx.jobs, program)
    moment = job.config.params["moment"]
    return {"id": job.id, "session": moment["session"], "at_chunk": moment["chunk"]}


@router.post("/{session_id}/choose", status_code=201)
async def choose(
    session_id: str, body: ChooseBody, request: Request, grant: AuthGrant
) -> dict[str, object]:
    """The chosen candidate's state continues this session; the others close; one preference
    pair per rejected candidate is committed before the 201."""
    session = _live(request, session_id, grant)
    chosen, pairs = await ctx_of(request).forks.choose(session, body.candidate)
    return {"chosen": chosen, "preferences": pairs}


@router.post("/{session_id}/pause", status_code=202)
async def pause(session_id: str, request: Request, grant: AuthGrant) -> dict[str, str]:
    session = _live(request, session_id, grant)
    session.pause()
    return {"state": session.state.value}


@router.post("/{session_id}/resume", status_code=202)
async def resume(session_id: str, request: Request, grant: AuthGrant) -> dict[str, str]:
    session = _live(request, session_id, grant)
    session.resume()
    return {"state": session.state.value}


@router.delete("/{session_id}", status_code=204)
async def delete(session_id: str, request: Request, grant: AuthGrant) -> Response:
    if not grant.allows_session(session_id):
        raise ApiError(403, "forbidden", f"this token does not grant session {session_id!r}")
    ctx = ctx_of(request)
    closed = await ctx.host.close_session(session_id)
    peer = ctx.peers.get(session_id)
    if peer is not None:
        await peer.close()  # after the session: its viewer receives "closing" and "closed"
    if not closed and await ctx.store.run(ctx.store.get_session, session_id) is None:
        raise ApiError(404, "not_found", f"no session {session_id!r}")
    return Response(status_code=204)


@router.get("/{session_id}/events")
async def events(session_id: str, request: Request, grant: AuthGrant) -> StreamingResponse:
    """Server-Sent Events: ``id`` = event id, ``event`` = type, ``data`` = the event's JSON.

    Replays what the stream retains after ``Last-Event-ID`` (or ``?after=``; default: from the
    start), then follows live events; ends when the session ends. A finished session replays
    its persisted events.
    """
    if not grant.allows_session(session_id):
        raise ApiError(403, "forbidden", f"this token does not grant session {session_id!r}")
    ctx = ctx_of(request)
    after = sse.after_id(request)
    session = ctx.host.session(session_id)
    if session is None:
        rows = await ctx.store.run(ctx.store.events, session_id)
        if not rows and await ctx.store.run(ctx.store.get_session, session_id) is None:
            raise ApiError(404, "not_found", f"no session {session_id!r}")
        return sse.response(sse.stored_frames(r for r in rows if r["event_id"] > after))
    limit = ctx.config.limits.max_sse_per_session
    if ctx.sse_streams[session_id] >= limit:
        raise ApiError(
            429,
            "too_many_streams",
            f"session {session_id!r} already has {limit} event streams open",
            headers={"Retry-After": str(int(sse.SSE_KEEPALIVE_S))},
        )
    subscription = session.events.subscribe(after_id=after)
    earlier: list[EventRow] = []
    first_id = session.events.first_id
    if after + 1 < first_id:  # resumed: what its previous process published is stored
        try:
            rows = await ctx.store.run(ctx.store.events, session_id)
        except BaseException:
            subscription.close()
            raise
        earlier = [r for r in rows if after < r["event_id"] < first_id]

    async def follow() -> AsyncIterator[bytes]:
        # counted from the first byte (a response never started holds nothing) to the end,
        # whichever way it ends: the session's end, a client gone mid-event, server shutdown
        ctx.sse_streams[session_id] += 1
        try:
            if ctx.sse_streams[session_id] > limit:  # two requests raced past the check
                return
            yield b"retry: 2000\n\n"
            for stored in sse.stored_frames(earlier):
                yield stored
            async for live in sse.live_frames(subscription):
                yield live
        finally:
            subscription.close()
            ctx.sse_streams[session_id] -= 1
            if ctx.sse_streams[session_id] <= 0:
                del ctx.sse_streams[session_id]

    return sse.response(follow())
