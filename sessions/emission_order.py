"""Emission order: a session's loop emissions take effect in the order the loop made them, while
each chunk's content digest is computed off the event loop.

The sha256 of a chunk (832x480 RGB x 12 frames is 14 MB, several milliseconds) must not run on
the event loop that paces every session's video. So ``digest`` hands the frames to a worker
thread and queues what needs the digest (the ``media.chunk`` event, the chunk's record);
``after`` queues work that must not overtake it (the ``*.applied`` events and the record fields
they complete). Queued work runs on the event loop, strictly first in, first out, as soon as
everything before it is ready; with nothing pending, ``after`` runs at once::

    emissions:  media c0 ──► applied s1 ──► media c1 ──► applied s2
    queue:      [digest c0 …] [s1] [digest c1 …] [s2]       workers hash c0, c1 in parallel
    runs:       media.chunk c0, then s1, then media.chunk c1, then s2  (never reordered)

What must take effect at once (frames entering the media queue, a cut's flush) is not queued:
the caller does it before queueing the rest, so playout never waits for a hash. Work that
raises is logged and reported to ``on_error``; the queue goes on. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
from collections.abc import Callable

import numpy as np

__all__ = ["EmissionOrder"]

log = logging.getLogger(__name__)


class EmissionOrder:
    """See the module docstring. ``hash_frames`` maps frames to their digest (a worker thread
    runs it); ``executor`` is where (None: the event loop's default executor)."""

    def __init__(
        self,
        hash_frames: Callable[[np.ndarray], str],
        *,
        on_error: Callable[[Exception], None],
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        self._hash = hash_frames
        self._on_error = on_error
        self._executor = executor
        # (digest future or None, work): work(digest) for a digest entry, work() otherwise
        self._queue: collections.deque[tuple[asyncio.Future[str] | None, Callable[..., None]]] = (
            collections.deque()
        )
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Entries not run yet."""
        return len(self._queue)

    def digest(self, frames: np.ndarray, then: Callable[[str], None]) -> None:
        """Hashes ``frames`` (not to be modified until ``then`` ran) on a worker thread and runs
        ``then(digest)`` on the event loop in its turn."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._hash, frames)
        self._queue.append((future, then))
        self._idle.clear()
        future.add_done_callback(lambda _: self._run_ready())

    def after(self, work: Callable[[], None]) -> None:
        """Runs ``work`` once everything queued before it ran (at once when nothing is)."""
        if not self._queue:
            self._guarded(work)
            return
        self._queue.append((None, work))

    async def drain(self) -> None:
        """Returns once everything queued so far has run."""
        await self._idle.wait()

    def _run_ready(self) -> None:
        while self._queue:
            future, work = self._queue[0]
            if future is not None and not future.done():
                return
            self._queue.popleft()
            if future is None:
                self._guarded(work)
            elif future.cancelled():
                log.warning("a chunk digest was cancelled; its chunk is not published")
            elif future.exception() is not None:
                self._report(future.exception())
            else:
                self._guarded(work, future.result())
        self._idle.set()

    def _guarded(self, work: Callable[..., None], *args: str) -> None:
        try:
            work(*args)
        except Exception as exc:
            self._report(exc)

    def _report(self, exc: BaseException | None) -> None:
        log.error("emission handling failed", exc_info=exc)
        if isinstance(exc, Exception):
            self._on_error(exc)
