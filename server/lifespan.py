"""The server's lifespan: build the serving context, serve, tear it down.

Most servers build first and then listen (seconds). A server with a warm-up (``--compile``)
listens first, since compiling its set takes minutes on a GPU: the build runs as a task
beside uvicorn, ``/healthz`` answers 503 ``"starting"`` and every route that needs the model
503 ``starting`` with ``Retry-After`` (``server.api.deps.ctx_of``) until the context is
set on ``app.state.ctx``. A build that fails then logs its error, sets ``app.state.start_error``
and calls ``app.state.stop_serving`` (``dreamrt serve`` points it at uvicorn's
``should_exit``; it exits with code 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from fastapi import FastAPI

__all__ = ["lifespan_of", "starts_listening_first"]

log = logging.getLogger("server.app")  # the server's start and stop lines, in one logger


def starts_listening_first(config: Any) -> bool:
    """Whether a server of ``config`` (``ServerConfig``) listens before it is ready: one that
    warms up does (``--compile``, unless ``--no-warmup``)."""
    warmup = config.model.warmup
    return bool(config.model.compile if warmup is None else warmup)


def lifespan_of(
    config: Any,
    build: Callable[[Any], Coroutine[Any, Any, Any]],
    teardown: Callable[[Any], Awaitable[None]],
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The FastAPI lifespan that builds a context with ``build(config)`` (in the foreground,
    or as a task when the server listens first) and ends it with ``teardown(ctx)``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not starts_listening_first(config):
            ctx = await build(config)
            app.state.ctx = ctx
            try:
                yield
            finally:
                await teardown(ctx)
            return
        task = asyncio.create_task(build(config), name="dreamrt-build")
        task.add_done_callback(lambda done: _built(app, done))
        try:
            yield
        finally:
            await _stop(task, teardown)

    return lifespan


def _built(app: FastAPI, task: asyncio.Task[Any]) -> None:
    """The background build ended: serve with its context, or stop the server."""
    if task.cancelled():
        return
    error = task.exception()
    if error is None:
        app.state.ctx = task.result()
        return
    log.error("dreamrt could not start: %s", error, exc_info=error)
    app.state.start_error = error
    stop = getattr(app.state, "stop_serving", None)
    if stop is not None:
        stop()


async def _stop(task: asyncio.Task[Any], teardown: Callable[[Any], Awaitable[None]]) -> None:
    """At shutdown: tear down what the build made, or cancel a build still running (the
    process is exiting; a thread it started finishes on its own)."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return
    if not task.cancelled() and task.exception() is None:
        await teardown(task.result())
