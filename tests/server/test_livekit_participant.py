import asyncio
import json

from runtime.contract import PromptInput, PromptMode
from server.frame_pacer import FramePacer
from server.livekit_avatar import RPC_CLEAR_BUFFER, RPC_PLAYBACK_FINISHED, RPC_PLAYBACK_STARTED
from server.livekit_participant import LiveKitParticipant
from tests.server.fake_room import FakeRoom
from tests.server.test_livekit_inputs import make_session
from tests.server.test_media_track import chunk


def make(room: FakeRoom, **options):
    session, handle = make_session()
    participant = LiveKitParticipant(
        session,
        room,
        url="ws://lk",
        room_name="lobby",
        token="t",
        pacer=FramePacer(session),
        **options,
    )
    return session, handle, participant


async def until(predicate, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def events(session) -> list[tuple[str, str]]:
    out = []
    for e in session.events.history():
        tag = type(e).__struct_config__.tag
        out.append((tag, getattr(e, "state", getattr(e, "code", ""))))
    return out


async def test_join_publishes_goes_live_and_session_close_leaves_the_room() -> None:
    room = FakeRoom()
    session, handle, participant = make(room)
    participant.start()
    session.on_emission(chunk(0))
    await until(lambda: len(room.captured) >= 2)
    assert room.published == (8, 8, 16, 150_000)
    assert session.state.value == "live" and ("resume",) in handle.calls
    assert ("livekit.state", "connecting") in events(session)
    assert ("livekit.state", "connected") in events(session)
    await session.close("deleted")
    await asyncio.wait_for(participant.wait_closed(), 3)
    assert room.disconnects == 1 and session.state.value == "closed"


async def test_a_failed_join_fails_the_session_with_the_cause() -> None:
    room = FakeRoom(connect_error="Connection refused (os error 111)")
    session, handle, participant = make(room)
    participant.start()
    await asyncio.wait_for(session.wait_finished(), 3)
    await asyncio.wait_for(participant.wait_closed(), 3)
    assert session.state.value == "failed"
    assert "livekit_connect" in session.error and "refused" in session.error
    assert ("error", "livekit_connect") in events(session)
    assert any(call[0] == "cancel" for call in handle.calls)


async def test_reconnects_are_events_and_a_deleted_room_closes_the_session() -> None:
    room = FakeRoom()
    session, _, participant = make(room)
    participant.start()
    await until(lambda: room.events is not None and session.state.value == "live")
    room.events.on_state("reconnecting", "")
    room.events.on_state("reconnected", "")
    assert session.state.value == "live"
    room.events.on_state("disconnected", "ROOM_DELETED")
    await asyncio.wait_for(session.wait_finished(), 3)
    await asyncio.wait_for(participant.wait_closed(), 3)
    states = [s for tag, s in events(session) if tag == "livekit.state"]
    assert states == ["connecting", "connected", "reconnecting", "reconnected", "disconnected"]
    last = [e for e in session.events.history() if getattr(e, "state", "") == "closing"][-1]
    assert last.reason == "livekit: ROOM_DELETED" and session.state.value == "closed"


async def test_avatar_convention_plays_agent_speech_and_answers_clear_buffer() -> None:
    room = FakeRoom()
    _, handle, participant = make(room, avatar_of="agent-1")
    participant.start()
    await until(lambda: room.events is not None and participant.avatar._task is not None)
    assert set(room.rpc_handlers) == {RPC_CLEAR_BUFFER}
    assert not participant.wants_audio("agent-1")  # its speech comes as a byte stream
    pcm = (b"\x00\x10" * 2) * 12_000  # 0.25 s of 48 kHz stereo int16
    room.stream_bytes(
        "lk.audio_stream", [pcm] * 4, "agent-1", {"sample_rate": "48000", "num_channels": "2"}
    )
    await until(lambda: len(room.rpc_calls) == 2, timeout_s=4)
    (who1, m1, p1), (who2, m2, p2) = room.rpc_calls
    assert (who1, m1, p1) == ("agent-1", RPC_PLAYBACK_STARTED, "")
    assert (who2, m2) == ("agent-1", RPC_PLAYBACK_FINISHED)
    assert json.loads(p2) == {"playback_position": 1.0, "interrupted": False}
    audio = [e for e in handle.inputs if e.kind == "audio"]
    assert [len(e.payload.samples) for e in audio] == [8_000, 8_000]  # 16 kHz mono
    # between segments there is nothing to interrupt: no cut
    assert await room.rpc_handlers[RPC_CLEAR_BUFFER]("agent-1", "") == "ok"
    assert [e.kind for e in handle.inputs] == ["audio", "audio"]
    # a stranger cannot interrupt; the agent can: a cut at the next step, interrupted: true
    assert await room.rpc_handlers[RPC_CLEAR_BUFFER]("mallory", "") == "reject"
    room.stream_bytes(
        "lk.audio_stream", [pcm] * 8, "agent-1", {"sample_rate": "48000", "num_channels": "2"}
    )
    await until(lambda: len(room.rpc_calls) == 3)
    assert await room.rpc_handlers[RPC_CLEAR_BUFFER]("agent-1", "") == "ok"
    await until(lambda: len(room.rpc_calls) == 4)
    finished = json.loads(room.rpc_calls[3][2])
    assert finished["interrupted"] is True and finished["playback_position"] < 2.0
    assert handle.inputs[-1].kind == "prompt"
    assert handle.inputs[-1].payload == PromptInput(text="p", mode=PromptMode.CUT)
    await participant.close()
    assert room.disconnects == 1
