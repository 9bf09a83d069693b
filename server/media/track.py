"""The paced WebRTC video track of one viewer, fed from its session's ``FramePacer``.

One ``async recv()`` (aiortc calls it from the sender's task, then encodes the frame in its own
thread pool). Pacing, stall accounting and the session's viewer/playout calls are the pacer's
(``server.live.frame_pacer``: the same code path paces the LiveKit sink); this track only turns a
``PacedFrame`` into an ``av.VideoFrame`` (a cheap copy of one uint8 ``[H, W, 3]`` array) with
the wire PTS on a 90 kHz time base, and raises ``MediaStreamError`` once the session ended (the
sender stops). It never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import Awaitable, Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from server.live.frame_pacer import FramePacer
from sessions.playout import PTS_HZ
from sessions.session import Session

__all__ = ["SessionVideoTrack"]

log = logging.getLogger(__name__)

_TIME_BASE = fractions.Fraction(1, PTS_HZ)


class SessionVideoTrack(MediaStreamTrack):
    """A ``MediaStreamTrack`` of kind video reading ``pacer`` (a private one when not given)."""

    kind = "video"

    def __init__(
        self,
        session: Session,
        *,
        pacer: FramePacer | None = None,
        max_hold_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__()
        self._session = session
        self.pacer = pacer or FramePacer(session, max_hold_s=max_hold_s, clock=clock, sleep=sleep)
        self._reader = self.pacer.reader()
        self.fresh_frames = 0
        self.repeated_frames = 0

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        paced = await self._reader.recv()
        if paced is None or self.readyState != "live":
            self.stop()
            raise MediaStreamError
        if paced.fresh:
            self.fresh_frames += 1
        else:
            self.repeated_frames += 1
        video = av.VideoFrame.from_ndarray(paced.rgb, format="rgb24")
        video.pts = paced.pts_90k
        video.time_base = _TIME_BASE
        return video

    def stop(self) -> None:
        """Ends the track (idempotent); the session and the other sinks go on."""
        self._reader.close()
        super().stop()
