"""WHEP routes (docs/api.md "WHEP"): playback for any standard WebRTC player.

- ``POST /whep/{model}?prompt=&seed=&fps=``: creates a session of ``model`` (a served card;
  404 otherwise) from the query and answers the offer; the session ends with the resource.
- ``POST /v1/sessions/{id}/whep``: a viewer of an existing session (one viewer per session:
  it replaces the previous one, like ``POST .../offer``); the session outlives the resource.
- ``DELETE /whep/resource/{rid}`` ends the viewer (and a session WHEP created) → 200.
- ``PATCH`` on a resource → 405: no trickle ICE, no ICE restart (the answer is complete).
- ``OPTIONS`` on each of them: the CORS preflight (``Access-Control-Allow-*``), 204.

Both ``POST``s take ``Content-Type: application/sdp`` (else 415; over ``--max-sdp-bytes``
413) and answer ``201 Created`` with the SDP answer, ``Location`` (the resource), ``ETag``,
one ``Link: <url>; rel="ice-server"`` per advertised ICE server (``server.media.turn_credentials``:
short-lived TURN credentials when ``--turn-secret`` is set) and ``Dreamrt-Session-Id``. Auth
is the ``/v1`` bearer scheme: a user or admin token for ``/whep/{model}``, the session's token
also for the others. Errors are the JSON of the REST API, with the CORS headers too, so a
page on another origin can read them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from server.api.deps import authorize, ctx_of, require_general
from server.edge.errors import ApiError, creation_errors, field_error
from server.media.turn_credentials import TurnCredentials, advertised_ice_servers, link_header
from server.media.webrtc import OfferError
from server.media.whep import WhepResource, WhepResources
from sessions.host import Reject
from sessions.session import Session, SessionStateError

if TYPE_CHECKING:
    from server.context import ServerContext

__all__ = ["RESOURCE_PREFIX", "router", "resources_of"]

router = APIRouter()

RESOURCE_PREFIX = "/whep/resource/"
SDP_TYPE = "application/sdp"
_EXPOSED = "Location, ETag, Link, Dreamrt-Session-Id, Accept-Patch"
_ALLOW_HEADERS = "Authorization, Content-Type, If-Match"


def _cors(methods: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": "*",
        "Access-Control-Allow-Methods": methods,
        "Access-Control-Allow-Headers": _ALLOW_HEADERS,
        "Access-Control-Expose-Headers": _EXPOSED,
        "Access-Control-Max-Age": "600",
    }


_ENDPOINT_METHODS = "POST, OPTIONS"
_RESOURCE_METHODS = "DELETE, PATCH, OPTIONS"


@contextlib.contextmanager
def _with_cors(methods: str) -> Iterator[None]:
    """Error answers carry the CORS headers too (a cross-origin player reads their JSON)."""
    try:
        yield
    except ApiError as exc:
        exc.headers = {**_cors(methods), **(exc.headers or {})}
        raise


def resources_of(request: Request) -> WhepResources:
    """The server's WHEP registry (made on first use, beside the server context)."""
    ctx = ctx_of(request)
    registry = getattr(ctx, "whep", None)
    if registry is None:
        registry = ctx.whep = WhepResources(ctx.host, ctx.peers.get)
    return registry


# ---------------------------------------------------------------- preflight


# preflights carry no credentials (CORS): unauthenticated, and not part of the API schema
@router.options("/whep/{model}", include_in_schema=False)
@router.options("/v1/sessions/{session_id}/whep", include_in_schema=False)
async def endpoint_preflight() -> Response:
    return Response(status_code=204, headers=_cors(_ENDPOINT_METHODS) | {"Accept-Post": SDP_TYPE})


@router.options(RESOURCE_PREFIX + "{resource_id}", include_in_schema=False)
async def resource_preflight() -> Response:
    return Response(status_code=204, headers=_cors(_RESOURCE_METHODS))


# ---------------------------------------------------------------- playback


@router.post("/whep/{model}")
async def play_new_session(model: str, request: Request) -> Response:
    with _with_cors(_ENDPOINT_METHODS):
        ctx = ctx_of(request)
        if getattr(request.app.state, "draining", False):
            raise ApiError(
                503, "shutting_down", "the server is shutting down", headers={"Retry-After": "10"}
            )
        grant = await authorize(request)
        require_general(grant)
        sdp = await _offer_sdp(request)
        if model not in ctx.host.models:
            raise ApiError(404, "not_found", f"no WHEP endpoint for model {model!r}: not served")
        session = _create_session(ctx, model, request)
        try:
            return await _answer(request, session, sdp, owns_session=True)
        except BaseException:
            await ctx.host.close_session(session.id, "whep offer refused")
            raise


@router.post("/v1/sessions/{session_id}/whep")
async def play_session(session_id: str, request: Request) -> Response:
    with _with_cors(_ENDPOINT_METHODS):
        ctx = ctx_of(request)
        grant = await authorize(request)
        if not grant.allows_session(session_id):
            raise ApiError(403, "forbidden", f"this token does not grant session {session_id!r}")
        sdp = await _offer_sdp(request)
        session = ctx.host.session(session_id)
        if session is None:
            raise ApiError(404, "not_found", f"no live session {session_id!r}")
        return await _answer(request, session, sdp, owns_session=False)


@router.delete(RESOURCE_PREFIX + "{resource_id}")
async def stop(resource_id: str, request: Request) -> Response:
    with _with_cors(_RESOURCE_METHODS):
        resource = await _resource(request, resource_id)
        await resources_of(request).end(resource)
        return Response(status_code=200, headers=_cors(_RESOURCE_METHODS))


@router.patch(RESOURCE_PREFIX + "{resource_id}")
async def patch(resource_id: str, request: Request) -> Response:
    with _with_cors(_RESOURCE_METHODS):
        await _resource(request, resource_id)
        raise ApiError(
            405,
            "method_not_allowed",
            "this server supports neither trickle ICE nor ICE restarts: the answer already "
            "holds every candidate; to restart, DELETE this resource and POST a new offer",
            headers={"Allow": "DELETE, OPTIONS"},
        )


# ---------------------------------------------------------------- helpers


async def _offer_sdp(request: Request) -> str:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != SDP_TYPE:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"a WHEP offer is Content-Type: {SDP_TYPE}, got {content_type or 'none'!r}",
            headers={"Accept-Post": SDP_TYPE},
        )
    body = await request.body()
    limit = ctx_of(request).config.limits.max_sdp_bytes
    if len(body) > limit:
        raise ApiError(
            413, "too_large", f"the offer's SDP is {len(body)} bytes; the limit is {limit}"
        )
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "bad_offer", "the offer is not UTF-8 text") from None


def _query_int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError(
            422,
            "invalid_field",
            f"query parameter {name!r} must be an integer, got {raw!r}",
            detail=[{"loc": ["query", name], "msg": "not an integer", "type": "int_parsing"}],
        ) from None


def _create_session(ctx: ServerContext, model: str, request: Request) -> Session:
    card = ctx.host.models[model].card
    prompt = request.query_params.get("prompt") or next(iter(card.ui.examples), "")
    limit = ctx.config.limits.max_prompt_chars
    if len(prompt) > limit:
        raise field_error(
            "prompt",
            f"prompt is {len(prompt)} characters; the limit is {limit}",
            code="prompt_too_long",
        )
    with creation_errors():
        answer = ctx.host.create_session(
            prompt=prompt,
            model=model,
            fps=_query_int(request, "fps"),
            seed=_query_int(request, "seed"),
        )
    if isinstance(answer, Reject):
        retry = max(1, math.ceil(answer.retry_after_s))
        raise ApiError(
            503,
            "capacity",
            f"no capacity for another session: {answer.reason} ({answer.detail})",
            headers={"Retry-After": str(retry)},
            reason=answer.reason,
            retry_after_s=retry,
            permanent=answer.permanent,
        )
    ctx.metrics.watch(answer)
    return answer


async def _answer(request: Request, session: Session, sdp: str, *, owns_session: bool) -> Response:
    """The offer answered by a new viewer peer of ``session``, as a 201 resource."""
    ctx = ctx_of(request)
    registry = resources_of(request)
    session.latency.offer()
    previous = ctx.peers.get(session.id)
    if previous is not None:
        registry.hand_over(session.id)  # a session WHEP made outlives its replaced viewer
        await previous.close()  # one viewer per session: this offer replaces the old peer
    peer = ctx.open_peer(session)
    try:
        session.begin_negotiation()
    except SessionStateError as exc:
        await peer.close()
        raise ApiError(409, "conflict", str(exc)) from None
    try:
        answer = await peer.answer(sdp)
    except OfferError as exc:
        session.negotiation_failed(str(exc))
        await peer.close()
        raise ApiError(400, "bad_offer", str(exc)) from None
    session.latency.answered()
    resource = registry.add(session, peer, owns_session=owns_session, answer_sdp=answer.sdp)
    return _created(request, resource, answer.sdp)


def _created(request: Request, resource: WhepResource, answer_sdp: str) -> Response:
    config = ctx_of(request).config
    turn = (
        TurnCredentials(config.turn_secret, ttl_s=config.turn_ttl_s) if config.turn_secret else None
    )
    specs = config.client_ice_servers or config.ice_servers
    response = Response(
        answer_sdp,
        status_code=201,
        media_type=SDP_TYPE,
        headers={
            **_cors(_ENDPOINT_METHODS),
            "Location": RESOURCE_PREFIX + resource.id,
            "ETag": resource.etag,
            "Dreamrt-Session-Id": resource.session.id,
        },
    )
    for server in advertised_ice_servers(specs, turn, user=resource.session.id):
        response.headers.append("Link", link_header(server))
    return response


async def _resource(request: Request, resource_id: str) -> WhepResource:
    grant = await authorize(request)
    resource = resources_of(request).get(resource_id)
    if resource is None:
        raise ApiError(404, "not_found", f"no WHEP resource {resource_id!r} (ended or unknown)")
    if not grant.allows_session(resource.session.id):
        raise ApiError(
            403, "forbidden", f"this token does not grant session {resource.session.id!r}"
        )
    return resource
