"""Time to steer in a session: the per-input breakdown on ``*.applied`` and ``input.shown``, the
backlog a changing input flushes, the start breakdown, and ``start="now"``."""

from __future__ import annotations

import asyncio

import numpy as np

from runtime.contract import (
    AppliedMeta,
    Emission,
    EmitSpec,
    InputKind,
    InputTiming,
    MediaMeta,
    Stream,
    pts_of_frame,
)
from sessions.events import (
    ActionApplied,
    InputShown,
    MediaChunk,
    PromptApplied,
    ViewerFirstFrame,
)
from sessions.latency import SessionLatency
from sessions.media_queue import MediaFrame
from sessions.session import Session
from tests.sessions.fakes import FakeHandle
from tests.sessions.test_session import ALL_CAPS, FakeClock
from tests.sessions.test_session import make_session as make_base_session

FPS = 8
N = 4  # frames per chunk


def make_session(clock: FakeClock) -> tuple[Session, FakeHandle]:
    session = make_base_session(ALL_CAPS, clock=clock)
    handle = FakeHandle()
    session.attach(handle)
    return session, handle


def media(chunk: int, *, final: bool = True) -> Emission:
    meta = MediaMeta(
        chunk=chunk,
        segment=0,
        frame_start=chunk * N,
        pts_90k=pts_of_frame(chunk * N, FPS),
        num_frames=N,
        fps=FPS,
        final=final,
    )
    return Emission(EmitSpec(Stream.MEDIA, meta), np.full((N, 8, 8, 3), chunk, dtype=np.uint8))


def applied(kind: InputKind, seq: int, chunk: int, timing=None, changes=True) -> Emission:
    meta = AppliedMeta(
        kind=kind, seq=seq, chunk=chunk, pts_90k=pts_of_frame(chunk * N, FPS), changes=changes
    )
    return Emission(EmitSpec(Stream.APPLIED, meta), None, timing)


def events_of(session: Session, kind: type) -> list:
    return [e for e in session.events.history() if isinstance(e, kind)]


async def test_a_prompt_carries_its_breakdown_and_the_backlog_it_dropped() -> None:
    clock = FakeClock()
    session, _ = make_session(clock)
    for k in range(3):  # backlog of old frames
        session.on_emission(media(k))
    seq, _ = session.push_prompt("new")
    clock.t += 0.45
    session.on_emission(media(3))
    timing = InputTiming(seq, latched_s=0.01, started_s=0.02, generated_s=0.3, decoded_s=0.44)
    session.on_emission(applied(InputKind.PROMPT, seq, 3, timing))
    assert session.media.peek().chunk == 3  # the flush is at once, before any event
    # an older frame going out does not count; the first one at the applied PTS does, even
    # before the chunk's digest let media.chunk and prompt.applied out
    clock.t += 0.02
    session.frame_shown(MediaFrame(np.zeros((8, 8, 3), np.uint8), 1, 0, 0), clock.t)
    clock.t += 0.01
    session.frame_shown(session.media.pop(), clock.t)
    await session.settle()
    (event,) = events_of(session, PromptApplied)
    latency = event.latency
    assert (latency.latched_s, latency.started_s, latency.generated_s) == (0.01, 0.02, 0.3)
    assert latency.decoded_s == 0.44 and latency.enqueued_s == 0.45 and latency.sent_s is None
    assert latency.dropped_frames == 3 * N  # the old chunks never reach the viewer
    (shown,) = events_of(session, InputShown)
    assert (shown.seq, shown.kind, shown.chunk, shown.pts) == (seq, "prompt", 3, event.pts)
    assert shown.latency.sent_s == 0.48 and shown.latency.enqueued_s == 0.45
    # the stream reads in order: the chunk, its acknowledgement, then the input on the wire
    order = [type(e) for e in session.events.history()]
    assert order.index(PromptApplied) < order.index(InputShown)
    (chunk3,) = [e for e in events_of(session, MediaChunk) if e.chunk == 3]
    assert chunk3.event_id < event.event_id < shown.event_id
    await session.close()


async def test_a_changed_key_is_shown_at_once_and_a_repeated_one_in_playout_order() -> None:
    clock = FakeClock()
    session, _ = make_session(clock)
    for k in range(2):
        session.on_emission(media(k))
    first = session.push_action(["w"])
    session.on_emission(media(2))
    session.on_emission(applied(InputKind.ACTION, first, 2, changes=True))
    flushes = session.media.flushes
    assert session.media.peek().chunk == 2 and flushes == 1
    again = session.push_action(["w"])
    session.on_emission(media(3))
    session.on_emission(applied(InputKind.ACTION, again, 3, changes=False))
    assert session.media.flushes == flushes and len(session.media) == 2 * N  # nothing dropped
    await session.settle()
    a, b = events_of(session, ActionApplied)
    assert a.latency.dropped_frames == 2 * N and b.latency.dropped_frames == 0
    assert b.latency.latched_s is None  # a repeat has no runtime stages
    await session.close()


def test_the_start_breakdown_is_published_once_with_the_first_frame() -> None:
    clock = FakeClock(10.0)
    latency = SessionLatency(clock, created_s=10.0)
    for stage, at in (("offer", 10.05), ("answered", 10.08), ("connected", 10.2)):
        clock.t = at
        getattr(latency, stage)()
    clock.t = 10.25
    latency.first_generated()
    latency.offer()  # a later viewer's offer does not move the first one's stages
    (event,) = latency.frame_sent(0, 10.26)
    assert isinstance(event, ViewerFirstFrame) and event.pts == 0
    got = event.latency
    assert (got.offer_s, got.answered_s, got.connected_s) == (0.05, 0.08, 0.2)
    assert (got.generated_s, got.sent_s) == (0.25, 0.26)
    assert latency.frame_sent(7500, 10.3) == []


async def test_start_now_generates_the_first_chunk_then_waits_for_the_viewer() -> None:
    clock = FakeClock()
    session, handle = make_session(clock)
    session.hold_after_first_chunk = True  # what SessionHost.create_session(start="now") sets
    session.on_emission(media(0, final=False))
    assert ("pause",) not in handle.calls  # the first part: keep going
    session.on_emission(media(0))
    assert handle.calls.count(("pause",)) == 1  # chunk 0 done and nobody watches: wait
    session.begin_negotiation()
    session.viewer_started()
    assert handle.calls[-1] == ("resume",) and session.state.value == "live"
    session.on_emission(media(1))
    assert handle.calls.count(("pause",)) == 1
    await asyncio.wait_for(session.close(), 5.0)
