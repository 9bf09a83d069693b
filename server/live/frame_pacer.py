"""PTS pacing of one session's video, shared by every sink that shows it (WebRTC, LiveKit).

One ``FramePacer`` per session pops ``session.media`` and decides, frame slot by frame slot,
what goes on the wire; each sink reads it through its own ``PacerReader``. Contract:

- A reader's first ``recv()`` tells the session a viewer is pulling (``viewer_started``: it
  goes live and anchors deadlines); while the session is paused ``recv()`` waits without
  sending, and once the session ends (or the reader is closed) it returns None.
- Wire PTS = generation PTS (90 kHz, from 0): a fresh frame leaves with its own ``pts_90k``
  at ``playout_anchor + pts`` (never faster than one frame per ``1/fps``). The first frame
  leaves as soon as it exists (start-up is not a stall).
- When no fresh frame is ready at the next frame slot, the last frame is sent again with
  ``pts = previous + 1`` (strictly increasing, and still below the next fresh frame's PTS) and
  the session counts a stall. After a stall the next fresh frame leaves at its slot; when the
  queue was flushed by an applied prompt switch/cut or changed key, it leaves at once, without
  waiting for the next slot of the pacing grid (it is what the viewer is waiting for). Either
  way the session re-anchors the playout (and the engine's deadlines) on it; a frame due more
  than ``max_hold_s`` ahead is treated the same way, so a stale anchor can never freeze the
  picture.
- Sharing: the frame for a slot is produced once (under a lock, by whichever reader asks
  first) and counted once in the session's playout; every reader receives the newest paced
  frame it has not seen. A reader that falls behind (a slow encoder, a congested room) skips to
  the newest frame and counts the skipped ones in ``dropped``: a slow sink drops frames, it
  never slows the other sink or the engine.
- It never blocks the event loop: it only awaits ``sleep`` (injectable; ``asyncio.sleep``),
  queue events and the lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from sessions.media_queue import MediaFrame
from sessions.playout import PTS_HZ
from sessions.session import Session

__all__ = ["FramePacer", "PacedFrame", "PacerReader"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PacedFrame:
    """One frame put on the wire: fresh from the generator, or the previous one repeated."""

    rgb: np.ndarray  # [H, W, 3] uint8
    pts_90k: int  # wire PTS: the frame's own, or previous + 1 for a repeat
    fresh: bool
    index: int  # position in the paced sequence, from 1


class FramePacer:
    """The pacing state of one session's video (see module doc). Event-loop thread only."""

    def __init__(
        self,
        session: Session,
        *,
        max_hold_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.session = session
        self._sleep = sleep
        self._frame_s = 1.0 / session.config.fps
        self._max_hold_s = max_hold_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._latest: PacedFrame | None = None
        self._last: MediaFrame | None = None
        self._last_sent_s: float | None = None
        self._stalling = False
        self._flushes_seen = session.media.flushes
        self.fresh_frames = 0
        self.repeated_frames = 0

    def reader(self, viewer: object | None = None) -> PacerReader:
        """A new reader; ``viewer`` is the token it reports to the session (None: the WebRTC
        viewer, the session's historical single viewer)."""
        return PacerReader(self, viewer)

    @property
    def ended(self) -> bool:
        session = self.session
        return session.terminal or session.media.closed

    async def next_after(self, index: int) -> PacedFrame | None:
        """The newest paced frame with an index above ``index`` (pacing the next slot when there
        is none yet), or None once the session ended."""
        async with self._lock:
            latest = self._latest
            if latest is not None and latest.index > index:
                return latest
            frame = await self._produce()
            if frame is not None:
                self._latest = frame
            return frame

    async def _produce(self) -> PacedFrame | None:
        session = self.session
        while not session.playing:
            if session.terminal:
                return None
            await session.wait_playing()
        fresh: MediaFrame | None = None
        while True:
            if self._last is None:
                await session.media.wait_nonempty()
            if self.ended:
                return None
            fresh = await self._next_fresh()
            if fresh is not None or self._last is not None:
                break
            # Before the first fresh frame there is nothing to repeat: wait for one.
        now = self._clock()
        index = 1 if self._latest is None else self._latest.index + 1
        if fresh is not None:
            self._last = fresh
            self.fresh_frames += 1
            self._stalling = False
            session.frame_shown(fresh, now)
            paced = PacedFrame(fresh.rgb, fresh.pts_90k, True, index)
        else:  # a repeat: the loop above guarantees self._last and self._latest are set
            assert self._last is not None and self._latest is not None
            self.repeated_frames += 1
            self._stalling = True
            session.frame_shown(None, now)
            paced = PacedFrame(self._last.rgb, self._latest.pts_90k + 1, False, index)
        self._last_sent_s = now
        return paced

    async def _next_fresh(self) -> MediaFrame | None:
        """Waits for the next frame slot; returns the fresh frame to send, or None to repeat."""
        media = self.session.media
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
        anchor = self.session.playout_anchor_s
        due_s = self._clock() if flushed else slot_s
        if self._last is not None and not self._stalling and not flushed and anchor is not None:
            by_pts = anchor + frame.pts_90k / PTS_HZ
            if by_pts <= slot_s + self._max_hold_s:
                due_s = max(slot_s, by_pts)
        delay = due_s - self._clock()
        if delay > 0:
            await self._sleep_unless_flushed(delay)
        return media.pop()

    async def _sleep_unless_flushed(self, delay_s: float) -> None:
        """Sleeps ``delay_s`` of the pacer's time, or less when the queue is flushed meanwhile:
        its head is then a frame the viewer waits for (``media.pop`` takes it at once)."""
        media = self.session.media
        flushed = asyncio.ensure_future(media.wait_flushed(media.flushes))
        timer = asyncio.ensure_future(self._sleep(delay_s))
        try:
            await asyncio.wait({flushed, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            flushed.cancel()
            timer.cancel()
        if flushed.done() and not flushed.cancelled():
            self._flushes_seen = media.flushes

    async def _wait_frame(self, timeout_s: float) -> bool:
        """True once a frame is queued (or the queue closed), False after ``timeout_s`` of the
        pacer's own time (``sleep``: injectable, so tests pace on a fake clock) passed first."""
        arrival = asyncio.ensure_future(self.session.media.wait_nonempty())
        timer = asyncio.ensure_future(self._sleep(max(0.0, timeout_s)))
        try:
            await asyncio.wait({arrival, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrival.cancel()
            timer.cancel()
        return arrival.done() and not arrival.cancelled() and arrival.result()


class PacerReader:
    """One sink's view of a ``FramePacer``: ``recv()`` until it returns None."""

    def __init__(self, pacer: FramePacer, viewer: object | None) -> None:
        self._pacer = pacer
        self._viewer = viewer
        self._started = False
        self._closed = False
        self._seen = 0
        self.received = 0
        self.dropped = 0  # paced frames this reader never got because it was busy

    async def recv(self) -> PacedFrame | None:
        if self._closed:
            return None
        session = self._pacer.session
        if not self._started:
            self._started = True
            if self._viewer is None:
                session.viewer_started()
            else:
                session.viewer_started(viewer=self._viewer)
        frame = await self._pacer.next_after(self._seen)
        if frame is None or self._closed:
            return None
        if self._seen and frame.index > self._seen + 1:
            self.dropped += frame.index - self._seen - 1
        self._seen = frame.index
        self.received += 1
        return frame

    def close(self) -> None:
        """Ends this reader (idempotent); the pacer and the other readers go on."""
        self._closed = True
