"""A real LiveKit room: runs when LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET are set
(e.g. ``livekit-server --dev``: ws://127.0.0.1:7880, devkey/secret); skipped otherwise.

A real ``dreamrt serve`` subprocess joins the room for a session; a second participant (the
SDK, ``clients.livekit.room_app``) receives its video, sends a prompt and audio; an agent
written with the SDK streams speech to an avatar session and hears it on the worker's audio
track.
"""

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from livekit import api, rtc

from clients.livekit.room_app import run
from clients.python.api import DreamrtClient
from infra.browser_harness import ServerProcess

pytestmark = pytest.mark.slow

_ENV = ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET")
_MISSING = [name for name in _ENV if not os.environ.get(name)]
if _MISSING:
    print(f"LiveKit integration tests skipped: {', '.join(_MISSING)} not set")
    pytestmark = [
        pytest.mark.slow,
        pytest.mark.skip(reason=f"no LiveKit server: set {', '.join(_MISSING)}"),
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("livekit")
    srv = ServerProcess(tmp / "data", tmp / "server.log").start()  # keys from the environment
    yield srv
    srv.stop(timeout_s=20.0)
    log = Path(srv.log_path).read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]


async def test_a_room_participant_sees_the_session_and_steers_it(server: ServerProcess) -> None:
    report = await run(
        dreamrt_url=server.url,
        livekit_url=os.environ["LIVEKIT_URL"],
        room_name=f"dreamrt-test-{os.getpid()}",
        api_key=os.environ["LIVEKIT_API_KEY"],
        api_secret=os.environ["LIVEKIT_API_SECRET"],
        seconds=3.0,
        send_audio=True,
        verbose=False,
    )
    # frames arrive and their media timestamps go forward (the room's fps is a benchmark's)
    stamps = report.frame_timestamps_us
    assert len(stamps) > report.profile["fps"], f"{len(stamps)} frames"
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 1_000_000
    assert report.acks(1)[:1] == ["input.received"] and "prompt.applied" in report.acks(1)
    assert report.audio_seconds_sent == 1.0


async def test_an_avatar_speaks_the_agents_speech_in_the_room(server: ServerProcess) -> None:
    """The agent side of the avatar convention, written with the SDK: the worker publishes the
    agent's speech as its own audio track, and reports its playout by RPC."""
    room_name = f"dreamrt-avatar-{os.getpid()}"
    agent = f"agent-{os.getpid()}"
    grants = api.VideoGrants(
        room_join=True, room=room_name, can_publish=True, can_subscribe=True, can_publish_data=True
    )
    token = (
        api.AccessToken(os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"])
        .with_identity(agent)
        .with_grants(grants)
        .to_jwt()
    )
    room = rtc.Room()
    heard: list[np.ndarray] = []
    finished: asyncio.Future = asyncio.get_running_loop().create_future()
    started = asyncio.Event()
    tracks: dict[str, rtc.Track] = {}
    got_tracks = asyncio.Event()

    async def listen(track: rtc.Track) -> None:
        async for event in rtc.AudioStream(track, sample_rate=48_000, num_channels=1):
            heard.append(np.frombuffer(event.frame.data, dtype=np.int16).copy())

    @room.on("track_subscribed")
    def on_track(track: rtc.Track, pub: object, participant: rtc.RemoteParticipant) -> None:
        if participant.identity.startswith("dreamrt-"):
            tracks["video" if track.kind == rtc.TrackKind.KIND_VIDEO else "audio"] = track
            if len(tracks) == 2:
                got_tracks.set()

    await room.connect(os.environ["LIVEKIT_URL"], token)
    room.local_participant.register_rpc_method(
        "lk.playback_started", lambda data: started.set() or ""
    )
    room.local_participant.register_rpc_method(
        "lk.playback_finished",
        lambda data: finished.done() or finished.set_result(json.loads(data.payload)) or "",
    )
    async with DreamrtClient(server.url) as client:
        created = await client.create_session(
            "a friendly robot face",
            livekit={"url": os.environ["LIVEKIT_URL"], "room": room_name, "avatar_of": agent},
        )
        worker = f"dreamrt-{created['id']}"
        try:
            await asyncio.wait_for(got_tracks.wait(), 60)  # its video and its speech track
            listener = asyncio.create_task(listen(tracks["audio"]))
            rate, seconds = 24_000, 1.5
            t = np.arange(int(rate * seconds)) / rate
            tone = (np.sin(2 * np.pi * 440.0 * t) * 12_000).astype(np.int16)
            writer = await room.local_participant.stream_bytes(
                "speech",
                topic="lk.audio_stream",
                attributes={"sample_rate": str(rate), "num_channels": "1"},
                destination_identities=[worker],
            )
            for i in range(0, tone.shape[0], 2_400):
                await writer.write(tone[i : i + 2_400].tobytes())
            await writer.aclose()
            report = await asyncio.wait_for(finished, 30)
            assert started.is_set()
            assert report == {"playback_position": seconds, "interrupted": False}
            view = await client.session(created["id"])
            last = view["avatar"]["speech"]["last"]
            assert last["played_s"] == seconds and last["driven"] and last["delay_s"] is not None

            async def all_heard() -> None:  # the room's jitter buffer hands over the last frames
                while sum(int((np.abs(h) > 3_000).sum()) for h in heard) < 0.8 * seconds * 48_000:
                    await asyncio.sleep(0.05)

            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_heard(), 10)
            listener.cancel()
        finally:
            await client.delete_session(created["id"])
    await room.disconnect()
    audio = np.concatenate(heard).astype(np.float32)
    loud = np.abs(audio) > 3_000
    assert loud.sum() >= 0.8 * seconds * 48_000, "the speech track did not carry the speech"
    piece = audio[loud.argmax() : loud.argmax() + 48_000]
    peak_hz = np.abs(np.fft.rfft(piece)).argmax() * 48_000 / piece.shape[0]
    assert abs(peak_hz - 440.0) < 10, f"the track's tone is {peak_hz:.0f} Hz, the agent's 440 Hz"
