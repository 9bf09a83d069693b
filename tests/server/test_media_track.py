import asyncio
import itertools
import time

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from runtime.contract import AppliedMeta, Emission, EmitSpec, InputKind, MediaMeta, Stream
from server.media_track import SessionVideoTrack
from sessions.session import Session, SessionConfig
from tests.sessions.fakes import FakeHandle

FPS = 50
N = 5  # frames per chunk


def make_live_session() -> tuple[Session, FakeHandle]:
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
    session = Session(config, media_capacity_frames=64)
    handle = FakeHandle()
    session.attach(handle)
    session.begin_negotiation()
    return session, handle


def chunk(k: int) -> Emission:
    frames = np.full((N, 8, 8, 3), k, dtype=np.uint8)
    return Emission(
        EmitSpec(
            Stream.MEDIA,
            MediaMeta(chunk=k, segment=0, frame_start=k * N, pts_90k=k * N * 90000 // FPS,
                      num_frames=N, fps=FPS),
        ),
        frames,
    )


async def pull(track: SessionVideoTrack, n: int) -> list[tuple[int, int, float]]:
    out = []
    for _ in range(n):
        frame = await track.recv()
        out.append((frame.pts, int(frame.to_ndarray(format="rgb24")[0, 0, 0]), time.monotonic()))
    return out


async def test_steady_stream_is_paced_by_pts_without_stalls() -> None:
    session, handle = make_live_session()
    for k in range(4):
        session.on_emission(chunk(k))
    track = SessionVideoTrack(session)
    got = await pull(track, 20)
    assert session.state.value == "live" and ("resume",) in handle.calls
    assert [pts for pts, _, _ in got] == [i * 90000 // FPS for i in range(20)]
    assert [value for _, value, _ in got] == [i // N for i in range(20)]
    elapsed = got[-1][2] - got[0][2]
    assert elapsed == pytest.approx(19 / FPS, abs=0.06)
    assert session.stalls == 0 and track.repeated_frames == 0 and session.frames_sent == 20
    await session.close()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_late_generation_repeats_the_last_frame_with_increasing_pts_and_counts_stalls() -> (
    None
):
    session, _ = make_live_session()
    session.on_emission(chunk(0))
    track = SessionVideoTrack(session)
    first = await pull(track, N)

    async def late_producer() -> None:
        await asyncio.sleep(0.2)  # ~10 frame slots late
        session.on_emission(chunk(1))

    producer = asyncio.create_task(late_producer())
    rest = await pull(track, 14)
    await producer
    ptss = [pts for pts, _, _ in first + rest]
    assert all(b > a for a, b in itertools.pairwise(ptss))
    repeats = [(pts, value) for pts, value, _ in rest if value == 0]
    assert len(repeats) >= 6 and session.stalls == len(repeats)
    assert [pts for pts, _ in repeats] == [first[-1][0] + i for i in range(1, len(repeats) + 1)]
    fresh = [(pts, value) for pts, value, _ in rest if value == 1]
    assert fresh[0][0] == N * 90000 // FPS  # wire PTS of a fresh frame is its generation PTS
    # after the stall the fresh frames flow at once and the playout re-anchored on them
    assert session.playout_anchor_s == pytest.approx(
        rest[len(repeats)][2] - fresh[0][0] / 90000, abs=0.02
    )
    await session.close()


async def test_paused_session_sends_nothing_until_resumed() -> None:
    session, _ = make_live_session()
    for k in range(3):
        session.on_emission(chunk(k))
    track = SessionVideoTrack(session)
    await pull(track, 2)
    session.pause()
    waiter = asyncio.create_task(track.recv())
    await asyncio.sleep(0.15)
    assert not waiter.done() and session.stalls == 0
    session.resume()
    frame = await asyncio.wait_for(waiter, 1.0)
    assert frame.pts == 2 * 90000 // FPS
    await session.close()


async def test_flush_on_prompt_switch_plays_the_new_chunk_at_once() -> None:
    session, _ = make_live_session()
    for k in range(3):
        session.on_emission(chunk(k))
    track = SessionVideoTrack(session)
    await pull(track, 2)
    seq, _ = session.push_prompt("new")
    session.on_emission(
        Emission(
            EmitSpec(
                Stream.APPLIED,
                AppliedMeta(kind=InputKind.PROMPT, seq=seq, chunk=6,
                            pts_90k=6 * N * 90000 // FPS),
            ),
            None,
        )
    )
    assert len(session.media) == 0
    session.on_emission(chunk(6))
    start = time.monotonic()
    frame = await track.recv()
    assert frame.pts == 6 * N * 90000 // FPS
    assert time.monotonic() - start < 0.1  # not held back until its (stale-anchor) due time
    await session.close()


async def test_first_recv_before_any_frame_waits_without_counting_stalls() -> None:
    session, _ = make_live_session()
    track = SessionVideoTrack(session)
    waiter = asyncio.create_task(track.recv())
    await asyncio.sleep(0.1)
    assert not waiter.done() and session.state.value == "live" and session.stalls == 0
    session.on_emission(chunk(0))
    frame = await asyncio.wait_for(waiter, 1.0)
    assert frame.pts == 0 and frame.width == 8
    track.stop()
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()
    await session.close()
