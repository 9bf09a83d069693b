"""Render a moment of a session: its stream continued offline as a job, decoded by the full VAE.

A program whose loop node names a ``session`` (the ``render_moment`` preset: ``{"preset":
"render_moment", "session": ID, "chunks": N}``) continues that session's stream from its next
chunk boundary, where its state is copied (``runtime.snapshot.clone_state``: the chunk-KV, the
prompt memory, the inputs latched or waiting), for ``chunks`` more chunks at job priority, and
decodes them with the full VAE into an MP4: a user keeps a clip of what they steered, in the
quality of the full decoder rather than the live stream's. The session goes on untouched (a
paused one runs to its boundary and is paused there again).
"""

from __future__ import annotations

from typing import Any

from models.programs.graph import NodeKind
from models.programs.presets import resolve
from runtime.snapshot import clone_state
from sessions.host import SessionHost
from sessions.job import Job
from sessions.job_host import JobHost
from sessions.served_models import UnsupportedTaskError

__all__ = ["render_moment", "session_of"]


def session_of(program: Any) -> str | None:
    """The session a program continues (its loop node's ``session``), or None."""
    if program is None:
        return None
    loops = resolve(program).of_kind(NodeKind.LOOP)
    return next((str(n.get("session")) for n in loops if n.get("session")), None)


async def render_moment(
    sessions: SessionHost, jobs: JobHost, program: Any, *, job_id: str | None = None
) -> Job:
    """Queues ``program`` continuing its session from the session's next chunk boundary.
    ``UnsupportedTaskError`` (422 on ``program``) when the session is not running here."""
    session_id = session_of(program)
    session = sessions.session(session_id) if session_id is not None else None
    handle = session.handle if session is not None else None
    if session is None or handle is None or handle.done:
        raise UnsupportedTaskError(
            "program", f"session {session_id!r} is not running here: no state to continue"
        )
    state = await handle.at_boundary(clone_state, after_chunk=True, advance=True)
    cfg = session.config
    return jobs.submit_job(
        task="t2v",
        prompt=state.prompt,
        model=cfg.model_id,
        width=cfg.width,
        height=cfg.height,
        seed=state.seed,
        program=program,
        job_id=job_id,
        fork_from=state,
        origin={"moment": {"session": session.id, "chunk": state.next_chunk}},
    )
