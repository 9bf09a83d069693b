"""WebRTC signalling and the peer of one viewer (aiortc).

``ViewerPeer.answer(offer)`` takes the browser's (or ``dreamrt watch``'s) offer and returns the
complete answer (aiortc gathers ICE before answering: no trickle). The offer must carry a video
m-line the server can send on (``recvonly`` or ``sendrecv``); it may carry

- a data channel labelled ``control`` (created by the client): client messages are validated
  and applied by ``server.live.control_inbox`` (shared with LiveKit), every session event is sent
  back as JSON;
- an audio m-line (``sendonly`` from the client, e.g. push-to-talk): for cards with
  ``input.audio`` the frames are resampled to 16 kHz mono and pushed to the session every
  ``AUDIO_PUSH_S`` seconds; for other cards the m-line is answered ``inactive``.

Codecs: VP8 first, H.264 constrained baseline (``42e01f``) and baseline (``42001f``) also
offered. ``configure_video_bitrate`` sets aiortc's encoder target and cap (process-wide: the
encoders read module constants). ICE: no STUN/TURN unless configured; ``restrict_host_candidates``
limits the host candidates aioice gathers to the given addresses (``--ice-host``).

Lifecycle: ``close()`` is idempotent; it ends the forwarding and audio tasks (awaited),
stops the track, closes the peer connection and tells the session its viewer left. A peer
connection that fails or closes on its own triggers the same ``close()``, and so does one that
is not connected (ICE + DTLS) ``limits.connect_timeout_s`` after its answer: a client that
vanishes mid-negotiation or mid-DTLS never holds the session in ``negotiating``.

Bounds (``server.config.limits.Limits``): events for a peer that does not read its data channel stop
being queued once ``control_buffer_bytes`` wait in the channel (counted in
``events_dropped``; the peer reads the rest from SSE with ``Last-Event-ID``); viewer audio for
a session that is not live is kept for at most ``audio_buffer_s`` (the oldest goes first), and
frames the audio track delivers faster than they are read are dropped past
``AUDIO_QUEUE_FRAMES``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import av
import numpy as np
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from runtime.errors import DreamrtError
from runtime.task_set import TaskSet
from server.config.limits import Limits
from server.live.control_inbox import ControlInbox
from server.live.frame_pacer import FramePacer
from server.media.track import SessionVideoTrack
from sessions.audio import TARGET_RATE_HZ, AudioClip
from sessions.events import encode_event
from sessions.session import Session
from sessions.store import Store

__all__ = [
    "AUDIO_PUSH_S",
    "OfferError",
    "ViewerPeer",
    "add_video_sender",
    "apply_offer",
    "configure_video_bitrate",
    "ice_server",
    "restrict_host_candidates",
    "video_codec_preferences",
]

log = logging.getLogger(__name__)

AUDIO_PUSH_S = 0.5
AUDIO_QUEUE_FRAMES = 50  # 1 s of 20 ms frames waiting in the track: beyond, the oldest go
CONTROL_LABEL = "control"


class OfferError(DreamrtError, ValueError):
    """The offer cannot be answered (malformed SDP, no video m-line, no common codec): 400."""

    code = "bad_offer"
    status = 400


def add_video_sender(pc: RTCPeerConnection, track: Any, sdp: str) -> Any:
    """``track``'s sendonly video transceiver on ``pc`` for the offer ``sdp``, codecs in
    ``video_codec_preferences`` order; ``OfferError`` if the offer has no video m-line."""
    if "m=video" not in sdp:
        raise OfferError("the offer has no video m-line; add a recvonly video transceiver")
    video = pc.addTransceiver(track, direction="sendonly")
    video.setCodecPreferences(video_codec_preferences())
    return video


async def apply_offer(pc: RTCPeerConnection, sdp: str) -> None:
    """Sets the offer ``sdp`` and ``pc``'s answer; ``OfferError`` if aiortc cannot."""
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # noqa: BLE001 - aiortc raises assorted types on malformed SDP
        raise OfferError(f"cannot answer the offer: {type(exc).__name__}: {exc}") from None


def video_codec_preferences() -> list[Any]:
    """VP8, then H.264 constrained baseline / baseline, then RTX (aiortc capabilities)."""
    codecs = RTCRtpSender.getCapabilities("video").codecs

    def rank(codec: Any) -> int:
        mime = codec.mimeType.lower()
        if mime == "video/vp8":
            return 0
        if mime == "video/h264":
            return {"42e01f": 1, "42001f": 2}.get(codec.parameters.get("profile-level-id", ""), 9)
        if mime == "video/rtx":
            return 3
        return 9

    return sorted((c for c in codecs if rank(c) < 9), key=rank)


def configure_video_bitrate(bitrate_bps: int) -> Callable[[], None]:
    """Sets aiortc's VP8/H.264 start bitrate and cap to ``bitrate_bps``; returns an undo."""
    from aiortc.codecs import h264, vpx

    if bitrate_bps <= 0:
        raise ValueError(f"bitrate_bps must be > 0, got {bitrate_bps}")
    saved = [
        (module, name, getattr(module, name))
        for module in (vpx, h264)
        for name in ("DEFAULT_BITRATE", "MIN_BITRATE", "MAX_BITRATE")
    ]
    vpx.DEFAULT_BITRATE = vpx.MAX_BITRATE = bitrate_bps
    vpx.MIN_BITRATE = min(vpx.MIN_BITRATE, bitrate_bps)
    h264.DEFAULT_BITRATE = h264.MAX_BITRATE = bitrate_bps
    h264.MIN_BITRATE = min(h264.MIN_BITRATE, bitrate_bps)

    def undo() -> None:
        for module, name, value in saved:
            setattr(module, name, value)

    return undo


def restrict_host_candidates(addresses: Sequence[str]) -> Callable[[], None]:
    """aioice gathers host candidates only on ``addresses``; returns an undo."""
    import aioice.ice

    allowed = list(addresses)
    original = aioice.ice.get_host_addresses

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in allowed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses

    def undo() -> None:
        aioice.ice.get_host_addresses = original

    return undo


def ice_server(spec: str) -> RTCIceServer:
    """An ``--ice-server`` value: a STUN/TURN URL, with TURN credentials written in it as
    ``turn:USER:PASSWORD@host:port[?transport=udp|tcp]`` (split at the last ``@``)."""
    scheme, _, rest = spec.partition(":")
    if "@" not in rest:
        return RTCIceServer(urls=spec)
    credentials, _, address = rest.rpartition("@")
    username, _, password = credentials.partition(":")
    return RTCIceServer(urls=f"{scheme}:{address}", username=username, credential=password)


class ViewerPeer:
    """The WebRTC peer connection of one viewer of one session (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        *,
        store: Store | None,
        ice_servers: Sequence[str] = (),
        limits: Limits | None = None,
        on_closed: Callable[[ViewerPeer], None] | None = None,
        pacer: FramePacer | None = None,
    ) -> None:
        self.session = session
        self.limits = limits = limits or Limits()
        config = RTCConfiguration(iceServers=[ice_server(spec) for spec in ice_servers])
        self.pc = RTCPeerConnection(configuration=config)
        self.track = SessionVideoTrack(session, pacer=pacer)
        self.inbox = ControlInbox(
            session,
            store=store,
            reply=self._send,
            rate_per_s=limits.control_rate_per_s,
            burst=limits.control_burst,
            max_bytes=limits.control_max_bytes,
        )
        self._on_closed = on_closed
        self._tasks = TaskSet(log, f"session {session.id}")
        self._channel: Any = None
        self._subscription = session.events.subscribe(after_id=session.events.last_id)
        self._closed = False
        self._audio_wanted = "input.audio" in session.config.capabilities
        self.audio_frames_in = 0
        self.audio_frames_dropped = 0
        self.events_dropped = 0
        self.connected = asyncio.Event()

        @self.pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if channel.label != CONTROL_LABEL:
                log.info("session %s: ignoring data channel %r", session.id, channel.label)
                return
            self._channel = channel
            channel.on("message", self._on_message)
            self._spawn(self._forward_events(channel), "events")

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio" and self._audio_wanted:
                self._spawn(self._ingest_audio(track), "audio")

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("session %s: peer connection %s", session.id, self.pc.connectionState)
            if self.pc.connectionState == "connected":
                session.latency.connected()  # ICE and DTLS are up
                self.connected.set()
            if self.pc.connectionState in ("failed", "closed"):
                await self.close()

    # ---------------------------------------------------------------- signalling

    async def answer(self, sdp: str) -> RTCSessionDescription:
        """Answers the offer ``sdp``; ``OfferError`` if it cannot be answered."""
        video = add_video_sender(self.pc, self.track, sdp)
        if "m=audio" in sdp:
            self.pc.addTransceiver(
                "audio", direction="recvonly" if self._audio_wanted else "inactive"
            )
        await apply_offer(self.pc, sdp)
        if video.currentDirection not in ("sendonly", "sendrecv"):
            raise OfferError(
                f"the offer's video m-line lets the server send nothing (answer direction "
                f"{video.currentDirection!r}); offer it recvonly"
            )
        local = self.pc.localDescription
        if self.limits.connect_timeout_s > 0:
            self._spawn(self._connect_watch(self.limits.connect_timeout_s), "connect")
        return RTCSessionDescription(sdp=local.sdp, type=local.type)

    async def _connect_watch(self, timeout_s: float) -> None:
        """Closes the peer when ICE + DTLS do not connect within ``timeout_s`` of the answer."""
        try:
            await asyncio.wait_for(self.connected.wait(), timeout_s)
        except TimeoutError:
            log.info(
                "session %s: viewer not connected %.0f s after the answer (state %s); closing",
                self.session.id,
                timeout_s,
                self.pc.connectionState,
            )
            # close() awaits this task's siblings; run it beside them, not inside this one
            asyncio.get_running_loop().create_task(
                self.close(), name=f"peer-{self.session.id}-timeout"
            )

    # ---------------------------------------------------------------- control channel

    def _send(self, payload: bytes) -> None:
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return
        if channel.bufferedAmount + len(payload) > self.limits.control_buffer_bytes:
            # the peer does not read (or cannot keep up): never queue without bound
            if self.events_dropped == 0:
                log.warning(
                    "session %s: viewer's data channel holds %d bytes unread; dropping events",
                    self.session.id,
                    channel.bufferedAmount,
                )
            self.events_dropped += 1
            return
        channel.send(payload.decode("utf-8"))

    async def _forward_events(self, channel: Any) -> None:
        """Every session event, in order, as one JSON text message (once the channel is open)."""
        opened = asyncio.Event()
        channel.on("open", opened.set)
        if channel.readyState == "open":
            opened.set()
        try:
            await opened.wait()
            async for event in self._subscription:
                if channel.readyState != "open":
                    break
                self._send(encode_event(event))
        finally:
            self._subscription.close()

    def _on_message(self, message: str | bytes) -> None:
        self.inbox.handle(message)

    # ---------------------------------------------------------------- audio from the viewer

    async def _ingest_audio(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=TARGET_RATE_HZ)
        pending: list[np.ndarray] = []
        pending_n = 0
        push_n = int(AUDIO_PUSH_S * TARGET_RATE_HZ)
        keep_n = max(push_n, int(self.limits.audio_buffer_s * TARGET_RATE_HZ))
        queued = getattr(track, "_queue", None)  # aiortc's RemoteStreamTrack: unbounded
        try:
            while True:
                while queued is not None and queued.qsize() > AUDIO_QUEUE_FRAMES:
                    queued.get_nowait()  # a peer sending faster than real time
                    self.audio_frames_dropped += 1
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):  # (an audio track sends no other)
                    continue
                self.audio_frames_in += 1
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1).astype(np.float32)  # [n] 16 kHz mono
                    pending.append(samples)
                    pending_n += samples.shape[0]
                while pending_n > keep_n and len(pending) > 1:  # not live: keep the newest only
                    pending_n -= pending.pop(0).shape[0]
                if pending_n >= push_n and self.session.playing:
                    clip = AudioClip(
                        np.clip(np.concatenate(pending), -1.0, 1.0),
                        frame.sample_rate,
                        len(frame.layout.channels),
                    )
                    pending, pending_n = [], 0
                    self.session.push_audio(clip)
        except MediaStreamError:
            log.debug("session %s: viewer audio ended", self.session.id)

    # ---------------------------------------------------------------- lifecycle

    def _spawn(self, coro: Any, what: str) -> None:
        self._tasks.spawn(coro, f"peer-{self.session.id}-{what}")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def task_count(self) -> int:
        return len(self._tasks)

    async def _drain_events(self, timeout_s: float = 1.0) -> None:
        """The session ended: let the last events (``closing``, ``closed``) reach the viewer."""
        forwarders = [t for t in self._tasks if t.get_name().endswith("-events")]
        if forwarders:
            await asyncio.wait(forwarders, timeout=timeout_s)
        channel = self._channel
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (
            channel is not None
            and channel.readyState == "open"
            and channel.bufferedAmount > 0
            and asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Idempotent: ends tasks, track and peer connection; the session pauses (no viewer).
        When the session itself ended, its last events are flushed to the viewer first."""
        if self._closed:
            return
        self._closed = True
        if self.session.events.closed:
            await self._drain_events()
        self._subscription.close()
        self.track.stop()
        await self._tasks.close()
        await self.inbox.close()
        await self.pc.close()
        if not self.session.terminal:
            self.session.viewer_left()
        if self._on_closed is not None:
            self._on_closed(self)
