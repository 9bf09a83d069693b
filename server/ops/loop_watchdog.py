"""Notices when the event loop stands still, and says what the process was doing meanwhile.

Everything a viewer feels goes through the event loop: inputs from the data channel, the frame
pacer, WebRTC's packets. Tensor work runs on the executor thread, so the loop can only stand
still when something holds it (a blocking call on the loop) or holds the GIL for long (a
compile: dynamo tracing, Triton building a kernel for a shape it has not seen). Such a stall is
invisible in per-plan timings, so it is watched for directly:

- the loop stamps a heartbeat every ``interval_s`` (a ``call_later`` chain);
- a daemon thread checks the stamp; once it is ``threshold_s`` old, it logs one warning with the
  Python stack of every thread (the GIL holder is usually not the loop's own thread, which
  shows only where it was preempted);
- when the loop runs again, the gap between two beats is the stall's length: ``on_stall``
  gets it on the loop (``ServerMetrics.loop_stalled``: ``dreamrt_event_loop_stalls_total`` and
  ``dreamrt_event_loop_stall_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

__all__ = ["LoopWatchdog", "thread_stacks"]

log = logging.getLogger(__name__)

STACK_FRAMES = 12  # innermost frames per thread in the warning: where the time goes


class LoopWatchdog:
    """Heartbeat on ``loop`` + a checking thread; ``close`` stops both."""

    def __init__(
        self,
        threshold_s: float = 0.5,
        *,
        interval_s: float = 0.05,
        on_stall: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval_s < threshold_s:
            raise ValueError("need 0 < interval_s < threshold_s")
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.on_stall = on_stall
        self._clock = clock  # stalls are measured on it (injectable: tests)
        self.stalls = 0
        self.longest_s = 0.0
        self._beat_s = clock()
        self._reported_at: float | None = None  # the beat a warning was logged for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._beat_s = self._clock()
        self._timer = self._loop.call_later(self.interval_s, self._beat)
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _beat(self) -> None:  # on the loop
        now = self._clock()
        gap = now - self._beat_s
        self._beat_s = now
        if gap >= self.threshold_s:
            self.stalls += 1
            self.longest_s = max(self.longest_s, gap)
            log.warning("event loop stood still for %.2f s", gap)
            if self.on_stall is not None:
                self.on_stall(gap)
        if not self._stop.is_set() and self._loop is not None:  # (set by start, before)
            self._timer = self._loop.call_later(self.interval_s, self._beat)

    def _watch(self) -> None:  # on the watchdog thread
        while not self._stop.wait(self.interval_s):
            beat = self._beat_s
            if self._clock() - beat >= self.threshold_s and self._reported_at != beat:
                self._reported_at = beat
                log.warning(
                    "event loop stalled for over %.2f s; what the threads are doing:\n%s",
                    self.threshold_s,
                    thread_stacks(),
                )


def thread_stacks(limit: int = STACK_FRAMES) -> str:
    """Every thread's innermost ``limit`` frames, the watchdog's own left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, f"thread {ident}")
        if name == "loop-watchdog":
            continue
        stack = "".join(traceback.format_stack(frame, limit=limit))
        parts.append(f"--- {name}\n{stack}")
    return "".join(parts)
