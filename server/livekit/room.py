"""The engine's seat in a LiveKit room: a small port (``RoomConnection``) and its adapter on
the official SDK (``LiveKitRoom``, the only module that touches ``livekit.rtc``).

The sink, the input bridge and the avatar convention talk to the port, so unit tests run them
against an in-process fake room; ``LiveKitRoom`` maps the port onto ``rtc.Room``:

- ``connect(url, token, events)``: registers the event callbacks, then joins; a refused, bad
  or timed-out join raises ``RoomConnectError`` naming the SDK's cause (the SDK retries 3 times
  by itself; ``connect_timeout_s`` bounds the whole join so it can never hang).
- ``publish_video``: ``rtc.VideoSource`` + ``LocalVideoTrack`` (camera source, simulcast off,
  one encoding at the profile's fps and ``bitrate_bps``); ``capture(rgb, timestamp_us)``
  converts a ``[H, W, 3]`` uint8 frame to I420 through the SDK's FFI and captures it. It may
  run in a worker thread (the FFI is thread-safe), so conversion never stalls the event loop.
- Inputs: data packets and text streams on ``control_topic`` reach ``events.on_data`` (a text
  stream is read up to ``max_text_bytes`` + 1: an oversize one still reaches the validator,
  which refuses it); every subscribed audio track reaches ``events.on_audio`` as an async
  iterator of 16 kHz mono float32 blocks from ``rtc.AudioStream`` (only audio tracks
  ``events.wants_audio`` accepts are subscribed; bounded: ``capacity``
  frames, the oldest dropped by the SDK when the reader lags). Byte streams and RPC methods
  are registered for the avatar convention.
- Avatar speech out: ``publish_audio`` (``rtc.AudioSource``, mono, a short queue, microphone
  source) and ``capture_audio(pcm, timestamp_us)``; ``clear_audio`` drops what is queued,
  ``wait_audio_playout`` returns once the queue played out.
- Room state: ``reconnecting`` / ``reconnected`` / ``disconnected`` (with the SDK's
  ``DisconnectReason`` name) reach ``events.on_state``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from runtime.task_set import TaskSet

if TYPE_CHECKING:
    from livekit import rtc

__all__ = [
    "CONTROL_TOPIC",
    "LiveKitRoom",
    "RoomConnectError",
    "RoomConnection",
    "RoomEvents",
    "i420_frame",
    "publish_options",
    "rtc_audio_frame",
]

log = logging.getLogger(__name__)

CONTROL_TOPIC = "dreamrt.control"
AUDIO_RATE_HZ = 16_000
_AUDIO_QUEUE_MS = 400

# (caller identity, payload) -> response payload
RpcHandler = Callable[[str, str], Awaitable[str]]
# (chunks, sender identity, stream attributes)
ByteStreamHandler = Callable[[AsyncIterator[bytes], str, Mapping[str, str]], None]


class RoomConnectError(RuntimeError):
    """Joining the room failed (refused, bad URL, bad token, timeout); the message says why."""


class RoomEvents(Protocol):
    """What a room reports to its owner (``server.livekit.participant``)."""

    def on_data(self, payload: bytes, sender: str) -> None: ...

    def wants_audio(self, identity: str) -> bool: ...

    def on_audio(self, identity: str, blocks: AsyncIterator[np.ndarray]) -> None: ...

    def on_state(self, state: str, reason: str) -> None: ...


class RoomConnection(Protocol):
    """The port: what dreamrt needs of a room participant (see module doc)."""

    identity: str

    async def connect(self, url: str, token: str, events: RoomEvents) -> None: ...

    async def publish_video(
        self, width: int, height: int, *, fps: int, bitrate_bps: int
    ) -> None: ...

    def capture(self, rgb: np.ndarray, timestamp_us: int) -> None: ...

    async def publish_audio(self, sample_rate: int) -> None: ...

    async def capture_audio(self, pcm: np.ndarray, timestamp_us: int) -> None: ...

    def clear_audio(self) -> None: ...

    async def wait_audio_playout(self) -> None: ...

    async def send(self, payload: bytes, *, topic: str, to: Sequence[str] = ()) -> None: ...

    def register_rpc(self, method: str, handler: RpcHandler) -> None: ...

    async def perform_rpc(self, identity: str, method: str, payload: str) -> str: ...

    def register_byte_stream(self, topic: str, handler: ByteStreamHandler) -> None: ...

    async def disconnect(self) -> None: ...


def i420_frame(rgb: np.ndarray) -> rtc.VideoFrame:
    """``rtc.VideoFrame`` in I420 of one frame. # rgb: [H, W, 3] uint8 (even H and W)."""
    from livekit import rtc

    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected uint8 [H, W, 3], got {rgb.dtype} {tuple(rgb.shape)}")
    height, width = rgb.shape[:2]
    frame = rtc.VideoFrame(
        width, height, rtc.VideoBufferType.RGB24, np.ascontiguousarray(rgb).tobytes()
    )
    return frame.convert(rtc.VideoBufferType.I420)


def rtc_audio_frame(pcm: np.ndarray, sample_rate: int) -> rtc.AudioFrame:
    """``rtc.AudioFrame`` of mono int16 samples. # pcm: [n] int16"""
    from livekit import rtc

    if pcm.ndim != 1 or pcm.dtype != np.int16:
        raise ValueError(f"expected int16 [n], got {pcm.dtype} {tuple(pcm.shape)}")
    data = np.ascontiguousarray(pcm).tobytes()
    return rtc.AudioFrame(data, sample_rate, 1, pcm.shape[0])


def publish_options(fps: int, bitrate_bps: int) -> rtc.TrackPublishOptions:
    """Camera source, simulcast off, one encoding capped at ``fps`` and ``bitrate_bps``."""
    from livekit import rtc

    return rtc.TrackPublishOptions(
        source=rtc.TrackSource.SOURCE_CAMERA,
        simulcast=False,
        video_encoding=rtc.VideoEncoding(max_framerate=float(fps), max_bitrate=bitrate_bps),
    )


class LiveKitRoom:
    """``RoomConnection`` on ``livekit.rtc.Room`` (see module doc). Construct, then connect."""

    def __init__(
        self,
        *,
        control_topic: str = CONTROL_TOPIC,
        connect_timeout_s: float = 10.0,
        audio_capacity_frames: int = 50,
        max_text_bytes: int = 16 * 1024,
    ) -> None:
        self.identity = ""
        self._control_topic = control_topic
        self._connect_timeout_s = connect_timeout_s
        self._audio_capacity = audio_capacity_frames
        self._max_text_bytes = max_text_bytes
        self._room: rtc.Room | None = None
        self._source: rtc.VideoSource | None = None
        self._audio: rtc.AudioSource | None = None
        self._events: RoomEvents | None = None
        self._tasks = TaskSet()
        self._rpc: dict[str, RpcHandler] = {}
        self._byte_streams: dict[str, ByteStreamHandler] = {}

    # ---------------------------------------------------------------- joining

    async def connect(self, url: str, token: str, events: RoomEvents) -> None:
        from livekit import rtc

        self._events = events
        room = self._room = rtc.Room()
        room.on("data_received", self._on_packet)
        room.on("track_published", self._on_published)
        room.on("track_subscribed", self._on_track)
        room.on("reconnecting", lambda: events.on_state("reconnecting", ""))
        room.on("reconnected", lambda: events.on_state("reconnected", ""))
        room.on("disconnected", self._on_disconnected)
        room.register_text_stream_handler(self._control_topic, self._on_text_stream)
        for topic, handler in self._byte_streams.items():
            room.register_byte_stream_handler(topic, self._byte_stream_adapter(handler))
        # Only the audio tracks the session hears are subscribed (never other video).
        options = rtc.RoomOptions(auto_subscribe=False, connect_timeout=self._connect_timeout_s)
        try:
            await asyncio.wait_for(room.connect(url, token, options), self._connect_timeout_s * 2)
        except rtc.ConnectError as exc:
            raise RoomConnectError(exc.message if hasattr(exc, "message") else str(exc)) from None
        except TimeoutError:
            raise RoomConnectError(
                f"no answer from {url} within {self._connect_timeout_s * 2:g} s"
            ) from None
        self.identity = room.local_participant.identity
        for participant in room.remote_participants.values():
            for publication in participant.track_publications.values():
                self._on_published(publication, participant)
        for method, answer in self._rpc.items():
            self._register_rpc_now(method, answer)

    def _joined(self) -> rtc.Room:
        if self._room is None:
            raise RuntimeError("not in a room: connect first")
        return self._room

    def _on_disconnected(self, reason: rtc.DisconnectReason.ValueType) -> None:
        from livekit import rtc

        try:
            name = rtc.DisconnectReason.Name(reason)
        except (ValueError, TypeError):
            name = str(reason)
        if self._events is not None:
            self._events.on_state("disconnected", name)

    # ---------------------------------------------------------------- video out

    async def publish_video(self, width: int, height: int, *, fps: int, bitrate_bps: int) -> None:
        from livekit import rtc

        self._source = rtc.VideoSource(width, height)
        track = rtc.LocalVideoTrack.create_video_track("dreamrt", self._source)
        await self._joined().local_participant.publish_track(
            track, publish_options(fps, bitrate_bps)
        )

    def capture(self, rgb: np.ndarray, timestamp_us: int) -> None:
        source = self._source
        if source is not None:
            source.capture_frame(i420_frame(rgb), timestamp_us=timestamp_us)

    # ---------------------------------------------------------------- audio out (avatar speech)

    async def publish_audio(self, sample_rate: int) -> None:
        from livekit import rtc

        # a short queue: the speech is captured frame by frame with the video it belongs to,
        # so what waits here is at most about one video frame of audio
        self._audio = rtc.AudioSource(sample_rate, 1, queue_size_ms=_AUDIO_QUEUE_MS)
        track = rtc.LocalAudioTrack.create_audio_track("dreamrt-speech", self._audio)
        options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        await self._joined().local_participant.publish_track(track, options)

    async def capture_audio(self, pcm: np.ndarray, timestamp_us: int) -> None:
        """Queues mono int16 ``pcm`` (LiveKit audio carries no capture time: ``timestamp_us``
        only orders it; when it is captured is what keeps it with its frames)."""
        source = self._audio
        if source is None or pcm.shape[0] == 0:
            return
        frame = rtc_audio_frame(pcm, source.sample_rate)
        await source.capture_frame(frame)

    def clear_audio(self) -> None:
        if self._audio is not None:
            self._audio.clear_queue()

    async def wait_audio_playout(self) -> None:
        if self._audio is not None:
            await self._audio.wait_for_playout()

    # ---------------------------------------------------------------- data

    async def send(self, payload: bytes, *, topic: str, to: Sequence[str] = ()) -> None:
        room = self._room
        if room is None or not room.isconnected():
            return
        await room.local_participant.publish_data(
            payload, reliable=True, topic=topic, destination_identities=list(to)
        )

    def _on_packet(self, packet: rtc.DataPacket) -> None:
        if packet.topic != self._control_topic or self._events is None:
            return
        sender = packet.participant.identity if packet.participant is not None else ""
        self._events.on_data(bytes(packet.data), sender)

    def _on_text_stream(self, reader: rtc.TextStreamReader, sender: str) -> None:
        self._spawn(self._read_text(reader, sender), "text")

    async def _read_text(self, reader: rtc.TextStreamReader, sender: str) -> None:
        parts: list[bytes] = []
        size = 0
        async for chunk in reader:
            data = chunk.encode("utf-8")
            parts.append(data)
            size += len(data)
            if size > self._max_text_bytes:
                break  # enough to be refused as too large; the rest is never buffered
        if self._events is not None:
            self._events.on_data(b"".join(parts), sender)

    # ---------------------------------------------------------------- audio in

    def _on_published(
        self, publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        from livekit import rtc

        events = self._events
        if publication.kind != rtc.TrackKind.KIND_AUDIO or events is None:
            return
        if events.wants_audio(participant.identity):
            publication.set_subscribed(True)

    def _on_track(
        self,
        track: rtc.Track,
        publication: rtc.RemoteTrackPublication,
        participant: rtc.RemoteParticipant,
    ) -> None:
        from livekit import rtc

        events = self._events
        if track.kind != rtc.TrackKind.KIND_AUDIO or events is None:
            return
        if not events.wants_audio(participant.identity):
            return
        stream = rtc.AudioStream.from_track(
            track=track,
            sample_rate=AUDIO_RATE_HZ,
            num_channels=1,
            capacity=self._audio_capacity,
        )
        events.on_audio(participant.identity, _audio_blocks(stream))

    # ---------------------------------------------------------------- RPC and byte streams

    def register_rpc(self, method: str, handler: RpcHandler) -> None:
        self._rpc[method] = handler
        if self._room is not None and self._room.isconnected():
            self._register_rpc_now(method, handler)

    def _register_rpc_now(self, method: str, handler: RpcHandler) -> None:
        async def invoke(data: rtc.RpcInvocationData) -> str:
            return await handler(data.caller_identity, data.payload)

        self._joined().local_participant.register_rpc_method(method, invoke)

    async def perform_rpc(self, identity: str, method: str, payload: str) -> str:
        return await self._joined().local_participant.perform_rpc(
            destination_identity=identity, method=method, payload=payload
        )

    def register_byte_stream(self, topic: str, handler: ByteStreamHandler) -> None:
        self._byte_streams[topic] = handler
        if self._room is not None:
            self._room.register_byte_stream_handler(topic, self._byte_stream_adapter(handler))

    @staticmethod
    def _byte_stream_adapter(
        handler: ByteStreamHandler,
    ) -> Callable[[rtc.ByteStreamReader, str], None]:
        def opened(reader: rtc.ByteStreamReader, sender: str) -> None:
            handler(reader.__aiter__(), sender, dict(reader.info.attributes or {}))

        return opened

    # ---------------------------------------------------------------- leaving

    def _spawn(self, coro: Coroutine[object, None, None], what: str) -> None:
        self._tasks.spawn(coro, f"livekit-room-{what}")

    async def disconnect(self) -> None:
        """Leaves the room (idempotent); the SDK then reports ``disconnected``."""
        self._tasks.cancel()
        room, self._room = self._room, None
        self._events = None
        if room is not None:
            try:
                await room.disconnect()
            except Exception:  # leaving must not fail the caller's close
                log.warning("LiveKit disconnect failed", exc_info=True)
        if self._source is not None:
            await self._source.aclose()
            self._source = None
        if self._audio is not None:
            await self._audio.aclose()
            self._audio = None


async def _audio_blocks(stream: rtc.AudioStream) -> AsyncIterator[np.ndarray]:
    """16 kHz mono float32 blocks of an ``rtc.AudioStream``. # yields: [n] float32 in [-1, 1]"""
    try:
        async for event in stream:
            pcm = np.frombuffer(event.frame.data, dtype=np.int16)
            yield pcm.astype(np.float32) / 32768.0
    finally:
        await stream.aclose()
