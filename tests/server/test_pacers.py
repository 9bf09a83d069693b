"""A session's frame pacer leaves the server's table when the session ends."""

from __future__ import annotations

from types import SimpleNamespace

from server.context import ServerContext
from sessions.loop_watch import LoopWatch


def _context() -> ServerContext:
    nothing = None
    return ServerContext(
        config=nothing,
        store=nothing,
        engine=nothing,
        host=nothing,
        jobs=nothing,
        auth=nothing,
        metrics=nothing,
        device="cpu",
        model_id="m",
        forks=nothing,
        trainer=nothing,
        resumer=nothing,
    )


def _session(sid: str) -> SimpleNamespace:
    return SimpleNamespace(
        id=sid,
        terminal=False,
        config=SimpleNamespace(fps=12),
        media=SimpleNamespace(flushes=0),
        loop_watch=LoopWatch(sid),
    )


async def test_pacers_of_ended_sessions_are_dropped_when_they_end() -> None:
    ctx = _context()
    sessions = [_session(f"ses_{i}") for i in range(20)]
    pacers = [ctx.pacer_for(s) for s in sessions]
    assert ctx.pacer_for(sessions[0]) is pacers[0]  # one pacer per session
    for session in sessions:  # each ends (no other session asks for a pacer after)
        session.terminal = True
        session.loop_watch.finish()
    assert ctx.pacers == {}
    again = _session("ses_0")  # a resumed session with an old id gets its own pacer
    assert ctx.pacer_for(again) is not pacers[0]
    assert list(ctx.pacers) == ["ses_0"]
