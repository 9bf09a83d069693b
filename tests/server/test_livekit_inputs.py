import asyncio
import json

import numpy as np

from runtime.contract import AppliedMeta, Emission, EmitSpec, InputKind, Stream
from server.livekit.inputs import AUDIO_PUSH_S, RoomInputs
from server.livekit.room import CONTROL_TOPIC
from sessions.session import Session, SessionConfig
from tests.server.fake_room import FakeRoom
from tests.sessions.fakes import FakeHandle


def make_session(caps: set[str] | None = None, **limits: int) -> tuple[Session, FakeHandle]:
    config = SessionConfig(
        session_id="s",
        model_id="m",
        prompt="p",
        seed=0,
        fps=16,
        width=8,
        height=8,
        priority_class="realtime",
        capabilities=frozenset(caps or {"prompt.switch", "prompt.cut", "input.audio"}),
        **limits,
    )
    session = Session(config, media_capacity_frames=16)
    handle = FakeHandle()
    session.attach(handle)
    return session, handle


def applied(kind: str, seq: int, chunk: int = 0) -> Emission:
    meta = AppliedMeta(kind=InputKind(kind), seq=seq, chunk=chunk, pts_90k=0)
    return Emission(EmitSpec(Stream.APPLIED, meta), None)


async def settle(room: FakeRoom, n: int, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(room.sent) < n and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.02)


def messages(room: FakeRoom) -> list[tuple[dict, tuple[str, ...]]]:
    return [(json.loads(payload), to) for payload, topic, to in room.sent if topic == CONTROL_TOPIC]


async def test_a_prompt_gets_both_acks_sent_back_to_its_sender_only() -> None:
    session, handle = make_session()
    room = FakeRoom()
    inputs = RoomInputs(session, room, store=None)
    inputs.start()
    inputs.on_data(json.dumps({"type": "prompt", "text": "a desert"}).encode(), "alice")
    assert [e.kind for e in handle.inputs] == ["prompt"]
    session.on_emission(applied("prompt", handle.inputs[0].seq))
    await settle(room, 2)
    acks = [(m["type"], m.get("seq"), to) for m, to in messages(room) if m.get("seq")]
    assert acks == [("input.received", 1, ("alice",)), ("prompt.applied", 1, ("alice",))]
    await inputs.close()


async def test_invalid_messages_are_errors_to_the_room_and_ping_is_answered_to_its_sender() -> None:
    session, handle = make_session()
    room = FakeRoom()
    inputs = RoomInputs(session, room, store=None, control_rate_per_s=1.0, control_burst=3)
    inputs.start()
    inputs.on_data(b'{"type": "prompt", "txt": "x"}', "bob")
    inputs.on_data(b'{"type": "ping", "t": 1.5}', "bob")
    inputs.on_data(b"x" * 20_000, "bob")
    inputs.on_data(b'{"type": "ping", "t": 2}', "bob")  # over the burst of 3
    inputs.on_data(b'{"type": "ping", "t": 3}', "carol")  # carol has her own bucket
    await settle(room, 5)
    got = messages(room)
    errors = [m["code"] for m, to in got if m["type"] == "error"]
    assert errors == ["invalid_message", "message_too_large", "rate_limited"]
    pongs = [(m["t"], to) for m, to in got if m["type"] == "pong"]
    assert pongs == [(1.5, ("bob",)), (3.0, ("carol",))]
    assert handle.inputs == []
    await inputs.close()


async def test_a_room_prompt_is_held_to_the_sessions_configured_limit() -> None:
    session, handle = make_session(max_prompt_chars=8)
    room = FakeRoom()
    inputs = RoomInputs(session, room, store=None)
    inputs.start()
    inputs.on_data(json.dumps({"type": "prompt", "text": "a desert!"}).encode(), "dave")
    inputs.on_data(json.dumps({"type": "prompt", "text": "a forest"}).encode(), "dave")
    await settle(room, 2)
    errors = [(m["code"], m["message"]) for m, _ in messages(room) if m["type"] == "error"]
    assert errors == [("prompt_too_long", "prompt is 9 characters; the limit is 8")]
    assert [e.payload.text for e in handle.inputs] == ["a forest"]
    assert handle.inputs[0].seq == 1  # the refused one took no sequence number
    await inputs.close()


async def test_room_audio_reaches_the_session_at_16k_mono_in_half_second_pushes() -> None:
    session, handle = make_session()
    inputs = RoomInputs(session, FakeRoom(), store=None, audio_identity="mic")
    assert inputs.wants_audio("mic") and not inputs.wants_audio("someone-else")
    no_audio, _ = make_session({"prompt.switch"})
    assert not RoomInputs(no_audio, FakeRoom(), store=None).wants_audio("mic")

    async def blocks():
        for _ in range(120):  # 1.2 s of 10 ms blocks
            yield np.full(160, 0.25, dtype=np.float32)

    inputs.on_audio("mic", blocks())
    for _ in range(100):
        await asyncio.sleep(0.005)
        if len(handle.inputs) == 2:
            break
    pushed = [e for e in handle.inputs if e.kind == "audio"]
    assert len(pushed) == 2  # two full half-seconds; the 0.2 s tail waits for more
    assert all(len(e.payload.samples) == int(AUDIO_PUSH_S * 16_000) for e in pushed)
    assert session.ledger.audio_samples_in == 16_000
    await inputs.close()
