"""An in-process ``RoomConnection`` for unit tests of the LiveKit sink, inputs and avatar."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import numpy as np

from server.livekit.room import ByteStreamHandler, RoomConnectError, RoomEvents, RpcHandler


class FakeRoom:
    def __init__(
        self,
        *,
        connect_error: str | None = None,
        capture_delay_s: float = 0.0,
        capture_fails_after: int | None = None,
    ) -> None:
        self.identity = ""
        self.capture_fails_after = capture_fails_after
        self.connect_error = connect_error
        self.capture_delay_s = capture_delay_s
        self.events: RoomEvents | None = None
        self.published: tuple[int, int, int, int] | None = None
        self.captured: list[tuple[int, int]] = []  # (first pixel value, timestamp_us)
        self.sent: list[tuple[bytes, str, tuple[str, ...]]] = []
        self.rpc_handlers: dict[str, RpcHandler] = {}
        self.rpc_calls: list[tuple[str, str, str]] = []
        self.byte_streams: dict[str, ByteStreamHandler] = {}
        self.disconnects = 0
        self.audio_rate: int | None = None
        self.audio: list[tuple[np.ndarray, int]] = []  # (int16 samples, timestamp_us)
        self.audio_clears = 0
        self.order: list[tuple[str, int]] = []  # ("video" | "audio", timestamp_us) as captured

    async def connect(self, url: str, token: str, events: RoomEvents) -> None:
        await asyncio.sleep(0)
        if self.connect_error is not None:
            raise RoomConnectError(self.connect_error)
        self.events = events
        self.identity = "dreamrt-test"

    async def publish_video(self, width: int, height: int, *, fps: int, bitrate_bps: int) -> None:
        self.published = (width, height, fps, bitrate_bps)

    def capture(self, rgb: np.ndarray, timestamp_us: int) -> None:
        if self.capture_delay_s:
            import time

            time.sleep(self.capture_delay_s)  # a slow encoder, in the sink's worker thread
        if self.capture_fails_after is not None and len(self.captured) >= self.capture_fails_after:
            raise RuntimeError("video source closed")
        self.captured.append((int(rgb[0, 0, 0]), timestamp_us))
        self.order.append(("video", timestamp_us))

    async def publish_audio(self, sample_rate: int) -> None:
        self.audio_rate = sample_rate

    async def capture_audio(self, pcm: np.ndarray, timestamp_us: int) -> None:
        assert self.audio_rate is not None, "audio captured before the track was published"
        self.audio.append((pcm.copy(), timestamp_us))
        self.order.append(("audio", timestamp_us))

    def clear_audio(self) -> None:
        self.audio_clears += 1

    async def wait_audio_playout(self) -> None:
        await asyncio.sleep(0)

    async def send(self, payload: bytes, *, topic: str, to: Sequence[str] = ()) -> None:
        self.sent.append((payload, topic, tuple(to)))

    def register_rpc(self, method: str, handler: RpcHandler) -> None:
        self.rpc_handlers[method] = handler

    async def perform_rpc(self, identity: str, method: str, payload: str) -> str:
        self.rpc_calls.append((identity, method, payload))
        return "ok"

    def register_byte_stream(self, topic: str, handler: ByteStreamHandler) -> None:
        self.byte_streams[topic] = handler

    async def disconnect(self) -> None:
        self.disconnects += 1

    # ---------------------------------------------------------------- test side

    def stream_bytes(
        self, topic: str, chunks: list[bytes], sender: str, attributes: Mapping[str, str]
    ) -> None:
        async def iterate() -> AsyncIterator[bytes]:
            for chunk in chunks:
                await asyncio.sleep(0)
                yield chunk

        self.byte_streams[topic](iterate(), sender, attributes)
