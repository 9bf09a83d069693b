"""The SDK adapter through the real ``livekit`` FFI (no LiveKit server: a closed local port)."""

import socket
import time

import numpy as np
import pytest
from livekit import rtc

from server.livekit_room import LiveKitRoom, RoomConnectError, i420_frame


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


class NoEvents:
    def on_data(self, payload, sender): ...
    def wants_audio(self, identity): return False
    def on_audio(self, identity, blocks): ...
    def on_state(self, state, reason): ...


def test_our_frames_become_i420_video_frames_through_the_ffi() -> None:
    rgb = np.zeros((36, 64, 3), dtype=np.uint8)
    rgb[:18] = (255, 255, 255)  # top half white, bottom half black
    frame = i420_frame(rgb)
    assert frame.type == rtc.VideoBufferType.I420
    assert (frame.width, frame.height) == (64, 36)
    assert len(frame.data) == 64 * 36 * 3 // 2
    y = np.frombuffer(frame.get_plane(0), dtype=np.uint8).reshape(36, 64)
    assert y[:18].min() > 200 and y[18:].max() < 40  # luma follows the picture
    with pytest.raises(ValueError, match="uint8"):
        i420_frame(rgb.astype(np.float32))


async def test_a_refused_connect_raises_room_connect_error_quickly() -> None:
    room = LiveKitRoom(connect_timeout_s=5.0)
    start = time.monotonic()
    with pytest.raises(RoomConnectError, match="(?i)refused|connect"):
        await room.connect(f"ws://127.0.0.1:{closed_port()}", "not-a-token", NoEvents())
    assert time.monotonic() - start < 5.0
    await room.disconnect()  # idempotent after a failed join
