"""A session watched by several sinks (a WebRTC viewer and a LiveKit room) at once."""

from sessions.states import SessionState
from tests.server.test_livekit_inputs import make_session


async def test_the_session_stays_live_until_its_last_sink_leaves() -> None:
    session, handle = make_session()
    room_sink = object()
    session.begin_negotiation()
    session.viewer_started(viewer=room_sink)  # the LiveKit sink's first pull
    assert session.state is SessionState.LIVE
    session.begin_negotiation()  # a WebRTC offer while live: joins, no state change
    session.viewer_started()
    assert session.state is SessionState.LIVE and session.unwatched_for_s() == 0.0
    session.viewer_left()  # the WebRTC viewer goes
    assert session.state is SessionState.LIVE and ("pause",) not in handle.calls
    session.viewer_left("livekit participant left", viewer=room_sink)
    assert session.state is SessionState.PAUSED and ("pause",) in handle.calls
    states = [e.state for e in session.events.history() if hasattr(e, "previous")]
    assert states == ["created", "negotiating", "live", "paused"]


async def test_fail_reports_the_cause_and_cancels_the_loop() -> None:
    session, handle = make_session()
    session.fail("livekit_connect", "refused")
    await session.wait_finished()
    assert session.state is SessionState.FAILED and session.error == "livekit_connect: refused"
    assert ("cancel", "livekit_connect: refused") in handle.calls
    session.fail("again", "ignored once terminal")
    assert session.error == "livekit_connect: refused"
