"""The SDK adapter through the real ``livekit`` FFI (no LiveKit server: a closed local port)."""

import socket

import numpy as np
import pytest
from livekit import rtc

from server.livekit.room import (
    CONTROL_TOPIC,
    LiveKitRoom,
    RoomConnectError,
    i420_frame,
    publish_options,
)
from server.livekit.sink import timestamp_us


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


class NoEvents:
    def on_data(self, payload, sender): ...
    def wants_audio(self, identity):
        return False

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
    with pytest.raises(RoomConnectError, match="(?i)refused|connect") as refused:
        await room.connect(f"ws://127.0.0.1:{closed_port()}", "not-a-token", NoEvents())
    # the refusal itself, not our wait for an answer running out ("no answer from ...")
    assert "no answer" not in str(refused.value)
    await room.disconnect()  # idempotent after a failed join


def test_publish_options_turn_simulcast_off_and_cap_fps_and_bitrate() -> None:
    options = publish_options(16, 400_000)
    assert options.simulcast is False and options.source == rtc.TrackSource.SOURCE_CAMERA
    assert options.video_encoding.max_framerate == 16.0
    assert options.video_encoding.max_bitrate == 400_000


def test_capture_feeds_a_real_video_source_with_the_pts_timestamp() -> None:
    room = LiveKitRoom()
    room._source = rtc.VideoSource(64, 36)  # what publish_video creates, without a server
    rgb = np.full((36, 64, 3), 128, dtype=np.uint8)
    for pts in (0, 5625, 11250):
        room.capture(rgb, timestamp_us(pts))  # raises if the FFI refuses the frame


class Recorder(NoEvents):
    def __init__(self) -> None:
        self.data = []

    def on_data(self, payload, sender):
        self.data.append((payload, sender))


class Packet:
    def __init__(self, data: bytes, topic: str, identity: str) -> None:
        self.data, self.topic = data, topic
        self.participant = type("P", (), {"identity": identity})()


async def test_control_packets_and_bounded_text_streams_reach_the_events() -> None:
    events = Recorder()
    room = LiveKitRoom(max_text_bytes=100)
    room._events = events
    room._on_packet(Packet(b'{"type":"ping","t":1}', CONTROL_TOPIC, "alice"))
    room._on_packet(Packet(b"other", "another.topic", "alice"))

    async def chunks(parts):
        for part in parts:
            yield part

    await room._read_text(chunks(['{"type":', '"pause"}']), "bob")
    await room._read_text(chunks(["x" * 60] * 10), "eve")  # stops reading past the limit
    assert events.data[:2] == [
        (b'{"type":"ping","t":1}', "alice"),
        (b'{"type":"pause"}', "bob"),
    ]
    assert events.data[2][1] == "eve" and 100 < len(events.data[2][0]) <= 160


class Publication:
    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.subscribed = False

    def set_subscribed(self, subscribed: bool) -> None:
        self.subscribed = subscribed


def test_only_the_audio_tracks_the_session_hears_are_subscribed() -> None:
    class Hears(NoEvents):
        def wants_audio(self, identity):
            return identity == "mic"

    room = LiveKitRoom()
    room._events = Hears()
    mic = type("P", (), {"identity": "mic"})()
    other = type("P", (), {"identity": "other"})()
    audio, video, others = (
        Publication(rtc.TrackKind.KIND_AUDIO),
        Publication(rtc.TrackKind.KIND_VIDEO),
        Publication(rtc.TrackKind.KIND_AUDIO),
    )
    room._on_published(audio, mic)
    room._on_published(video, mic)
    room._on_published(others, other)
    assert (audio.subscribed, video.subscribed, others.subscribed) == (True, False, False)


async def test_a_malformed_url_is_a_connect_error_too() -> None:
    with pytest.raises(RoomConnectError, match="(?i)url"):
        await LiveKitRoom(connect_timeout_s=5.0).connect("not a url", "t", NoEvents())
