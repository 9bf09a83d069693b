import asyncio
import time

from server.live.frame_pacer import FramePacer
from server.livekit.sink import LiveKitVideoSink, timestamp_us, video_bitrate_bps
from server.media.track import SessionVideoTrack
from tests.server.fake_room import FakeRoom
from tests.server.test_media_track import FPS, FakeClock, N, chunk, make_live_session, pull


def test_timestamps_are_the_pts_in_microseconds_and_bitrate_follows_the_profile() -> None:
    assert [timestamp_us(p) for p in (0, 1, 1800, 90_000)] == [0, 11, 20_000, 1_000_000]
    low, high = video_bitrate_bps(320, 176, 16), video_bitrate_bps(1280, 720, 16)
    assert 150_000 <= low < high <= 6_000_000
    assert video_bitrate_bps(1920, 1080, 60) == 6_000_000


async def wait_for(predicate, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_sink_publishes_paced_frames_with_timestamps_from_pts() -> None:
    session, handle = make_live_session(time.monotonic)
    for k in range(3):
        session.on_emission(chunk(k))
    room = FakeRoom()
    sink = LiveKitVideoSink(FramePacer(session), room)
    sink.start()
    await wait_for(lambda: len(room.captured) >= 3 * N)
    await sink.close()
    got = room.captured[: 3 * N]
    assert [ts for _, ts in got] == [timestamp_us(i * 90_000 // FPS) for i in range(3 * N)]
    assert [value for value, _ in got] == [i // N for i in range(3 * N)]
    assert session.state.value == "live" and ("resume",) in handle.calls
    assert session.frames_sent >= 3 * N and sink.dropped == 0


async def test_webrtc_track_and_livekit_sink_share_one_pacing() -> None:
    session, _ = make_live_session(time.monotonic)
    for k in range(4):
        session.on_emission(chunk(k))
    pacer = FramePacer(session)
    track = SessionVideoTrack(session, pacer=pacer)
    room = FakeRoom()
    sink = LiveKitVideoSink(pacer, room)
    sink.start()
    wire = [(await track.recv()).pts for _ in range(4 * N)]
    await wait_for(lambda: room.captured and room.captured[-1][1] == timestamp_us(wire[-1]))
    await sink.close()
    # every frame went out once on the session's playout, to both sinks, with the same PTS (a
    # sink joining while a slot is being paced starts at the newest frame: at most one missed)
    assert wire == [i * 90_000 // FPS for i in range(4 * N)]
    stamps = [ts for _, ts in room.captured]
    assert stamps == [timestamp_us(p) for p in wire[len(wire) - len(stamps) :]]
    assert len(stamps) >= 4 * N - 1
    assert pacer.fresh_frames == 4 * N and session.stalls == 0
    # the WebRTC viewer leaving does not pause a session a LiveKit sink still watches
    track.stop()
    session.viewer_left()
    assert session.state.value == "live"


async def test_a_sink_that_cannot_keep_up_drops_frames_and_never_slows_the_other() -> None:
    clock = FakeClock()  # the pacer's slots; the slow encoder blocks its thread in real time
    session, _ = make_live_session(clock)
    for k in range(6):
        session.on_emission(chunk(k))
    pacer = FramePacer(session, clock=clock, sleep=clock.sleep)
    track = SessionVideoTrack(session, pacer=pacer)
    room = FakeRoom(capture_delay_s=0.1)
    sink = LiveKitVideoSink(pacer, room)
    sink.start()
    sent = await pull(track, clock, 6 * N)
    # counted now: once the media queue is empty, a frame the sink still pulls is a repeat
    stalls_while_streaming = session.stalls
    await wait_for(lambda: sink.frames_published >= 2)  # its next frame after a slow capture
    await sink.close()
    # the WebRTC viewer got every frame at its slot of the profile's pace, while the sink,
    # busy in its first capture, dropped the frames it could not take
    assert [pts for pts, _, _ in sent] == [i * 90_000 // FPS for i in range(6 * N)]
    assert [at_s for _, _, at_s in sent] == [i / FPS for i in range(6 * N)]
    assert stalls_while_streaming == 0
    assert sink.dropped > 0 and sink.frames_published < 6 * N
    stamps = [ts for _, ts in room.captured]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


async def test_close_waits_for_the_frame_in_flight() -> None:
    session, _ = make_live_session(time.monotonic)
    session.on_emission(chunk(0))
    room = FakeRoom(capture_delay_s=0.2)
    sink = LiveKitVideoSink(FramePacer(session), room)
    sink.start()
    await asyncio.sleep(0.05)  # the first capture is in the worker thread now
    await sink.close()
    after_close = len(room.captured)
    await asyncio.sleep(0.3)
    assert after_close == 1 and len(room.captured) == 1
    await sink.close()  # idempotent


async def test_a_sink_that_raises_ends_alone_and_the_session_knows() -> None:
    session, handle = make_live_session(time.monotonic)
    for k in range(4):
        session.on_emission(chunk(k))
    pacer = FramePacer(session)
    track = SessionVideoTrack(session, pacer=pacer)
    sink = LiveKitVideoSink(pacer, FakeRoom(capture_fails_after=3))
    sink.start()
    wire = [(await track.recv()).pts for _ in range(4 * N)]
    assert wire == [i * 90_000 // FPS for i in range(4 * N)]  # the other viewer kept its pace
    errors = [e for e in session.events.history() if type(e).__name__ == "ErrorEvent"]
    assert [e.code for e in errors] == ["sink_failed"] and "video source closed" in errors[
        0
    ].message
    assert session.state.value == "live"  # the WebRTC viewer still watches
    track.stop()
    session.viewer_left()
    assert session.state.value == "paused"  # nobody watches: the dead sink does not count
    await sink.close()
