"""The paced WebRTC video track of one viewer, fed from its session's media queue.

One ``async recv()`` (aiortc calls it from the sender's task, then encodes the frame in its own
thread pool). Contract:

- The first ``recv()`` tells the session a viewer is pulling (``viewer_started``: it goes live
  and anchors deadlines); while the session is paused ``recv()`` waits without sending, and
  when the session ends it raises ``MediaStreamError`` (the sender stops).
- Wire PTS = generation PTS (90 kHz, from 0): a fresh frame leaves with its own ``pts_90k``
  at ``playout_anchor + pts`` (never faster than one frame per ``1/fps``). The first frame
  leaves as soon as it exists (start-up is not a stall).
- When no fresh frame is ready at the next frame slot, the last frame is sent again with
  ``pts = previous + 1`` (strictly increasing, and still below the next fresh frame's PTS) and
  the session counts a stall. After a stall, or when the queue was flushed by a prompt switch/
  cut, the next fresh frame leaves at once and the session re-anchors the playout (and the
  engine's deadlines) on it; a frame due more than ``max_hold_s`` ahead is treated the same
  way, so a stale anchor can never freeze the picture.
- It never blocks the event loop: it only awaits ``sleep`` and queue events, and the
  ``av.VideoFrame`` it builds is a cheap copy of one uint8 ``[H, W, 3]`` array.
- Time is the injected ``clock`` (seconds) and every wait for time to pass is the injected
  ``sleep`` (default ``time.monotonic`` and ``asyncio.sleep``), so a test drives the pacing
  with a fake clock whose ``sleep`` advances it.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import Awaitable, Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from sessions.media_queue import MediaFrame
from sessions.playout import PTS_HZ
from sessions.session import Session

__all__ = ["SessionVideoTrack"]

log = logging.getLogger(__name__)

_TIME_BASE = fractions.Fraction(1, PTS_HZ)


class SessionVideoTrack(MediaStreamTrack):
    """A ``MediaStreamTrack`` of kind video that paces ``session.media`` by PTS (see module doc)."""

    kind = "video"

    def __init__(
        self,
        session: Session,
        *,
        max_hold_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__()
        self._session = session
        self._fps = session.config.fps
        self._frame_s = 1.0 / self._fps
        self._max_hold_s = max_hold_s
        self._clock = clock
        self._sleep = sleep
        self._started = False
        self._last: MediaFrame | None = None
        self._last_pts = -1
        self._last_sent_s: float | None = None
        self._stalling = False
        self._flushes_seen = session.media.flushes
        self.fresh_frames = 0
        self.repeated_frames = 0

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        session = self._session
        if not self._started:
            self._started = True
            session.viewer_started()
        while not session.playing:
            if session.terminal:
                self.stop()
                raise MediaStreamError
            await session.wait_playing()
        frame: MediaFrame | None = None
        while True:
            if self._last is None:
                await session.media.wait_nonempty()
            if session.terminal or session.media.closed or self.readyState != "live":
                self.stop()
                raise MediaStreamError
            frame = await self._next_fresh()
            if frame is not None or self._last is not None:
                break
            # Before the first fresh frame there is nothing to repeat: wait for one.
        now = self._clock()
        if frame is not None:
            self._last = frame
            self._last_pts = frame.pts_90k
            self.fresh_frames += 1
            self._stalling = False
            session.frame_shown(frame, now)
        else:  # a repeat: the loop above guarantees self._last is set
            self._last_pts += 1
            self.repeated_frames += 1
            self._stalling = True
            session.frame_shown(None, now)
        shown = frame if frame is not None else self._last
        self._last_sent_s = now
        video = av.VideoFrame.from_ndarray(shown.rgb, format="rgb24")
        video.pts = self._last_pts
        video.time_base = _TIME_BASE
        return video

    async def _next_fresh(self) -> MediaFrame | None:
        """Waits for the next frame slot; returns the fresh frame to send, or None to repeat."""
        media = self._session.media
        now = self._clock()
        slot_s = now if self._last_sent_s is None else max(now, self._last_sent_s + self._frame_s)
        if media.peek() is None and not await self._wait_frame(slot_s - now):
            await self._sleep(max(0.0, slot_s - self._clock()))
            return media.pop()  # a frame that arrived during the last instants is still fresh
        frame = media.peek()
        if frame is None:  # closed
            return None
        flushed = media.flushes != self._flushes_seen
        self._flushes_seen = media.flushes
        anchor = self._session.playout_anchor_s
        due_s = slot_s
        if self._last is not None and not self._stalling and not flushed and anchor is not None:
            by_pts = anchor + frame.pts_90k / PTS_HZ
            if by_pts <= slot_s + self._max_hold_s:
                due_s = max(slot_s, by_pts)
        delay = due_s - self._clock()
        if delay > 0:
            await self._sleep(delay)
        return media.pop()

    async def _wait_frame(self, timeout_s: float) -> bool:
        """True once a frame is queued (or the queue closed), False after ``timeout_s`` of the
        track's own time (``sleep``) passed first."""
        media = self._session.media
        arrival = asyncio.ensure_future(media.wait_nonempty())
        timer = asyncio.ensure_future(self._sleep(max(0.0, timeout_s)))
        try:
            await asyncio.wait({arrival, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrival.cancel()
            timer.cancel()
        return arrival.done() and not arrival.cancelled() and arrival.result()

    def stop(self) -> None:
        """Ends the track (idempotent); the session is not closed by this."""
        super().stop()
