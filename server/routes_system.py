"""Routes that are not about one session or job: health, metrics, tokens, the web page.

Also the shared edge helpers: ``ApiError`` (an error the edge itself raises, a
``runtime.errors.DreamrtError`` like every domain error), ``error_response`` (the documented
body of any ``DreamrtError``: ``{"detail", "code", ...}``, a 422 naming the field in FastAPI's
own ``detail`` shape; ``server.app``'s one handler answers with it) and the ``authorize``
dependency.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from runtime.errors import DreamrtError
from server.auth import AuthError, Grant, is_loopback
from server.metrics import CONTENT_TYPE
from server.schemas import FaultBody, TokenBody, TokenIssued

if TYPE_CHECKING:
    from server.context import ServerContext

__all__ = [
    "ApiError",
    "AuthGrant",
    "authorize",
    "check_prompt",
    "ctx_of",
    "error_response",
    "faults_router",
    "field_error",
    "mount_web",
    "router",
]

router = APIRouter()
# only with ``dreamrt serve --fault-injection`` (server.app): absent from a normal server's schema
faults_router = APIRouter()


class ApiError(DreamrtError):
    """An error the edge raises: ``status``, a ``code`` and a human message, plus optional
    headers and further body members (``extra``, e.g. ``retry_after_s``)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        field: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message, code=code, status=status, field=field)
        self.headers = headers
        self.extra = extra  # body members, not DreamrtError's keywords (retry_after_s among them)


def field_error(field: str, message: str, *, code: str = "invalid_field") -> ApiError:
    """A 422 whose ``detail`` names ``field`` exactly like FastAPI's validation errors do."""
    return ApiError(422, code, message, field=field)


def error_response(exc: DreamrtError) -> JSONResponse:
    """The documented answer of ``exc`` (docs/api.md "REST", its errors paragraph): the body
    ``{"detail", "code", ...}``, ``detail`` FastAPI's list naming the field when ``exc``
    concerns one; ``Retry-After`` when it says when to retry."""
    message = str(exc.args[0]) if exc.args else exc.code
    detail: Any = message
    if exc.field is not None:
        detail = [{"loc": ["body", exc.field], "msg": message, "type": exc.code}]
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.retry_after_s is not None:
        headers.setdefault("Retry-After", str(max(1, math.ceil(exc.retry_after_s))))
    body = {"detail": detail, "code": exc.code, **exc.extra}
    return JSONResponse(body, status_code=exc.status, headers=headers or None)


@contextlib.contextmanager
def creation_errors() -> Iterator[None]:
    """An unknown model (the registry's ``KeyError``) while creating a session or job is a
    422 naming ``model``; what else the host refuses is a ``DreamrtError`` already."""
    try:
        yield
    except KeyError as exc:
        raise field_error("model", str(exc.args[0])) from None


def check_prompt(request: Request, field: str, text: str | None) -> None:
    """422 naming ``field`` when ``text`` is longer than the configured prompt limit."""
    limit = ctx_of(request).config.limits.max_prompt_chars
    if text is not None and len(text) > limit:
        raise field_error(
            field,
            f"prompt is {len(text)} characters; the limit is {limit}",
            code="prompt_too_long",
        )


def ctx_of(request: Request) -> ServerContext:
    ctx = getattr(request.app.state, "ctx", None)
    if ctx is None:
        raise ApiError(503, "starting", "the server is starting", headers={"Retry-After": "1"})
    return ctx


async def authorize(request: Request) -> Grant:
    """FastAPI dependency: the request's grant, or 401. On the event loop (no worker thread
    per request); a token not cached yet is looked up on the store's thread."""
    ctx = ctx_of(request)
    header = request.headers.get("authorization")
    try:
        grant = ctx.auth.authenticate(header, lookup=False)
        if grant is None:
            grant = await ctx.store.run(ctx.auth.authenticate, header)
        assert grant is not None  # with the store's lookup: a grant, or AuthError
        return grant
    except AuthError as exc:
        raise ApiError(
            exc.status, "unauthorized", str(exc), headers={"WWW-Authenticate": "Bearer"}
        ) from None


AuthGrant = Annotated[Grant, Depends(authorize)]


def require_general(grant: Grant) -> None:
    if not grant.allows_general():
        raise ApiError(403, "forbidden", f"a token of scope {grant.scope!r} cannot use this route")


@router.get("/healthz")
async def healthz(request: Request) -> Any:
    """Liveness: 200 whenever the process answers, ``status`` saying what it is doing."""
    ctx = getattr(request.app.state, "ctx", None)
    config = request.app.state.config
    failed = _start_failure(request)
    if failed is not None:
        return failed
    if ctx is None:  # loading the model or warming up (GET /readyz says how far)
        return {
            "status": "starting",
            "ready": False,
            "model": config.model.card or "default",
            "device": config.model.device,
        }
    draining = bool(request.app.state.draining)  # server.shutdown
    return {
        "status": "draining" if draining else "ok",
        "ready": not draining,
        "model": ctx.model_id,
        "device": ctx.device,
    }


@router.get(
    "/readyz",
    responses={503: {"description": "starting (with the warm-up's progress) or draining"}},
)
async def readyz(request: Request) -> Any:
    """Readiness: 200 once the compiled set is warm and the server takes sessions; 503 with
    ``Retry-After`` while it starts (the warm-up's progress) or drains."""
    ctx = getattr(request.app.state, "ctx", None)
    progress = getattr(request.app.state, "progress", None)
    body: dict[str, Any] = {} if progress is None else {"progress": progress.snapshot()}
    failed = _start_failure(request)
    if failed is not None:
        return failed
    if ctx is None:
        body = {"status": "starting", **body}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
    if request.app.state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return {"status": "ready", "model": ctx.model_id, "device": ctx.device, **body}


def _start_failure(request: Request) -> JSONResponse | None:
    """503 ``failed`` once a start failed (the server is stopping: ``server.lifespan``)."""
    error = getattr(request.app.state, "start_error", None)
    if error is None:
        return None
    return JSONResponse({"status": "failed", "error": str(error)}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    client = request.client.host if request.client is not None else ""
    ctx = ctx_of(request)
    if not is_loopback(client):
        require_general(await authorize(request))
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)


@router.post("/v1/tokens", status_code=201)
async def issue_token(body: TokenBody, request: Request, grant: AuthGrant) -> TokenIssued:
    if not grant.is_admin:
        raise ApiError(403, "forbidden", "issuing tokens needs the admin key or an admin token")
    token, expires_at = ctx_of(request).auth.issue(body.scope, body.ttl_s)
    return TokenIssued(token=token, scope=body.scope, expires_at=expires_at)


@faults_router.post("/v1/faults", status_code=202)
async def inject_fault(body: FaultBody, request: Request, grant: AuthGrant) -> dict[str, str]:
    """Arms a fault on the next denoising step of session or job ``target`` (admin only; a
    test and drill hook, runtime.faults)."""
    if not grant.is_admin:
        raise ApiError(403, "forbidden", "fault injection needs the admin key or an admin token")
    ctx = ctx_of(request)
    if ctx.engine.handle(body.target) is None:
        raise ApiError(404, "not_found", f"no running session or job {body.target!r}")
    assert ctx.faults is not None  # this router is mounted with the injector only
    ctx.faults.arm(body.target, body.kind)
    return {"target": body.target, "kind": body.kind}


def mount_web(app: FastAPI, web_dir: Path | None) -> None:
    """Serves the web client at ``/`` when its directory exists (mounted last: API routes win)."""
    if web_dir is not None and (web_dir / "index.html").exists():
        app.mount("/", StaticFiles(directory=web_dir, html=True), name="web")
