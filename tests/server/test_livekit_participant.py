import asyncio

from server.live.frame_pacer import FramePacer
from server.livekit.participant import LiveKitParticipant
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
