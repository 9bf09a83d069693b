"""``dreamrt router --fleet NS``: the fleet's front door, on Dynamo's client (docs/api.md "Fleet").

A separate product process that imports no model, runtime or session code: it validates the
same bodies as an engine (``server.edge.schemas``), asks ``server.router.fleet_view`` to place them
on the
engine with the most headroom, and answers with that engine's own answer plus where it is::

    POST /v1/sessions   -> 201 {"id", "token", "state", "profile", "engine_id", "url"}
    POST /v1/jobs       -> 202 {"id", "engine_id", "url"}
    POST /v1/videos     -> 200 the engine's video object + "engine_id", "url" (placed as a t2v job)
    GET  /v1/sessions/{id} -> {"id", "engine_id", "url", "instance_id"} (where it lives now)
    GET  /v1/fleet      -> {"namespace", "engines": [{"instance_id", "card"}], "orphans"}
    GET  /healthz       -> {"status": "ok", "engines": n}

The client then talks to that engine directly (``url``): offer, inputs, events. WebRTC media
never pass through the router. 503 + ``Retry-After`` when no engine has room (the engines'
shortest ``Retry-After``). ``--key KEY`` (or ``$DREAMRT_ROUTER_KEY``) makes ``/v1`` routes ask
for ``Authorization: Bearer KEY``; the session token in the answer is the engine's.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile  # what a parsed form holds

from server.edge.schemas import JobBody, SessionBody
from server.fleet.dynamo_runtime import dynamo_runtime
from server.openai.errors import OpenAIError, OpenAIErrorBodies, invalid
from server.openai.schemas import VIDEO_REQUEST_BODY, read_video_body
from server.router.fleet_view import FleetView

__all__ = ["RouterConfig", "create_router_app"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """What ``dreamrt router`` can set."""

    fleet: str
    host: str = "127.0.0.1"
    port: int = 8080
    discovery: str | None = None  # file | etcd | kubernetes; None: $DYN_DISCOVERY_BACKEND, file
    fleet_dir: str | None = None  # file discovery's directory; None: $DYN_FILE_KV
    key: str | None = None  # bearer key of the /v1 routes; None: open (loopback use)
    poll_s: float = 1.0


def _answer(answer: dict[str, Any]) -> JSONResponse:
    status = int(answer.get("status", 502))
    body = dict(answer.get("body") or {})
    headers = {}
    if status < 300:
        body |= {"engine_id": answer.get("engine_id"), "url": answer.get("url")}
    elif "retry_after_s" in answer:
        headers["Retry-After"] = str(max(1, math.ceil(float(answer["retry_after_s"]))))
    return JSONResponse(body, status_code=status, headers=headers)


def create_router_app(config: RouterConfig) -> FastAPI:
    """The router app; its lifespan joins the Dynamo runtime and watches the fleet."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = dynamo_runtime(config.discovery, config.fleet_dir)
        view = FleetView(runtime, config.fleet, poll_s=config.poll_s)
        await view.start()
        app.state.view = view
        log.info("dreamrt router for fleet %r: %d engines on start", config.fleet, len(view.cards))
        try:
            yield
        finally:
            await view.close()
            runtime.shutdown()
            log.info("dreamrt router stopped")

    def authorize(request: Request) -> None:
        if config.key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[len("Bearer ") :].strip() if header.startswith("Bearer ") else ""
        if not hmac.compare_digest(given.encode(), config.key.encode()):
            raise _Unauthorized()

    app = FastAPI(title="dreamrt router", version="0.1.0", lifespan=lifespan)
    guarded = [Depends(authorize)]

    app.add_middleware(OpenAIErrorBodies)  # /v1/videos answers errors in OpenAI's shape

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: _Unauthorized) -> JSONResponse:
        body = {"detail": "missing or wrong router key", "code": "unauthorized"}
        return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.get("/healthz")
    def healthz(request: Request) -> dict[str, object]:
        return {"status": "ok", "engines": len(request.app.state.view.cards)}

    @app.post("/v1/sessions", dependencies=guarded)
    async def create_session(body: SessionBody, request: Request) -> JSONResponse:
        payload = body.model_dump(by_alias=True, exclude_none=True)
        answer, _ = await request.app.state.view.place("session", payload)
        return _answer(answer)

    @app.post("/v1/jobs", dependencies=guarded)
    async def create_job(body: JobBody, request: Request) -> JSONResponse:
        payload = body.model_dump(by_alias=True, exclude_none=True)
        answer, _ = await request.app.state.view.place("job", payload)
        return _answer(answer)

    @app.post("/v1/videos", dependencies=guarded, openapi_extra=VIDEO_REQUEST_BODY)
    async def create_video(request: Request) -> JSONResponse:
        body = await read_video_body(request)
        if isinstance(body.input_reference, UploadFile):  # the place endpoint carries JSON
            raise invalid(
                "input_reference",
                "the fleet router does not forward uploads (and no card conditions on an image)",
                code="unsupported_parameter",
            )
        answer, _ = await request.app.state.view.place("video", body.model_dump(exclude_none=True))
        return _answer(answer)

    @app.get("/v1/sessions/{session_id}", dependencies=guarded)
    def locate(session_id: str, request: Request) -> JSONResponse:
        view: FleetView = request.app.state.view
        where = view.locate(session_id)
        if where is not None:
            return JSONResponse(where)
        if session_id in view.orphans:  # its engine died; being re-placed
            body = {"detail": f"session {session_id!r} is being re-placed", "code": "moving"}
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        body = {"detail": f"no engine of the fleet has session {session_id!r}", "code": "not_found"}
        return JSONResponse(body, status_code=404)

    @app.get("/v1/fleet", dependencies=guarded)
    def fleet(request: Request) -> dict[str, object]:
        view: FleetView = request.app.state.view
        engines = [{"instance_id": i, "card": c} for i, c in sorted(view.cards.items())]
        return {
            "namespace": view.namespace,
            "placement": view.placement.name,
            "engines": engines,
            "orphans": sorted(view.orphans),
        }

    return app


class _Unauthorized(Exception):
    pass
