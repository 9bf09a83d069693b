"""Graceful shutdown on SIGTERM: stop admitting, snapshot, tell the peers, close, exit 0.

``GracefulServer`` is the uvicorn server of ``dreamrt serve``. On SIGTERM it does not stop
the listener at once; it runs ``drain`` on the event loop first, then lets uvicorn stop (the
lifespan teardown closes engine, recording writer and store, ``server.app``):

1. ``app.state.draining``: every ``/v1`` request answers 503 ``shutting_down`` with
   ``Retry-After`` (``server.edge.request_guard``), ``/healthz`` says ``draining``;
2. a snapshot of every live session at its next chunk boundary (a paused loop is advanced to
   it) and of every running job at its next step boundary, written like the periodic replay
   snapshots (``sessions.resume.snapshot_loop``), and a resume marker per session snapshotted;
   jobs are stopped without ending them (``JobHost.suspend``: the next process resumes them);
3. every session closes with the reason ``shutdown``: its peers read ``session.state``
   ``closing`` (reason ``shutdown``) then ``closed`` on the data channel and SSE, then their
   connections close.

All of it within ``timeout_s`` (``--shutdown-timeout``, default 10 s): the snapshots get 60 %
of it (a session or job that reaches no boundary in time resumes from its previous snapshot),
the rest goes to closing; a watchdog ends the process with exit code 1 if it is still alive
``timeout_s`` plus 5 s after the signal. A second SIGTERM or a SIGINT stops at once (uvicorn's
own handling: sessions closed, jobs cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

from sessions.resume import snapshot_loop, write_marker

__all__ = ["GracefulServer", "drain"]

log = logging.getLogger(__name__)

SNAPSHOT_SHARE = 0.6  # of the shutdown timeout, for snapshots
WATCHDOG_SLACK_S = 5.0


async def drain(app: Any, timeout_s: float) -> dict[str, int]:
    """Steps 1-3 of the module docstring; returns counts (sessions, snapshots, jobs)."""
    app.state.draining = True
    ctx = app.state.ctx
    start = time.monotonic()
    sessions = [s for s in ctx.host.sessions() if not s.terminal]
    recording = ctx.host.recording
    futures: dict[Any, asyncio.Future[Any]] = {}
    if recording is not None:
        for session in sessions:
            if session.handle is not None and not session.handle.done:
                futures[session] = snapshot_loop(
                    recording, session.handle, after_chunk=True, advance=True
                )
    budget_s = SNAPSHOT_SHARE * timeout_s
    jobs = asyncio.create_task(ctx.jobs.suspend(budget_s))
    if futures:
        await asyncio.wait(futures.values(), timeout=budget_s)
    snapshotted = []
    for session, future in futures.items():
        if future.done() and not future.cancelled() and future.exception() is None:
            snapshotted.append(session)
        else:
            future.cancel()
            log.warning("session %s: no shutdown snapshot in time", session.id)
    data_dir = ctx.config.data_dir
    for session in snapshotted:
        await asyncio.to_thread(write_marker, data_dir, session.id, session.handle.loop_id)
    left_s = max(0.5, timeout_s - (time.monotonic() - start))
    closing = asyncio.gather(*(s.close("shutdown") for s in sessions), return_exceptions=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(closing, left_s * 0.7)
    jobs_suspended = await jobs
    for peer in list(ctx.peers.values()):
        with contextlib.suppress(Exception):
            await peer.close()  # flushes closing/closed to the viewer first
    counts = {"sessions": len(sessions), "snapshots": len(snapshotted), "jobs": jobs_suspended}
    log.info(
        "drained in %.1f s: %d sessions closed (%d snapshotted), %d job snapshots",
        time.monotonic() - start,
        counts["sessions"],
        counts["snapshots"],
        counts["jobs"],
    )
    return counts


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the SIGTERM drain above (``app``: the FastAPI app)."""

    def __init__(self, config: uvicorn.Config, app: Any, *, timeout_s: float = 10.0) -> None:
        super().__init__(config)
        self._app = app
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop, ctx = self._loop, getattr(self._app.state, "ctx", None)
        if sig != signal.SIGTERM or self._draining or loop is None or ctx is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True  # not recorded as captured: uvicorn would raise it again at exit
        log.info("SIGTERM: draining (at most %.0f s)", self.timeout_s)
        watchdog = threading.Timer(self.timeout_s + WATCHDOG_SLACK_S, _overdue, (self.timeout_s,))
        watchdog.daemon = True
        watchdog.start()
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        async def run() -> None:
            try:
                await drain(self._app, self.timeout_s)
            except Exception:
                log.exception("drain failed; stopping anyway")
            self.config.timeout_graceful_shutdown = max(1, round(self.timeout_s / 4))
            self.should_exit = True

        self._drain_task = asyncio.get_running_loop().create_task(run(), name="dreamrt-drain")


def _overdue(timeout_s: float) -> None:
    sys.stderr.write(f"dreamrt: shutdown took over {timeout_s + WATCHDOG_SLACK_S:.0f} s; exiting\n")
    sys.stderr.flush()
    os._exit(1)
