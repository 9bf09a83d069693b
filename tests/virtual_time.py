"""An asyncio event loop on virtual time, for tests of code that paces itself with timers.

``VirtualTimeLoop.time()`` starts at 0 and moves only when the loop would otherwise wait: a
wait for the next timer jumps straight to it, so ``asyncio.sleep(0.3)`` returns at once with
``loop.time()`` exactly 0.3 later, whatever the machine's load. Ready sockets are still
served (polled without blocking); a wait with no timer blocks on them as usual. Not for code
that hands work to threads: a thread's result arriving "later" is not ordered against the
jumps.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["VirtualTimeLoop", "run_virtual"]


class _JumpingSelector(selectors.SelectSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer pending: only I/O can wake the loop
            return super().select(None)
        self.now_s += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """See the module docstring."""

    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now_s


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a fresh ``VirtualTimeLoop``."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
