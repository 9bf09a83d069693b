"""Routes that are not about one session or job: health, metrics, tokens, profiling, fault
injection, the web page.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from server.api.deps import AuthGrant, authorize, ctx_of, require_general
from server.edge.auth import is_loopback
from server.edge.errors import ApiError
from server.edge.schemas import FaultBody, ProfileBody, TokenBody, TokenIssued
from server.ops.metrics import CONTENT_TYPE
from server.ops.trace import TraceBusy, capture

__all__ = ["faults_router", "mount_web", "router"]

router = APIRouter()
# only with ``dreamrt serve --fault-injection`` (server.app): absent from a normal server's schema
faults_router = APIRouter()


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
    draining = bool(request.app.state.draining)  # server.ops.shutdown
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


@router.post("/v1/profile")
async def profile(body: ProfileBody, request: Request, grant: AuthGrant) -> dict[str, Any]:
    """A torch-profiler trace of the executor's batches for ``seconds`` of serving, written
    under ``DATA_DIR/traces/``, and where the time went (admin only; server.ops.trace)."""
    if not grant.is_admin:
        raise ApiError(403, "forbidden", "profiling needs the admin key or an admin token")
    ctx = ctx_of(request)
    assert ctx.trace is not None  # every server built by server.app has one
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = ctx.config.data_dir / "traces" / f"trace-{stamp}-{time.monotonic_ns() % 10**6}.json"
    try:
        return await capture(ctx.trace, body.seconds, path)
    except TraceBusy as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except TimeoutError:
        raise ApiError(
            409, "conflict", "the executor ran nothing to trace: profile while sessions or jobs run"
        ) from None


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
