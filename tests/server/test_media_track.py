"""The paced video track on a fake clock: exact send times, no wall-clock timing."""

import asyncio
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from runtime.contract import AppliedMeta, Emission, EmitSpec, InputKind, MediaMeta, Stream
from server.media.track import SessionVideoTrack
from sessions.session import Session, SessionConfig
from tests.sessions.fakes import FakeHandle

FPS = 16  # 1/16 s and 5625 ticks per frame: every send time is an exact binary fraction
FRAME_S = 1 / FPS
TICKS = 90_000 // FPS
N = 5  # frames per chunk


@dataclass
class FakeClock:
    """The track's and the session's time. ``sleep`` lets ``dt_s`` pass at once (and yields
    once to the event loop), so the test decides when frames arrive, in frame slots."""

    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, dt_s: float) -> None:
        self.now_s += max(0.0, dt_s)
        await asyncio.sleep(0)


def make_live_session(clock: FakeClock) -> tuple[Session, FakeHandle]:
    config = SessionConfig(
        session_id="s",
        model_id="m",
        prompt="p",
        seed=0,
        fps=FPS,
        width=8,
        height=8,
        priority_class="realtime",
        capabilities=frozenset({"prompt.switch"}),
    )
    session = Session(config, media_capacity_frames=64, clock=clock)
    handle = FakeHandle()
    session.attach(handle)
    session.begin_negotiation()
    return session, handle


def make_track(session: Session, clock: FakeClock) -> SessionVideoTrack:
    return SessionVideoTrack(session, clock=clock, sleep=clock.sleep)


def chunk(k: int) -> Emission:
    frames = np.full((N, 8, 8, 3), k, dtype=np.uint8)
    meta = MediaMeta(
        chunk=k, segment=0, frame_start=k * N, pts_90k=k * N * TICKS, num_frames=N, fps=FPS
    )
    return Emission(EmitSpec(Stream.MEDIA, meta), frames)


async def pull(track: SessionVideoTrack, clock: FakeClock, n: int) -> list[tuple[int, int, float]]:
    """``n`` frames as (wire pts, chunk value of the picture, send time)."""
    out = []
    for _ in range(n):
        frame = await asyncio.wait_for(track.recv(), 5.0)
        out.append((frame.pts, int(frame.to_ndarray(format="rgb24")[0, 0, 0]), clock()))
    return out


async def yield_a_while() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_steady_stream_is_paced_by_pts_without_stalls() -> None:
    clock = FakeClock(100.0)
    session, handle = make_live_session(clock)
    for k in range(4):
        session.on_emission(chunk(k))
    track = make_track(session, clock)
    got = await pull(track, clock, 20)
    assert session.state.value == "live" and ("resume",) in handle.calls
    assert [pts for pts, _, _ in got] == [i * TICKS for i in range(20)]
    assert [value for _, value, _ in got] == [i // N for i in range(20)]
    assert [t for _, _, t in got] == [100.0 + i * FRAME_S for i in range(20)]
    assert session.playout_anchor_s == 100.0
    assert session.stalls == 0 and track.repeated_frames == 0 and session.frames_sent == 20
    await session.close()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_late_generation_repeats_the_last_frame_with_increasing_pts_and_counts_stalls() -> (
    None
):
    clock = FakeClock()
    session, _ = make_live_session(clock)
    session.on_emission(chunk(0))
    track = make_track(session, clock)
    first = await pull(track, clock, N)
    assert [t for _, _, t in first] == [i * FRAME_S for i in range(N)]
    repeats = await pull(track, clock, 10)  # chunk 1 is 10 frame slots late
    session.on_emission(chunk(1))
    fresh = await pull(track, clock, N)
    ptss = [pts for pts, _, _ in first + repeats + fresh]
    assert all(b > a for a, b in itertools.pairwise(ptss))
    # each empty slot repeats the last frame, pts + 1, one frame period apart, and is a stall
    last_pts = first[-1][0]
    assert repeats == [(last_pts + i, 0, (N - 1 + i) * FRAME_S) for i in range(1, 11)]
    assert session.stalls == 10 and track.repeated_frames == 10
    # after the stall the late chunk leaves at once, at the next slot, with its generation pts,
    # and the playout (and the engine's deadlines) re-anchor on it
    resumed_s = (N + 10) * FRAME_S
    assert fresh == [(N * TICKS + i * TICKS, 1, resumed_s + i * FRAME_S) for i in range(N)]
    assert session.playout_anchor_s == resumed_s - N * TICKS / 90_000
    await session.close()


async def test_paused_session_sends_nothing_until_resumed() -> None:
    clock = FakeClock()
    session, _ = make_live_session(clock)
    for k in range(3):
        session.on_emission(chunk(k))
    track = make_track(session, clock)
    await pull(track, clock, 2)
    session.pause()
    waiter = asyncio.create_task(track.recv())
    await yield_a_while()
    assert not waiter.done() and session.stalls == 0 and clock() == FRAME_S
    clock.now_s = 10.0  # paused for ~10 s
    session.resume()
    frame = await asyncio.wait_for(waiter, 5.0)
    assert frame.pts == 2 * TICKS and session.stalls == 0
    await session.close()


async def test_flush_on_prompt_switch_plays_the_new_chunk_at_once() -> None:
    clock = FakeClock()
    session, _ = make_live_session(clock)
    for k in range(3):
        session.on_emission(chunk(k))
    track = make_track(session, clock)
    await pull(track, clock, 2)
    seq, _ = session.push_prompt("new")
    applied = AppliedMeta(kind=InputKind.PROMPT, seq=seq, chunk=6, pts_90k=6 * N * TICKS)
    session.on_emission(Emission(EmitSpec(Stream.APPLIED, applied), None))
    assert len(session.media) == 0
    session.on_emission(chunk(6))
    frame = await asyncio.wait_for(track.recv(), 5.0)
    assert frame.pts == 6 * N * TICKS
    # at once: neither held back until its due time under the stale anchor (1.875 s) nor
    # until the next slot of the pacing grid (2 frames)
    assert clock() == FRAME_S
    await session.close()


async def test_first_recv_before_any_frame_waits_without_counting_stalls() -> None:
    clock = FakeClock()
    session, _ = make_live_session(clock)
    track = make_track(session, clock)
    waiter = asyncio.create_task(track.recv())
    await yield_a_while()
    assert not waiter.done() and session.state.value == "live" and session.stalls == 0
    clock.now_s = 3.0
    session.on_emission(chunk(0))
    frame = await asyncio.wait_for(waiter, 5.0)
    assert frame.pts == 0 and frame.width == 8 and clock() == 3.0  # at once, not paced
    track.stop()
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()
    await session.close()


async def test_a_flush_during_the_wait_for_the_next_slot_sends_the_new_frame_at_once() -> None:
    clock = FakeClock()
    session, _ = make_live_session(clock)
    for k in range(3):
        session.on_emission(chunk(k))
    track = make_track(session, clock)
    await pull(track, clock, 2)
    never = asyncio.Event()

    async def blocking_sleep(dt_s: float) -> None:  # the next slot never comes by itself
        await never.wait()

    track.pacer._sleep = blocking_sleep
    waiter = asyncio.create_task(track.recv())
    await asyncio.sleep(0.01)
    assert not waiter.done()  # waiting for the slot of the next queued (old) frame
    seq, _ = session.push_prompt("new")
    session.on_emission(chunk(6))
    applied = AppliedMeta(kind=InputKind.PROMPT, seq=seq, chunk=6, pts_90k=6 * N * TICKS)
    session.on_emission(Emission(EmitSpec(Stream.APPLIED, applied), None))
    frame = await asyncio.wait_for(waiter, 5.0)
    assert frame.pts == 6 * N * TICKS and clock() == FRAME_S
    await session.close()
