"""A job's preview over WebRTC: the frames a program's stream node makes, as a video track.

``JobPreviewPeer`` answers a viewer's offer (``POST /v1/jobs/{id}/preview``) with a send-only
video track, ``PreviewTrack``, fed by the job's preview listener (``Job.preview_listeners``):
the frames already previewed (``Job.preview_history``) first, then each decode's frames as it
runs, paced at the job's fps (a viewer sees the preview move at the clip's speed, however fast
the decodes come), PTS on the 90 kHz clock from the clip's first frame. When the job ends the
track ends after its last frame (the sender stops) and the peer closes; a viewer that goes away
closes it too. Nothing here touches the engine: a preview viewer costs the job nothing.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from runtime.task_set import TaskSet
from server.media.webrtc import add_video_sender, apply_offer, ice_server
from sessions.job import Job
from sessions.playout import PTS_HZ

__all__ = ["JobPreviewPeer", "PreviewTrack"]

log = logging.getLogger(__name__)

_TIME_BASE = fractions.Fraction(1, PTS_HZ)


class PreviewTrack(MediaStreamTrack):
    """Frames pushed in order (uint8 ``[H, W, 3]``), sent at ``fps``; ``end`` after the last."""

    kind = "video"

    def __init__(self, fps: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.fps = fps
        self._clock = clock
        self._queue: asyncio.Queue[np.ndarray | None] = asyncio.Queue()
        self._start_s: float | None = None
        self.sent = 0

    def push(self, frames: np.ndarray) -> None:
        for frame in frames:  # [n, H, W, 3] -> n frames
            self._queue.put_nowait(frame)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        frame = await self._queue.get()
        if frame is None or self.readyState != "live":
            self.stop()
            raise MediaStreamError
        now = self._clock()
        if self._start_s is None:
            self._start_s = now
        ahead_s = self._start_s + self.sent / self.fps - now
        if ahead_s > 0:
            await asyncio.sleep(ahead_s)
        video = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        video.pts = self.sent * PTS_HZ // self.fps
        video.time_base = _TIME_BASE
        self.sent += 1
        return video


class JobPreviewPeer:
    """The peer connection of one viewer of one job's preview stream (module docstring)."""

    def __init__(
        self,
        job: Job,
        *,
        ice_servers: Sequence[str] = (),
        on_closed: Callable[[JobPreviewPeer], None] | None = None,
    ) -> None:
        self.job = job
        config = RTCConfiguration(iceServers=[ice_server(spec) for spec in ice_servers])
        self.pc = RTCPeerConnection(configuration=config)
        self.track = PreviewTrack(job.config.fps)
        self._on_closed = on_closed
        self._tasks = TaskSet(log, f"job {job.id} preview")
        self._closed = False

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("job %s preview: peer connection %s", job.id, self.pc.connectionState)
            if self.pc.connectionState in ("failed", "closed"):
                await self.close()

    async def answer(self, sdp: str) -> RTCSessionDescription:
        """Answers the offer ``sdp`` (a recvonly video m-line); ``OfferError`` otherwise."""
        add_video_sender(self.pc, self.track, sdp)
        await apply_offer(self.pc, sdp)
        for frames in self.job.preview_history:
            self.track.push(frames)
        self.job.preview_listeners.append(self._on_preview)
        self._tasks.spawn(self._until_job_ends(), name=f"peer-job-{self.job.id}")
        local = self.pc.localDescription
        return RTCSessionDescription(sdp=local.sdp, type=local.type)

    def _on_preview(self, stream: str, frames: np.ndarray, meta: Any) -> None:
        self.track.push(frames)

    async def _until_job_ends(self) -> None:
        await self.job.wait_finished()
        self.track.end()  # the sender sends what is queued, then stops
        while self.track.readyState == "live":
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # the last packets leave before the connection closes
        asyncio.get_running_loop().create_task(self.close(), name=f"peer-job-{self.job.id}-end")

    async def close(self) -> None:
        """Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._on_preview in self.job.preview_listeners:
            self.job.preview_listeners.remove(self._on_preview)
        self.track.stop()
        await self._tasks.close()
        await self.pc.close()
        if self._on_closed is not None:
            self._on_closed(self)
