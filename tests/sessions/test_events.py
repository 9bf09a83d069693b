import asyncio

import msgspec
import pytest

from sessions.events import (
    ErrorEvent,
    EventStream,
    InputReceived,
    MediaChunk,
    PromptApplied,
    SessionStateChanged,
    decode_event,
    encode_event,
)


def make_stream(**overrides) -> EventStream:
    ticks = iter(range(1000, 2000))
    return EventStream(clock=lambda: float(next(ticks)), **overrides)


def test_wire_form_is_the_api_json_and_round_trips() -> None:
    event = PromptApplied(seq=3, chunk=7, pts=63000, mode="cut", segment=1)
    wire = msgspec.json.decode(encode_event(event))
    assert wire["type"] == "prompt.applied"
    assert (wire["seq"], wire["chunk"], wire["pts"], wire["mode"], wire["segment"]) == (
        3,
        7,
        63000,
        "cut",
        1,
    )
    assert decode_event(encode_event(event)) == event


def test_decoding_an_unknown_type_or_bad_field_names_it() -> None:
    with pytest.raises(msgspec.ValidationError, match="type"):
        decode_event(b'{"type": "nope"}')
    with pytest.raises(msgspec.ValidationError, match=r"\$\.seq"):
        decode_event(b'{"type": "input.received", "seq": "x", "kind": "prompt"}')


async def test_publish_stamps_ids_in_order_and_delivers_to_every_subscriber() -> None:
    stream = make_stream()
    first, second = stream.subscribe(), stream.subscribe()
    sunk: list[int] = []
    stream.add_sink(lambda e: sunk.append(e.event_id))
    stream.publish(SessionStateChanged(state="created"))
    stream.publish(InputReceived(seq=1, kind="prompt"))
    stream.publish(MediaChunk(chunk=0, pts_start=0, frames=4))
    stream.close()
    got_first = [(e.event_id, type(e).__name__, e.time_s) async for e in first]
    got_second = [e.event_id async for e in second]
    assert got_first == [
        (1, "SessionStateChanged", 1000.0),
        (2, "InputReceived", 1001.0),
        (3, "MediaChunk", 1002.0),
    ]
    assert got_second == [1, 2, 3]
    assert sunk == [1, 2, 3]


async def test_late_subscriber_replays_retained_history_after_an_id() -> None:
    stream = make_stream(history=3)
    for seq in range(5):
        stream.publish(InputReceived(seq=seq, kind="action"))
    late = stream.subscribe(after_id=2)
    stream.publish(ErrorEvent(code="x", message="y"))
    stream.close()
    assert [e.event_id async for e in late] == [3, 4, 5, 6]


async def test_slow_subscriber_is_closed_on_overflow_and_others_continue() -> None:
    stream = make_stream(max_backlog=2)
    slow, fast = stream.subscribe(), stream.subscribe()
    stream.publish(InputReceived(seq=1, kind="prompt"))
    assert (await fast.next(1.0)).seq == 1
    stream.publish(InputReceived(seq=2, kind="prompt"))
    assert (await fast.next(1.0)).seq == 2
    stream.publish(InputReceived(seq=3, kind="prompt"))
    assert slow.overflowed and slow.closed
    assert (await fast.next(1.0)).seq == 3
    assert [e.seq async for e in slow] == [1, 2]  # drains what it held, then ends


async def test_next_times_out_without_events_and_a_failing_sink_does_not_stop_delivery() -> None:
    stream = make_stream()
    sub = stream.subscribe()
    assert await sub.next(0.01) is None

    def bad_sink(event):
        raise RuntimeError("boom")

    stream.add_sink(bad_sink)
    waiter = asyncio.create_task(sub.next(1.0))
    await asyncio.sleep(0)
    stream.publish(InputReceived(seq=9, kind="audio"))
    assert (await waiter).seq == 9


def test_publish_after_close_is_dropped_and_close_is_idempotent() -> None:
    stream = make_stream()
    stream.publish(InputReceived(seq=1, kind="prompt"))
    stream.close()
    stream.close()
    stream.publish(InputReceived(seq=2, kind="prompt"))
    assert [e.event_id for e in stream.history()] == [1]
    assert stream.last_id == 1
