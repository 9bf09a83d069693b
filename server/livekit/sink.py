"""The session's video published into a LiveKit room, paced by the session's ``FramePacer``.

The sink is a pacer reader like the WebRTC track (same playout, same stall accounting: a
repeat goes out with ``pts = previous + 1``), so a session can have both at once. Each paced
frame is captured with ``timestamp_us`` = its wire PTS converted from 90 kHz. Conversion and
capture run in the sink's own worker thread, one frame at a time (``close()`` waits for the
frame in flight, so nothing is captured into a source that is gone); while a frame is in flight
the pacer goes on and the sink later takes the newest frame, counting the skipped ones in
``dropped``: a sink that cannot keep up drops frames, it never blocks the engine or the other
sink.

A sink that raises (the SDK's capture fails, the room's encoder is gone) ends only itself: the
session gets an ``error`` event (``sink_failed``) and is told this sink left, so it pauses once
no other sink watches (and the unwatched timeout can reclaim it); the WebRTC viewer, if any,
goes on at the session's pace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from server.live.frame_pacer import FramePacer, PacedFrame
from server.livekit.room import RoomConnection
from sessions.playout import PTS_HZ

__all__ = ["LiveKitVideoSink", "timestamp_us", "video_bitrate_bps"]

log = logging.getLogger(__name__)

# Bits per pixel per frame for a generated (smooth, low-noise) picture: 0.1 gives ~1.5 Mbps at
# 1280x720@16 and ~0.37 Mbps at 640x360@16, clamped to what a room's subscribers can carry.
_BITS_PER_PIXEL = 0.1
_MIN_BITRATE_BPS = 150_000
_MAX_BITRATE_BPS = 6_000_000


def video_bitrate_bps(width: int, height: int, fps: int) -> int:
    """The encoder's cap for a ``width`` x ``height`` stream at ``fps``."""
    raw = int(width * height * fps * _BITS_PER_PIXEL)
    return max(_MIN_BITRATE_BPS, min(_MAX_BITRATE_BPS, raw))


def timestamp_us(pts_90k: int) -> int:
    """A 90 kHz PTS in microseconds (what ``VideoSource.capture_frame`` takes)."""
    return pts_90k * 1_000_000 // PTS_HZ


class LiveKitVideoSink:
    """Publishes ``pacer``'s frames through ``room.capture`` until the session ends or
    ``close()``. ``start()`` spawns the task; ``close()`` is idempotent."""

    def __init__(self, pacer: FramePacer, room: RoomConnection) -> None:
        self._pacer = pacer
        self._room = room
        self._reader = pacer.reader(viewer=self)
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="livekit-capture")
        self.frames_published = 0
        self.last_timestamp_us = -1
        # told each published frame's wire PTS (the avatar's speech is clocked by it)
        self.on_published: Callable[[int], None] | None = None

    @property
    def dropped(self) -> int:
        return self._reader.dropped

    def start(self) -> None:
        session_id = self._pacer.session.id
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"peer-{session_id}-livekit-video"
        )

    async def _run(self) -> None:
        try:
            while (frame := await self._reader.recv()) is not None:
                await self._publish(frame)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            session = self._pacer.session
            log.exception("session %s: LiveKit video sink failed", session.id)
            self._reader.close()
            if not session.terminal:
                session.report_error("sink_failed", f"LiveKit video: {type(exc).__name__}: {exc}")
                session.viewer_left("livekit video sink failed", viewer=self)

    async def _publish(self, frame: PacedFrame) -> None:
        stamp = timestamp_us(frame.pts_90k)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._room.capture, frame.rgb, stamp)
        self.frames_published += 1
        self.last_timestamp_us = stamp
        if self.on_published is not None:
            self.on_published(frame.pts_90k)

    async def close(self) -> None:
        self._reader.close()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(self._thread.shutdown, wait=True)
