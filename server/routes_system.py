"""Routes that are not about one session or job: health, metrics, tokens, the web page.

Also the shared edge helpers: ``ApiError`` (an error answer with a machine-readable ``code``;
422s name the field in FastAPI's own ``detail`` shape) and the ``authorize`` dependency.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.staticfiles import StaticFiles

from server.auth import AuthError, Grant, is_loopback
from server.metrics import CONTENT_TYPE
from server.schemas import FaultBody, TokenBody, TokenIssued

__all__ = [
    "ApiError",
    "AuthGrant",
    "authorize",
    "check_prompt",
    "ctx_of",
    "faults_router",
    "field_error",
    "mount_web",
    "router",
]

router = APIRouter()
# only with ``dreamrt serve --fault-injection`` (server.app): absent from a normal server's schema
faults_router = APIRouter()


class ApiError(Exception):
    """An error answer: ``status``, a ``code`` and a human message (plus optional headers)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        detail: Any = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self._detail = detail
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {
            "detail": self._detail if self._detail is not None else self.message,
            "code": self.code,
            **self.extra,
        }


def field_error(field: str, message: str, *, code: str = "invalid_field") -> ApiError:
    """A 422 whose ``detail`` names ``field`` exactly like FastAPI's validation errors do."""
    return ApiError(
        422, code, message, detail=[{"loc": ["body", field], "msg": message, "type": code}]
    )


@contextlib.contextmanager
def creation_errors() -> Iterator[None]:
    """Maps what the host refuses while creating a session or job to 422s naming the field:
    an unknown model, a profile the card cannot serve, a task the card does not offer; and a
    model that takes no new work for now (a weight sync, a sleep) to 503 + Retry-After."""
    from models.card import ProfileError
    from sessions.served_models import ModelUnavailableError, UnsupportedTaskError

    try:
        yield
    except ModelUnavailableError as exc:
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        raise ApiError(503, "unavailable", str(exc), headers={"Retry-After": retry}) from None
    except KeyError as exc:
        raise field_error("model", str(exc.args[0])) from None
    except (ProfileError, UnsupportedTaskError) as exc:
        raise field_error(exc.field, str(exc)) from None


def check_prompt(request: Request, field: str, text: str | None) -> None:
    """422 naming ``field`` when ``text`` is longer than the configured prompt limit."""
    limit = ctx_of(request).config.limits.max_prompt_chars
    if text is not None and len(text) > limit:
        raise field_error(
            field,
            f"prompt is {len(text)} characters; the limit is {limit}",
            code="prompt_too_long",
        )


def ctx_of(request: Request) -> Any:
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
        return grant
    except AuthError as exc:
        raise ApiError(
            exc.status, "unauthorized", exc.message, headers={"WWW-Authenticate": "Bearer"}
        ) from None


AuthGrant = Annotated[Grant, Depends(authorize)]


def require_general(grant: Grant) -> None:
    if not grant.allows_general():
        raise ApiError(403, "forbidden", f"a token of scope {grant.scope!r} cannot use this route")


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, str]:
    ctx = getattr(request.app.state, "ctx", None)
    config = request.app.state.config
    if ctx is None:
        return {"status": "starting", "model": config.model or "default", "device": config.device}
    status = "draining" if request.app.state.draining else "ok"  # server.shutdown
    return {"status": status, "model": ctx.model_id, "device": ctx.device}


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
    ctx.faults.arm(body.target, body.kind)
    return {"target": body.target, "kind": body.kind}


def mount_web(app: FastAPI, web_dir: Path | None) -> None:
    """Serves the web client at ``/`` when its directory exists (mounted last: API routes win)."""
    if web_dir is not None and (web_dir / "index.html").exists():
        app.mount("/", StaticFiles(directory=web_dir, html=True), name="web")
