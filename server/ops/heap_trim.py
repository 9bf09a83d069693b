"""Hands the heap that ended sessions freed back to the OS (glibc ``malloc_trim``).

A session's native allocations (the video encoder's frames, PyAV, torch's CPU tensors) are
freed when it ends, but glibc keeps freed pages in its arenas, and an ended peer's Python
objects sit in reference cycles until the collector runs; with sessions coming and going for
days the process's RSS then only ratchets up, which looks like a leak and is one as far as the
machine is concerned (measured: ~2 MB of RSS per session created and deleted). ``HeapTrim``
looks every ``check_s`` seconds and, when sessions ended since the last time (``ended()``
returns a count that grows), runs ``gc.collect()`` on the event loop and then
``malloc_trim(0)`` on a worker thread, at most once per ``min_gap_s`` (a trim takes the
allocator's lock for milliseconds), and only while ``busy()`` is false: it waits until no
session is live. Without glibc (musl, macOS) only the collection runs.

A full collection walks every tracked object of the process, and a process holding a compiled
model holds millions (Dynamo's and Inductor's graphs, guards and caches): on the H200 server
after the warm-up, one took 1.5-1.8 s, during which the event loop stood still - a session
created then waited that long for its first frame, and the interpreter's own gen-2 collections
would stall live streams the same way. ``freeze_loaded_heap`` (called once, at ready) moves
everything loading and the warm-up built, which lives as long as the process, into the
collector's permanent generation: later collections walk only what serving created since.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

__all__ = ["HeapTrim", "freeze_loaded_heap"]

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def _timed_collect() -> float:
    began = time.perf_counter()
    gc.collect()
    return time.perf_counter() - began


def freeze_loaded_heap() -> Callable[[], None]:
    """Collect, then freeze every object the process holds now (``gc.freeze``): call once the
    model is loaded and warmed, before serving. Returns the undo (``gc.unfreeze``, for a
    shutdown that leaves the interpreter running, as tests do). Logs what a full collection
    cost before and after."""
    before_s = _timed_collect()
    gc.freeze()
    after_s = _timed_collect()
    log.info(
        "gc: %d objects of the loaded model frozen; a full collection took %.0f ms, now %.0f ms",
        gc.get_freeze_count(),
        before_s * 1e3,
        after_s * 1e3,
    )
    return gc.unfreeze


class HeapTrim:
    """``start()`` spawns the periodic task, ``close()`` ends it (idempotent)."""

    def __init__(
        self,
        ended: Callable[[], int],
        *,
        busy: Callable[[], bool] = lambda: False,
        check_s: float = 1.0,
        min_gap_s: float = 5.0,
    ) -> None:
        self._ended = ended
        self._busy = busy
        self.check_s = check_s
        self.min_gap_s = min_gap_s
        self._trim = _malloc_trim()
        self._seen = 0
        self._task: asyncio.Task[None] | None = None
        self.trims = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dreamrt-trim")

    async def trim_now(self) -> None:
        """A full garbage collection here (an ended peer's objects sit in reference cycles:
        their memory is not free until the collector runs), then one trim on a worker thread
        (if the C library has ``malloc_trim``)."""
        gc.collect()
        if self._trim is not None:
            await asyncio.to_thread(self._trim, 0)
            self.trims += 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_s = -self.min_gap_s
        while True:
            await asyncio.sleep(self.check_s)
            ended = self._ended()
            if self._busy():  # a full collection stalls the event loop: never under a live stream
                continue
            if ended != self._seen and loop.time() - last_s >= self.min_gap_s:
                self._seen = ended
                await self.trim_now()
                last_s = loop.time()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
