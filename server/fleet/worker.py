"""An engine's membership of a fleet on NVIDIA Dynamo's distributed runtime (``--fleet NS``).

Dynamo orchestrates; dreamrt stays the engine. ``dreamrt serve --fleet NS`` joins a Dynamo
``DistributedRuntime`` (discovery ``file`` on one machine, ``etcd`` or ``kubernetes`` across
nodes; the TCP request plane; the ZMQ event plane, so neither NATS nor etcd is needed on one
machine) and serves three endpoints of component ``engine`` in namespace ``NS``, one instance
per engine (the three share the runtime's instance id):

    NS.engine.card    -> the DeploymentCard (server.fleet.deployment), i.e. the load it publishes
    NS.engine.health  -> {"status": "ok" | "draining", "engine_id"}
    NS.engine.place   {"kind": "session" | "job" | "video", "body": {...}}   a POST
                      /v1/sessions, /v1/jobs or /v1/videos (JSON) body, answered exactly as
                      this engine's REST API answers it
                      {"kind": "resume", "session_id": id}          resume a session of a dead
                      engine from shared storage (sessions.handoff), same id and token
                   -> {"status": http status, "body": {...}, "retry_after_s"?, "engine_id", "url"}

A place of a session or job goes through the engine's own REST API on loopback (admin
token of this worker), so validation, admission and the answer are the engine's — the router
learns nothing it would have to keep. A drain (``POST /v1/deployment/drain``) marks the card
``draining`` (nothing new is placed here) and unregisters once the last session has ended; a
shutdown unregisters first, before anything stops (the router then resumes the sessions that
were live here elsewhere); a killed engine disappears when its discovery lease expires (file
discovery: about 10 s after the last keep-alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

import httpx

from runtime.task_set import TaskSet
from server.fleet.context import FleetContext
from server.fleet.deployment import deployment_card
from server.fleet.dynamo_runtime import (
    DynamoEndpoint,
    DynamoRuntime,
    EndpointHandler,
    dynamo_runtime,
)
from sessions.handoff import (
    HandoffError,
    SessionManifest,
    load_resume,
    read_manifest,
    write_manifest,
)
from sessions.host import Reject
from sessions.served_models import SESSION_LOOP
from sessions.session import Session

__all__ = ["ENDPOINTS", "FleetWorker", "write_session_manifest"]

log = logging.getLogger(__name__)

COMPONENT = "engine"
ENDPOINTS = ("card", "health", "place")
_PLACE_TIMEOUT_S = 30.0
_PLACE_ROUTES = {"session": "/v1/sessions", "job": "/v1/jobs", "video": "/v1/videos"}


def write_session_manifest(ctx: FleetContext, session: Session, token: str) -> None:
    """Shared storage learns what resuming ``session`` elsewhere needs (``--snapshot-dir``)."""
    from server.edge.auth import SESSION_TOKEN_TTL_S, token_digest

    config = session.config
    manifest = SessionManifest(
        session_id=session.id,
        model_id=config.model_id,
        prompt=config.prompt,
        seed=config.seed,
        fps=config.fps,
        width=config.width,
        height=config.height,
        priority_class=config.priority_class,
        token_sha256=token_digest(token),
        token_expires_at=session.created_at + SESSION_TOKEN_TTL_S,
        engine_id=ctx.engine_id,
    )
    snapshot_dir = ctx.config.recording.snapshot_dir
    assert snapshot_dir is not None  # the caller writes manifests only with --snapshot-dir
    write_manifest(snapshot_dir, manifest)


class FleetWorker:
    """See the module docstring. ``start()`` registers, ``close()`` unregisters (idempotent)."""

    def __init__(self, ctx: FleetContext) -> None:
        self._ctx = ctx
        self._runtime: DynamoRuntime | None = None
        self._endpoints: dict[str, DynamoEndpoint] = {}
        self._tasks = TaskSet()  # the endpoints' servers and the drain
        self._http: httpx.AsyncClient | None = None
        self.instance_id: int | None = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = self._ctx.config
        self._runtime = runtime = dynamo_runtime(config.fleet.discovery, config.fleet.discovery_dir)
        headers = {}
        if self._ctx.auth.mode.value == "token":  # this worker's own way into the REST API
            token, _ = self._ctx.auth.issue("admin", 30 * 24 * 3600.0)
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=_loopback_url(config.host, config.port),
            headers=headers,
            timeout=_PLACE_TIMEOUT_S,
        )
        handlers: dict[str, EndpointHandler] = {
            "card": self._card,
            "health": self._health,
            "place": self._place,
        }
        for name in ENDPOINTS:
            endpoint = runtime.endpoint(f"{config.fleet.namespace}.{COMPONENT}.{name}")
            self._endpoints[name] = endpoint
            self._tasks.spawn(self._serve(name, endpoint, handlers[name]), f"dreamrt-fleet-{name}")
        self.instance_id = self._endpoints["card"].connection_id()
        log.info(
            "joined fleet %r as engine %s (Dynamo instance %x, %s)",
            config.fleet.namespace,
            self._ctx.engine_id,
            self.instance_id,
            self._ctx.public_url,
        )

    async def _serve(self, name: str, endpoint: DynamoEndpoint, handler: EndpointHandler) -> None:
        try:
            await endpoint.serve_endpoint(handler, graceful_shutdown=False)
        except asyncio.CancelledError:
            raise
        except Exception:  # the engine goes on serving REST; the fleet no longer sees it
            log.exception("fleet endpoint %s stopped", name)

    def drain(self) -> None:
        """Leave the fleet once this engine's last session has ended (``ctx.draining`` is set:
        the card says so and nothing new is placed here meanwhile). Idempotent."""
        if self._drain is None and self._runtime is not None:
            self._drain = self._tasks.spawn(self._leave_when_idle(), "dreamrt-fleet-drain")

    async def _leave_when_idle(self) -> None:
        while any(not s.terminal for s in self._ctx.host.sessions()):
            await asyncio.sleep(0.5)
        await self._unregister()
        log.info(
            "drained: engine %s left fleet %r",
            self._ctx.engine_id,
            self._ctx.config.fleet.namespace,
        )

    async def _unregister(self) -> None:
        for endpoint in self._endpoints.values():
            with contextlib.suppress(Exception):
                await endpoint.unregister_endpoint_instance()

    async def close(self) -> None:
        """Unregister every endpoint, then stop the runtime. Idempotent."""
        if self._runtime is None:
            return
        runtime, self._runtime = self._runtime, None
        await self._unregister()
        runtime.shutdown()
        await self._tasks.close()
        if self._http is not None:
            await self._http.aclose()
        log.info("left fleet %r", self._ctx.config.fleet.namespace)

    # ------------------------------------------------------------------ endpoint handlers

    async def _card(
        self, request: object, context: object = None
    ) -> AsyncIterator[dict[str, object]]:
        yield deployment_card(self._ctx)

    async def _health(
        self, request: object, context: object = None
    ) -> AsyncIterator[dict[str, object]]:
        status = "draining" if self._ctx.draining else "ok"
        yield {"status": status, "engine_id": self._ctx.engine_id}

    async def _place(
        self, request: object, context: object = None
    ) -> AsyncIterator[dict[str, object]]:
        answer = await self.place(request if isinstance(request, dict) else {})
        yield {**answer, "engine_id": self._ctx.engine_id, "url": self._ctx.public_url}

    async def place(self, request: Mapping[str, object]) -> dict[str, object]:
        kind = request.get("kind")
        if self._ctx.draining:
            return _refused(503, "draining", "this engine is leaving the fleet", retry_after_s=1)
        if kind in _PLACE_ROUTES:
            route = _PLACE_ROUTES[kind]
            assert self._http is not None  # made by start, before the endpoints serve
            response = await self._http.post(route, json=request.get("body") or {})
            answer: dict[str, object] = {"status": response.status_code, "body": response.json()}
            if "retry-after" in response.headers:
                answer["retry_after_s"] = float(response.headers["retry-after"])
            return answer
        if kind == "resume":
            return await self._resume(str(request.get("session_id", "")))
        return _refused(
            422, "invalid_field", f"kind must be session, job, video or resume, not {kind!r}"
        )

    async def _resume(self, session_id: str) -> dict[str, object]:
        ctx = self._ctx
        if ctx.config.recording.snapshot_dir is None:
            return _refused(409, "no_snapshot_dir", "this engine has no --snapshot-dir")
        if ctx.host.session(session_id) is not None:  # asked twice: it is here already
            return {"status": 200, "body": {"id": session_id, "resumed": False}}
        try:
            served = ctx.host.models.resolve(
                read_manifest(ctx.config.recording.snapshot_dir, session_id).model_id
            )
            resume = await asyncio.to_thread(
                load_resume,
                ctx.config.recording.snapshot_dir,
                session_id,
                served.loop(SESSION_LOOP),
                device=getattr(served, "device", None),
            )
        except (HandoffError, KeyError, ValueError) as exc:
            return _refused(404, "not_resumable", str(exc))
        m = resume.manifest
        if ctx.host.session(session_id) is not None:  # a second resume won the race meanwhile
            return {"status": 200, "body": {"id": session_id, "resumed": False}}
        state = resume.state
        answer = ctx.host.create_session(
            prompt=getattr(state, "active_prompt", "") or m.prompt,
            model=m.model_id,
            fps=m.fps,
            width=m.width,
            height=m.height,
            seed=m.seed,
            priority_class=m.priority_class,
            session_id=session_id,
            resume=state,
        )
        if isinstance(answer, Reject):  # capacity is a value
            return _refused(
                503,
                "capacity",
                f"no capacity to resume {session_id}: {answer.reason}",
                retry_after_s=max(1.0, answer.retry_after_s),
            )
        ctx.metrics.watch(answer)
        ctx.auth.adopt(m.token_sha256, f"session:{session_id}", m.token_expires_at)
        log.info(
            "session %s resumed here from step %d (was on %s)", session_id, resume.step, m.engine_id
        )
        profile = {"fps": m.fps, "width": m.width, "height": m.height}
        body = {"id": session_id, "state": answer.state.value, "profile": profile, "resumed": True}
        return {"status": 201, "body": body}


def _refused(status: int, code: str, message: str, **extra: float) -> dict[str, object]:
    return {"status": status, "body": {"detail": message, "code": code}, **extra}


def _loopback_url(host: str, port: int) -> str:
    """How this process reaches its own REST API (a wildcard bind answers on loopback)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
