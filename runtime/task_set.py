"""``TaskSet``: the background tasks one component owns, spawned, cancelled and awaited in one
place (a viewer peer's forwarders, a LiveKit room's callbacks, a fleet worker's endpoints).

A task leaves the set when it ends; one that fails is logged (with ``logger``), never left as
an exception nobody retrieves. ``close`` cancels whatever still runs and waits for all of it,
so a component that closed has nothing of its own left on the event loop. It imports only the
standard library: every layer may use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import TypeVar

__all__ = ["TaskSet"]

T = TypeVar("T")


class TaskSet:
    """``spawn`` a coroutine as a named task; ``close`` cancels and awaits every task left.
    ``logger``/``owner``: a task that raised is logged as ``"<owner>: <task name> failed"``."""

    def __init__(self, logger: logging.Logger | None = None, owner: str = "") -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self._logger = logger
        self._owner = owner

    def spawn(self, coro: Coroutine[object, None, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def add(self, task: asyncio.Task[object]) -> None:
        """Owns a task created elsewhere (it is cancelled and awaited by ``close`` too)."""
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self._logger is None:
            return
        if task.exception() is not None:
            self._logger.error(
                "%s: %s failed", self._owner, task.get_name(), exc_info=task.exception()
            )

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[object]]:
        return iter(list(self._tasks))

    def cancel(self) -> None:
        """Cancels every task without waiting (``close`` waits)."""
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Cancels every task and waits until all have ended (their errors are not raised).
        Called from one of its own tasks, it waits for the others."""
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
