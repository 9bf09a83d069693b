"""A WebRTC viewer of one dreamrt session (aiortc): receives the video, talks on ``control``.

``Viewer.connect()`` creates the session (or joins ``session_id``), offers a recvonly video
m-line, a ``control`` data channel and, with ``audio_track``, a sendonly audio m-line, and
starts two background tasks: one receives decoded frames (``frames``: PTS, receive time, and the
RGB array when ``keep_rgb``), one is the data channel's event log (``events``: every server
event as a dict, in order). ``close()`` is idempotent: it ends both tasks, closes the peer
connection and deletes the session it created. A session created through a fleet router
(``dreamrt router``: the answer names the engine's ``url``) is watched on that engine, with its
session token: media never pass through the router.

Frames that repeat the last picture while generation is late carry a PTS only one tick above
the previous frame (docs/api.md "Video"); ``fresh_frames()`` leaves them out.

``wire_arrival(pts)`` is when the first RTP packet of a frame reached this peer: aiortc's
receiver hands a video frame to the decoder only once the next frame's first packet arrived, so
``frames[i].received_s`` is one frame interval late; benchmarks of latency read the wire.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from clients.python.api import DreamrtClient

__all__ = ["ReceivedFrame", "Viewer", "limit_host_candidates"]

log = logging.getLogger(__name__)

# The video clock of the wire (RTP, docs/api.md "Video"): PTS ticks at 90 kHz. A client shares
# only the wire format with the server, so it names the clock rather than importing it.
VIDEO_CLOCK_HZ = 90_000


def limit_host_candidates(addresses: Sequence[str]) -> Callable[[], None]:
    """Makes this process's aioice offer host candidates only on ``addresses``; returns an undo."""
    import aioice.ice

    allowed = list(addresses)
    original = aioice.ice.get_host_addresses

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in allowed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses

    def undo() -> None:
        aioice.ice.get_host_addresses = original

    return undo


@dataclass(frozen=True, slots=True)
class ReceivedFrame:
    pts: int  # RTP timestamp unwrapped, counted from the first frame (90 kHz)
    received_s: float  # time.monotonic()
    width: int
    height: int
    rgb: np.ndarray | None  # [H, W, 3] uint8 when keep_rgb


class Viewer:
    """One session watched over WebRTC (see the module docstring)."""

    def __init__(
        self,
        api: DreamrtClient,
        *,
        keep_rgb: bool = False,
        ice_servers: Sequence[str] = (),
        on_frame: Callable[[ReceivedFrame], None] | None = None,
        audio_track: Any = None,
    ) -> None:
        self.api = api
        self.keep_rgb = keep_rgb
        self.session_id: str | None = None
        self.profile: dict[str, int] = {}
        self.frames: list[ReceivedFrame] = []
        self.events: list[dict[str, Any]] = []
        self.event_times: list[float] = []  # time.monotonic() each event arrived
        self._on_frame = on_frame
        self._audio_track = (
            audio_track  # an aiortc audio MediaStreamTrack sent to the session (microphone)
        )
        self._owns_session = False
        self._engine_api: DreamrtClient | None = None  # opened here to follow a fleet router
        self._pc = RTCPeerConnection(
            RTCConfiguration(iceServers=[RTCIceServer(urls=u) for u in ice_servers])
        )
        self._channel = self._pc.createDataChannel("control")
        self._channel_open = asyncio.Event()
        self._event_arrived = asyncio.Event()
        self._first_frame = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._rtp_first: int | None = None
        self._rtp_last = 0
        self.connected_s: float | None = None  # time.monotonic() when ICE + DTLS came up
        # RTP timestamp -> time.monotonic() its first video packet arrived (the last 4096);
        # the first packet's timestamp is PTS 0 (wire PTS = generation PTS, from 0)
        self._wire_s: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._wire_first: int | None = None

        @self._pc.on("connectionstatechange")
        def on_state() -> None:
            if self._pc.connectionState == "connected" and self.connected_s is None:
                self.connected_s = time.monotonic()

        @self._channel.on("open")
        def on_open() -> None:
            self._channel_open.set()

        @self._channel.on("message")
        def on_message(message: str | bytes) -> None:
            try:
                event = json.loads(message)
            except ValueError:
                log.warning("non-JSON control message: %r", message)
                return
            self.events.append(event)
            self.event_times.append(time.monotonic())
            self._event_arrived.set()

        @self._pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "video":
                self._tasks.append(asyncio.get_running_loop().create_task(self._receive(track)))

    async def connect(
        self,
        prompt: str | None = None,
        *,
        session_id: str | None = None,
        timeout_s: float = 30.0,
        **session_params: Any,
    ) -> None:
        """Creates (or joins) the session and negotiates; returns once the data channel is open."""
        if session_id is None:
            if prompt is None:
                raise ValueError("connect needs a prompt to create a session, or a session_id")
            created = await self.api.create_session(prompt, **session_params)
            session_id, self._owns_session = created["id"], True
            self.profile = created["profile"]
            engine_url = created.get("url")  # a fleet router placed it: talk to that engine
            if engine_url and engine_url.rstrip("/") != self.api.base_url:
                self.api = DreamrtClient(engine_url, token=created["token"])
                self._engine_api = self.api
        self.session_id = session_id
        self._pc.addTransceiver("video", direction="recvonly")
        if self._audio_track is not None:
            self._pc.addTransceiver(self._audio_track, direction="sendonly")
        await self._pc.setLocalDescription(await self._pc.createOffer())
        answer = await self.api.offer(session_id, self._pc.localDescription.sdp)
        await self._pc.setRemoteDescription(
            RTCSessionDescription(sdp=answer["sdp"], type=answer["type"])
        )
        for transceiver in self._pc.getTransceivers():
            if transceiver.kind == "video":
                self._time_packets(transceiver.receiver)
        await asyncio.wait_for(self._channel_open.wait(), timeout_s)

    def _time_packets(self, receiver: Any) -> None:
        # aiortc's DTLS transport calls receiver._handle_rtp_packet per packet (an instance
        # attribute lookup): wrap it to note when each frame's first packet arrived.
        handle = receiver._handle_rtp_packet
        arrivals = self._wire_s

        async def timed(packet: Any, arrival_time_ms: int) -> None:
            if self._wire_first is None:
                self._wire_first = packet.timestamp
            if packet.timestamp not in arrivals:
                arrivals[packet.timestamp] = time.monotonic()
                if len(arrivals) > 4096:
                    arrivals.popitem(last=False)
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = timed

    def wire_arrival(self, pts: int, after_s: float = 0.0) -> float | None:
        """When the first packet of the earliest frame with PTS >= ``pts`` arrived after
        ``after_s`` (time.monotonic()), or None (not yet). PTS counts from the first packet's
        RTP timestamp (the session's first frame when this viewer saw the stream start)."""
        if self._wire_first is None:
            return None
        best: tuple[int, float] | None = None
        for rtp, arrived_s in self._wire_s.items():
            frame_pts = (rtp - self._wire_first) % (1 << 32)
            if arrived_s >= after_s and frame_pts >= pts and (best is None or frame_pts < best[0]):
                best = (frame_pts, arrived_s)
        return None if best is None else best[1]

    async def _receive(self, track: Any) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                now = time.monotonic()
                pts = self._unwrap(int(frame.pts))
                rgb = frame.to_ndarray(format="rgb24") if self.keep_rgb else None
                received = ReceivedFrame(pts, now, frame.width, frame.height, rgb)
                self.frames.append(received)
                self._first_frame.set()
                if self._on_frame is not None:
                    self._on_frame(received)

    def _unwrap(self, rtp: int) -> int:
        if self._rtp_first is None:
            self._rtp_first = rtp
        delta = (rtp - self._rtp_first) % (1 << 32)
        epoch = round((self._rtp_last - delta) / (1 << 32))
        self._rtp_last = delta + epoch * (1 << 32)
        return self._rtp_last

    def send(self, message: dict[str, Any]) -> None:
        """One control message (docs/api.md "Data channel `control`"), sent as JSON text."""
        self._channel.send(json.dumps(message))

    def send_raw(self, text: str) -> None:
        self._channel.send(text)

    async def wait_first_frame(self, timeout_s: float = 30.0) -> None:
        await asyncio.wait_for(self._first_frame.wait(), timeout_s)

    async def wait_event(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout_s: float = 30.0,
        *,
        start: int = 0,
    ) -> dict[str, Any]:
        """The first event (from index ``start``) matching ``predicate``; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        index = start
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if predicate(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no matching event within {timeout_s} s; last events: {self.events[-5:]}"
                )
            self._event_arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event_arrived.wait(), remaining)

    def fresh_frames(self) -> list[ReceivedFrame]:
        """Frames that are not stall repeats (their PTS is more than half a frame later)."""
        fps = self.profile.get("fps") or 0
        min_step = VIDEO_CLOCK_HZ // (2 * fps) if fps else 2
        out: list[ReceivedFrame] = []
        for frame in self.frames:
            if not out or frame.pts - out[-1].pts >= min_step:
                out.append(frame)
        return out

    async def close(self, *, delete: bool = True) -> None:
        """Idempotent; deletes the session if this viewer created it (and ``delete``)."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._pc.close()
        if delete and self._owns_session and self.session_id is not None:
            await self.api.delete_session(self.session_id)
        if self._engine_api is not None:
            await self._engine_api.aclose()
