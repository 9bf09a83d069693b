"""Playout accounting of one session: where media time 0 is on the clock, what went on the wire.

The *anchor* is the monotonic time at which media PTS 0 is (or would have been) shown. It is
set when a viewer starts pulling the track and on resume, and it follows the actual playout:
a fresh frame shown more than half a frame away from ``anchor + pts`` moves it (after a stall,
a flush or a resume). The session forwards every move to the engine as the loop's deadline
anchor (``LoopHandle.set_media_t0``), so deadlines always describe the real viewer.

``fps_measured`` counts *fresh* frames (generated, not repeated) shown over the last
``window_s`` seconds, so stalls lower it. Single-threaded (the session's event loop).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from runtime.contract import PTS_HZ, frame_of_pts, pts_of_frame

__all__ = ["PTS_HZ", "Playout"]


class Playout:
    """Anchor, frames sent, stalls and measured fps of one stream at ``fps``."""

    def __init__(self, fps: int, *, clock: Callable[[], float], window_s: float = 2.0) -> None:
        if fps < 1:
            raise ValueError(f"fps must be >= 1, got {fps}")
        self.fps = fps
        self._clock = clock
        self._window_s = window_s
        self.anchor_s: float | None = None
        self.frames_sent = 0
        self.stalls = 0
        self._fresh_times: collections.deque[float] = collections.deque()

    def anchor_at(self, next_pts_90k: int) -> float:
        """Anchors so that ``next_pts_90k`` is due now; returns the new anchor."""
        self.anchor_s = self._clock() - next_pts_90k / PTS_HZ
        return self.anchor_s

    def anchor_next(self, queued_pts_90k: int | None, last_pts_90k: int | None) -> float:
        """Anchors at the next frame to show (first pull, resume): the one queued first, else
        the frame after the last one generated, else PTS 0. Returns the new anchor."""
        if queued_pts_90k is not None:
            return self.anchor_at(queued_pts_90k)
        if last_pts_90k is not None:
            return self.anchor_at(pts_of_frame(frame_of_pts(last_pts_90k, self.fps) + 1, self.fps))
        return self.anchor_at(0)

    def shown(self, pts_90k: int | None, shown_s: float) -> float | None:
        """A frame went on the wire at ``shown_s``: fresh with its PTS, or a repeat (None).

        Returns the new anchor when this frame moved it, else None.
        """
        self.frames_sent += 1
        if pts_90k is None:
            self.stalls += 1
            return None
        self._fresh_times.append(shown_s)
        while self._fresh_times and self._fresh_times[0] < shown_s - self._window_s:
            self._fresh_times.popleft()
        anchor = shown_s - pts_90k / PTS_HZ
        if self.anchor_s is None or abs(anchor - self.anchor_s) > 0.5 / self.fps:
            self.anchor_s = anchor
            return anchor
        return None

    def fps_measured(self) -> float:
        """Fresh frames per second over the last window (0 with fewer than two in it)."""
        now = self._clock()
        times = self._fresh_times
        while times and times[0] < now - self._window_s:
            times.popleft()
        if len(times) < 2:
            return 0.0
        span = max(now - times[0], times[-1] - times[0])
        return (len(times) - 1) / span if span > 0 else 0.0
