"""The chunk stream: digests hashed on worker threads, their work run on the loop in emission
order."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from runtime.contract import AppliedMeta, Emission, EmitSpec, InputKind, Stream
from sessions import session as session_module
from sessions.chunk_stream import EmissionOrder
from sessions.records import frames_digest
from tests.sessions.fakes import FakeHandle
from tests.sessions.test_session import applied, event_types, make_session, media


class GatedHash:
    """A digest that waits until the test opens its gate; records the thread it ran on."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.threads: list[int] = []

    def __call__(self, frames: np.ndarray) -> str:
        self.threads.append(threading.get_ident())
        value = int(frames.flat[0])
        self.gates.setdefault(value, threading.Event()).wait(10)
        return f"d{value}"

    def open(self, value: int) -> None:
        self.gates.setdefault(value, threading.Event()).set()


async def test_work_runs_in_submission_order_whatever_order_the_digests_finish() -> None:
    gated = GatedHash()
    errors: list[Exception] = []
    order = EmissionOrder(gated, on_error=errors.append)
    ran: list[str] = []
    order.after(lambda: ran.append("first"))  # nothing pending: runs at once
    assert ran == ["first"]
    order.digest(np.full(4, 1, np.uint8), lambda d: ran.append(d))
    order.after(lambda: ran.append("applied"))
    order.digest(np.full(4, 2, np.uint8), lambda d: ran.append(d))
    gated.open(2)  # the later digest finishes first ...
    await asyncio.sleep(0.05)
    assert ran == ["first"] and order.pending == 3  # ... and waits for the earlier one
    gated.open(1)
    await asyncio.wait_for(order.drain(), 5)
    assert ran == ["first", "d1", "applied", "d2"] and errors == []
    assert threading.get_ident() not in gated.threads  # never hashed on the event loop


async def test_failing_work_is_reported_and_the_queue_goes_on() -> None:
    errors: list[Exception] = []

    def broken_hash(frames: np.ndarray) -> str:
        raise OSError("disk on fire")

    order = EmissionOrder(broken_hash, on_error=errors.append)
    ran: list[str] = []
    order.digest(np.zeros(4, np.uint8), ran.append)
    order.after(lambda: 1 / 0)
    order.after(lambda: ran.append("later"))
    await asyncio.wait_for(order.drain(), 5)
    assert ran == ["later"]
    assert [type(e) for e in errors] == [OSError, ZeroDivisionError]


async def test_a_session_plays_frames_before_their_digest_and_publishes_in_order(
    monkeypatch,
) -> None:
    gated = GatedHash()
    monkeypatch.setattr(session_module, "frames_digest", gated)
    session = make_session()
    session.attach(FakeHandle())
    session.on_emission(media(0, value=1))
    seq, _ = session.push_prompt("a desert")
    session.on_emission(applied("prompt", seq, chunk=1, pts=45000))
    session.on_emission(media(1, value=2))
    # on_emission returned while chunk 0 is still being hashed (a hash on the event loop
    # would block here on its gate): the frames are playable, the switch already flushed
    # chunk 0's, and what the loop emitted after it waits for its digest
    assert [session.media.pop().chunk for _ in range(4)] == [1, 1, 1, 1]
    await asyncio.sleep(0.05)
    assert event_types(session) == ["session.state", "input.received"]
    assert session.prompts.active_text == "a forest"
    gated.open(1)
    gated.open(2)
    await asyncio.wait_for(session.settle(), 5)
    assert event_types(session)[2:] == ["media.chunk", "prompt.applied", "media.chunk"]
    chunks = [e for e in session.events.history() if hasattr(e, "digest")]
    assert [(e.chunk, e.digest) for e in chunks] == [(0, "d1"), (1, "d2")]
    assert session.prompts.active_text == "a desert"
    await session.close()


async def test_closing_waits_for_the_last_digest_so_every_chunk_is_published() -> None:
    session = make_session()
    handle = FakeHandle()
    session.attach(handle)
    emission = media(0, value=7)
    session.on_emission(emission)
    await session.close()  # the loop's end settles the pending digest before the streams close
    published = [e for e in session.events.history() if hasattr(e, "digest")]
    assert [e.digest for e in published] == [frames_digest(emission.output)]
    assert session.events.closed


async def test_the_segment_and_the_flush_are_the_loops_to_decide() -> None:
    session = make_session()
    session.attach(FakeHandle())
    session.on_emission(media(0, segment=2))  # e.g. a stream resumed in segment 2
    assert session.snapshot()["segment"] == 2
    switch, _ = session.push_prompt("a desert")
    session.on_emission(media(1, segment=2))
    session.on_emission(applied("prompt", switch, chunk=1, pts=45000))
    await session.settle()
    event = session.events.history()[-1]
    assert (event.__struct_config__.tag, event.seq, event.segment) == (
        "prompt.applied",
        switch,
        2,
    )
    # an acknowledgement that does not change the picture (a held key sent again) flushes
    # nothing: the frames before it play in order
    action = session.push_action(["w"])
    queued = len(session.media)
    repeat = AppliedMeta(kind=InputKind.ACTION, seq=action, chunk=1, pts_90k=45000, changes=False)
    session.on_emission(Emission(EmitSpec(Stream.APPLIED, repeat), None))
    assert queued > 0 and len(session.media) == queued
    await session.close()
