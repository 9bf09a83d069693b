"""The watch a session or a job keeps over its engine loop, from attach until the loop's end.

``attach`` binds the engine's handle once and starts one task that awaits the loop's result and
tells the owner how it ended, through ``LoopOutcome``:

    attach(handle) ──► await handle.result() ──► settle()  (the owner's pending work, if any)
                             │
          result ────────────┼──► loop_completed(result)  (async: a job writes its artifact)
          Cancelled ─────────┼──► loop_cancelled(reason)
          LoopFailed ────────┼──► loop_failed(code, message)
          anything else ─────┴──► loop_raised(exc)   (also what ``loop_completed`` raises; logged)
                                       │
                                       ▼
                                 loop_ended()  ──► finished set ──► on_finished callbacks

``loop_ended`` always runs, once; the callbacks run after it, each guarded (one that raises is
logged, the rest still run). An owner that never got a handle (closed or failed before
admission finished) calls ``finish`` instead.

A fork choice moves a loop between owners (``sessions.forks``): ``replace`` watches another
loop instead (the chosen candidate's, which carries the parent on) and ``release`` lets the
loop go (the candidate session ends while its loop continues): the end of a loop that is no
longer the watched one tells its old owner nothing. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from runtime.contract import Cancelled, LoopFailed, LoopResult
from sessions.loop_handle import LoopHandleLike

__all__ = ["LoopOutcome", "LoopWatch"]

log = logging.getLogger(__name__)


class LoopOutcome(Protocol):
    """How the owner (``Session``, ``Job``) takes each way its loop can end."""

    async def loop_completed(self, result: LoopResult) -> None: ...

    def loop_cancelled(self, reason: str) -> None: ...

    def loop_failed(self, code: str, message: str) -> None: ...

    def loop_raised(self, exc: Exception) -> None: ...

    def loop_ended(self) -> None: ...


class LoopWatch:
    """See the module docstring. ``name`` (``"session ses_…"``) prefixes log lines and errors."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handle: LoopHandleLike | None = None
        self._task: asyncio.Task[None] | None = None
        self._finished = asyncio.Event()
        self._on_finished: list[Callable[[], None]] = []

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def attach(
        self,
        handle: LoopHandleLike,
        outcome: LoopOutcome,
        *,
        settle: Callable[[], Awaitable[None]] | None = None,
        on_finished: Callable[[], None] | None = None,
    ) -> None:
        """Binds ``handle`` (once) and starts watching it; ``settle`` runs as soon as the result
        (or its exception) is there, before ``outcome`` hears of it."""
        if self.handle is not None:
            raise RuntimeError(f"{self.name} already has loop {self.handle.loop_id!r}")
        self.handle = handle
        if on_finished is not None:
            self._on_finished.append(on_finished)
        self._task = asyncio.get_running_loop().create_task(
            self._watch(handle, outcome, settle), name=self.name.replace(" ", "-")
        )

    def replace(
        self,
        handle: LoopHandleLike,
        outcome: LoopOutcome,
        *,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> LoopHandleLike | None:
        """Watches ``handle`` from now on instead of the loop attached so far; -> that one
        (for the caller to cancel)."""
        old, self.handle = self.handle, None
        self.attach(handle, outcome, settle=settle)
        return old

    def release(self) -> None:
        """Stops watching the loop without ending it (it carries another owner on)."""
        self.handle = None

    def on_finished(self, callback: Callable[[], None]) -> None:
        self._on_finished.append(callback)

    async def _watch(
        self,
        handle: LoopHandleLike,
        outcome: LoopOutcome,
        settle: Callable[[], Awaitable[None]] | None,
    ) -> None:
        try:
            result: LoopResult | Exception = await handle.result()
        except Exception as exc:
            result = exc
        if settle is not None:
            await settle()
        if handle is not self.handle:  # replaced or released: its end is not the owner's
            return
        try:
            if isinstance(result, Exception):
                raise result
            await outcome.loop_completed(result)
        except Cancelled as exc:
            outcome.loop_cancelled(exc.reason)
        except LoopFailed as exc:
            outcome.loop_failed(exc.code, exc.message)
        except Exception as exc:
            log.exception("%s: loop result raised", self.name)
            outcome.loop_raised(exc)
        finally:
            outcome.loop_ended()
            self.finish()

    def finish(self) -> None:
        """Marks the watch finished and runs the callbacks (once; later calls do nothing)."""
        if self._finished.is_set():
            return
        self._finished.set()
        for callback in self._on_finished:
            try:
                callback()
            except Exception:
                log.exception("%s: on_finished callback failed", self.name)

    async def wait(self) -> None:
        await self._finished.wait()
