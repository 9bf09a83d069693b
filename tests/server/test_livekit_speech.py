"""The avatar's speech through the fake room: the worker publishes the agent's speech as its
audio track, sample for sample, in step with the frames it drove, and an interrupt empties the
audio and the frames together.

A small fake engine keeps a few one-frame chunks queued ahead of the wire and acknowledges each
audio input with the next chunk it emits, as a loop does (``audio.applied`` at that chunk's
PTS). The session and the pacer run on a fake clock, so nothing here waits on wall time.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np

from runtime.contract import AppliedMeta, Emission, EmitSpec, InputKind, MediaMeta, Stream
from server.live.frame_pacer import FramePacer
from server.livekit.avatar import RPC_CLEAR_BUFFER, RPC_PLAYBACK_FINISHED, RPC_PLAYBACK_STARTED
from server.livekit.participant import LiveKitParticipant
from server.livekit.speech import AUDIO_RATE_HZ, PUSH_S
from sessions.audio import resample
from sessions.events import AudioApplied
from sessions.session import Session, SessionConfig
from tests.server.fake_room import FakeRoom
from tests.server.test_media_track import FakeClock
from tests.sessions.fakes import FakeHandle

FPS = 16
TICKS = 90_000 // FPS
LEAD_FRAMES = 3  # frames the fake engine keeps queued ahead of the wire
AGENT = "agent-1"


def make(caps: set[str]) -> tuple[Session, FakeHandle, LiveKitParticipant, FakeRoom, FakeClock]:
    clock = FakeClock(100.0)
    config = SessionConfig(
        session_id="s",
        model_id="m",
        prompt="p",
        seed=0,
        fps=FPS,
        width=8,
        height=8,
        priority_class="realtime",
        capabilities=frozenset(caps),
    )
    session = Session(config, media_capacity_frames=64, clock=clock)
    handle = FakeHandle()
    session.attach(handle)
    room = FakeRoom()
    participant = LiveKitParticipant(
        session,
        room,
        url="ws://lk",
        room_name="lobby",
        token="t",
        pacer=FramePacer(session, clock=clock, sleep=clock.sleep),
        avatar_of=AGENT,
        clock=clock,
    )
    return session, handle, participant, room, clock


def frame_chunk(k: int) -> Emission:
    meta = MediaMeta(chunk=k, segment=0, frame_start=k, pts_90k=k * TICKS, num_frames=1, fps=FPS)
    return Emission(EmitSpec(Stream.MEDIA, meta), np.full((1, 8, 8, 3), k % 250, np.uint8))


async def fake_engine(session: Session, handle: FakeHandle, stop: asyncio.Event) -> None:
    """One-frame chunks, ``LEAD_FRAMES`` queued ahead; an audio input is applied at the next
    chunk emitted after it arrived."""
    k = 0
    applied: set[int] = set()
    while not stop.is_set() and not session.terminal:
        if len(session.media) < LEAD_FRAMES:
            for event in handle.inputs:
                if event.kind == "audio" and event.seq not in applied:
                    applied.add(event.seq)
                    # as chunk_rollout acknowledges audio: it never restarts a chunk, so its
                    # frames play in order (changes=False: nothing queued is flushed)
                    meta = AppliedMeta(
                        kind=InputKind.AUDIO,
                        seq=event.seq,
                        chunk=k,
                        pts_90k=k * TICKS,
                        changes=False,
                    )
                    session.on_emission(Emission(EmitSpec(Stream.APPLIED, meta), None))
            session.on_emission(frame_chunk(k))
            k += 1
        await asyncio.sleep(0)


async def until(predicate, steps: int = 200_000) -> None:
    """Yields to the event loop until ``predicate()`` (bounded in loop turns, not seconds)."""
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never met")


def stereo_speech(seconds: float, rate: int, seed: int) -> tuple[np.ndarray, bytes]:
    """Speech-like int16 noise, the same on both channels; (mono samples, interleaved PCM)."""
    mono = (np.random.default_rng(seed).standard_normal(int(seconds * rate)) * 4000).astype(
        np.int16
    )
    return mono, np.repeat(mono, 2).tobytes()


def published(room: FakeRoom) -> np.ndarray:
    return np.concatenate([pcm for pcm, _ in room.audio]) if room.audio else np.zeros(0, np.int16)


def sample_timestamps_us(room: FakeRoom) -> np.ndarray:
    """The timestamp of every published sample (its capture's timestamp plus its offset)."""
    parts = [ts + np.arange(pcm.shape[0]) * 1_000_000 // AUDIO_RATE_HZ for pcm, ts in room.audio]
    return np.concatenate(parts)


def chunks_of(pcm: bytes, n: int) -> list[bytes]:
    return [pcm[i : i + n] for i in range(0, len(pcm), n)]


def finished_payloads(room: FakeRoom) -> list[dict]:
    return [json.loads(p) for _, m, p in room.rpc_calls if m == RPC_PLAYBACK_FINISHED]


async def start(caps: set[str]):
    session, handle, participant, room, clock = make(caps)
    stop = asyncio.Event()
    participant.start()
    engine = asyncio.get_running_loop().create_task(fake_engine(session, handle, stop))
    await until(lambda: room.audio_rate is not None and len(room.captured) >= 4)
    return session, handle, participant, room, stop, engine


async def finish(participant: LiveKitParticipant, stop: asyncio.Event, engine) -> None:
    stop.set()
    await engine
    await participant.close()


async def test_speech_is_published_sample_exact_with_the_frames_it_drove() -> None:
    session, handle, participant, room, stop, engine = await start(
        {"prompt.switch", "prompt.cut", "input.audio"}
    )
    assert room.audio_rate == AUDIO_RATE_HZ
    assert set(room.rpc_handlers) == {RPC_CLEAR_BUFFER}
    assert not participant.wants_audio(AGENT)  # its speech comes as a byte stream
    speech, pcm = stereo_speech(2.0, 48_000, seed=1)
    # a TTS sends faster than real time: the whole segment arrives in a few turns
    room.stream_bytes(
        "lk.audio_stream",
        chunks_of(pcm, 9_600),
        AGENT,
        {"sample_rate": "48000", "num_channels": "2"},
    )
    await until(lambda: len(finished_payloads(room)) == 1)
    calls = [m for _, m, _ in room.rpc_calls]
    assert calls == [RPC_PLAYBACK_STARTED, RPC_PLAYBACK_FINISHED]
    assert finished_payloads(room) == [{"playback_position": 2.0, "interrupted": False}]

    out = published(room)
    assert out.dtype == np.int16 and np.array_equal(out, speech)  # both channels were equal

    # each 0.5 s block drove a frame; the sample that starts the block plays with that frame
    applied = {e.seq: e.pts for e in session.events.history() if isinstance(e, AudioApplied)}
    audio_seqs = [e.seq for e in handle.inputs if e.kind == "audio"]
    assert len(audio_seqs) == 4 and set(audio_seqs) <= set(applied)
    stamps = sample_timestamps_us(room)
    for k, seq in enumerate(audio_seqs):
        driven_us = applied[seq] * 1_000_000 // 90_000
        sample_us = int(stamps[int(k * PUSH_S * AUDIO_RATE_HZ)])
        assert abs(sample_us - driven_us) <= 100_000, (k, sample_us, driven_us)

    # ... and was captured right after that frame went to the room, never ahead of it
    last_video_us = None
    for kind, stamp in room.order:
        if kind == "video":
            last_video_us = stamp
        else:
            assert last_video_us is not None and abs(stamp - last_video_us) <= 100_000

    report = participant.avatar.speech.reports[-1]
    assert report.driven and report.delay_s is not None and report.delay_s > 0
    assert report.av_offset_ms is not None and abs(report.av_offset_ms) <= 100
    stats = participant.avatar.stats()
    assert stats["speech"]["segments"] == 1 and stats["speech"]["last"]["played_s"] == 2.0
    await finish(participant, stop, engine)


async def test_resampled_speech_equals_the_received_speech_resampled() -> None:
    _, _, participant, room, stop, engine = await start({"prompt.switch", "input.audio"})
    rate = 24_000
    mono = (np.random.default_rng(2).standard_normal(int(1.3 * rate)) * 3000).astype(np.int16)
    room.stream_bytes(
        "lk.audio_stream",
        chunks_of(mono.tobytes(), 2_000),
        AGENT,
        {"sample_rate": str(rate), "num_channels": "1"},
    )
    await until(lambda: len(finished_payloads(room)) == 1)
    # one resampling of the whole segment at once, written out here
    expected = resample(mono.astype(np.float32) / 32768.0, rate, AUDIO_RATE_HZ)
    expected = np.clip(np.round(expected * 32768.0), -32768, 32767).astype(np.int16)
    assert np.array_equal(published(room), expected)
    await finish(participant, stop, engine)


async def test_an_interrupt_empties_the_queued_audio_and_frames_together() -> None:
    session, handle, participant, room, stop, engine = await start(
        {"prompt.switch", "prompt.cut", "input.audio"}
    )
    _, pcm = stereo_speech(4.0, 48_000, seed=3)
    room.stream_bytes(
        "lk.audio_stream",
        chunks_of(pcm, 19_200),
        AGENT,
        {"sample_rate": "48000", "num_channels": "2"},
    )
    await until(lambda: published(room).shape[0] >= AUDIO_RATE_HZ // 2)  # 0.5 s played
    assert await room.rpc_handlers[RPC_CLEAR_BUFFER]("mallory", "") == "reject"
    stop.set()
    await engine
    # frames made but not shown yet: what the interrupt must drop with the audio
    next_k = session.media.last_pts // TICKS + 1
    for k in range(next_k, next_k + 4):
        session.on_emission(frame_chunk(k))
    assert len(session.media) >= 4
    assert await room.rpc_handlers[RPC_CLEAR_BUFFER](AGENT, "") == "ok"
    assert len(session.media) == 0 and room.audio_clears == 1
    played = published(room).shape[0]
    await until(lambda: len(finished_payloads(room)) == 1)
    (finished,) = finished_payloads(room)
    assert finished["interrupted"] is True
    assert 0.4 <= finished["playback_position"] <= played / AUDIO_RATE_HZ < 4.0
    assert handle.inputs[-1].kind == "prompt" and handle.inputs[-1].payload.mode.value == "cut"
    # the rest of the segment never plays, however long the video goes on
    stop = asyncio.Event()
    engine = asyncio.get_running_loop().create_task(fake_engine(session, handle, stop))
    frames = len(room.captured)
    await until(lambda: len(room.captured) >= frames + 20)
    assert published(room).shape[0] == played
    await finish(participant, stop, engine)


async def test_a_card_without_audio_input_still_plays_the_speech() -> None:
    _, handle, participant, room, stop, engine = await start({"prompt.switch"})
    speech, pcm = stereo_speech(1.0, 48_000, seed=4)
    room.stream_bytes(
        "lk.audio_stream",
        chunks_of(pcm, 9_600),
        AGENT,
        {"sample_rate": "48000", "num_channels": "2"},
    )
    await until(lambda: len(finished_payloads(room)) == 1)
    assert np.array_equal(published(room), speech)
    assert finished_payloads(room) == [{"playback_position": 1.0, "interrupted": False}]
    assert [e for e in handle.inputs if e.kind == "audio"] == []  # it drives nothing
    report = participant.avatar.speech.reports[-1]
    assert not report.driven and report.delay_s is None
    # between segments there is nothing to interrupt: no cut, no flush
    assert await room.rpc_handlers[RPC_CLEAR_BUFFER](AGENT, "") == "ok"
    assert handle.inputs == [] and room.audio_clears == 0
    await finish(participant, stop, engine)


def test_get_session_shows_the_avatar_speech(tmp_path) -> None:
    from tests.server.conftest import make_client

    with make_client(
        tmp_path, max_sessions=1, livekit_key="devkey", livekit_secret="s" * 40
    ) as client:
        client.app.state.ctx.room_factory = FakeRoom
        block = {"url": "ws://lk", "room": "lobby", "avatar_of": AGENT}
        created = client.post("/v1/sessions", json={"prompt": "a face", "livekit": block})
        assert created.status_code == 201, created.text
        view = client.get(f"/v1/sessions/{created.json()['id']}").json()
        assert view["avatar"] == {
            "agent": AGENT,
            "speech": {"segments": 0, "interrupted": 0, "rate_hz": AUDIO_RATE_HZ, "last": None},
        }
        client.delete(f"/v1/sessions/{created.json()['id']}")


async def test_the_room_adapter_queues_speech_in_a_real_audio_source_and_clears_it() -> None:
    from livekit import rtc

    from server.livekit.room import LiveKitRoom

    room = LiveKitRoom()
    # what publish_audio creates, without a server
    room._audio = rtc.AudioSource(AUDIO_RATE_HZ, 1, queue_size_ms=400)
    await room.capture_audio(np.arange(4_800, dtype=np.int16), 0)  # 0.1 s
    assert room._audio.queued_duration > 0
    room.clear_audio()
    assert room._audio.queued_duration == 0
    await room.disconnect()
