"""Render a moment of a session: its stream continued offline as a job, decoded by the full VAE.

A program whose loop node names a ``session`` (the ``render_moment`` preset: ``{"preset":
"render_moment", "session": ID, "chunks": N}``) continues that session's stream for ``chunks``
more chunks at job priority and decodes them with the full VAE into an MP4: a user keeps a clip
of what they steered, in the quality of the full decoder rather than the live stream's. The
state it continues is the session's chunk-KV and prompt memory at a chunk boundary:

- a session running here: copied at its next chunk boundary (``runtime.snapshot.clone_state``;
  the inputs latched or waiting come along); the session goes on untouched (a paused one runs
  to its boundary and is paused there again);
- a session that ended (closed, or of a previous process): its newest replay snapshot
  (``snapshots/<session id>/``, taken every ``--snapshot-every`` chunks and at a graceful
  shutdown), restored off the event loop; inputs that were waiting unacknowledged are dropped.

The job's parameters say where the clip starts (``moment``: the session and the chunk).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, runtime_checkable

import msgspec

from models.programs.graph import NodeKind
from models.programs.presets import resolve
from runtime.contract import LoopState
from runtime.snapshot import clone_state, resolve_state_type, restore_state
from sessions.host import SessionHost
from sessions.job import Job
from sessions.job_host import JobHost
from sessions.resume import newest_snapshot
from sessions.served_models import UnsupportedTaskError
from sessions.store_rows import SessionRow

__all__ = ["render_moment", "session_of"]


@runtime_checkable
class _Continuable(Protocol):
    """What a moment reads of the state it continues (a chunk rollout's)."""

    prompt: str
    seed: int
    next_chunk: int


def session_of(program: Any) -> str | None:
    """The session a program continues (its loop node's ``session``), or None."""
    if program is None:
        return None
    loops = resolve(program).of_kind(NodeKind.LOOP)
    return next((str(n.get("session")) for n in loops if n.get("session")), None)


async def render_moment(
    sessions: SessionHost, jobs: JobHost, program: Any, *, job_id: str | None = None
) -> Job:
    """Queues ``program`` continuing its session (module docstring). ``UnsupportedTaskError``
    (422 on ``program``) when the session has no state here to continue."""
    session_id = session_of(program)
    if session_id is None:
        raise UnsupportedTaskError("program", "the program continues no session")
    session = sessions.session(session_id)
    handle = session.handle if session is not None else None
    if session is not None and handle is not None and not handle.done:
        state = await handle.at_boundary(clone_state, after_chunk=True, advance=True)
        cfg = session.config
        model_id, width, height = cfg.model_id, cfg.width, cfg.height
    else:
        row, state = await _stored(jobs, session_id)
        model_id, width, height = row["model_id"], row["width"], row["height"]
    if not isinstance(state, _Continuable):
        raise UnsupportedTaskError("program", f"session {session_id!r}'s loop has no chunks")
    return jobs.submit_job(
        task="t2v",
        prompt=state.prompt,
        model=model_id,
        width=width,
        height=height,
        seed=state.seed,
        program=program,
        job_id=job_id,
        fork_from=state,
        origin={"moment": {"session": session_id, "chunk": state.next_chunk}},
    )


async def _stored(jobs: JobHost, session_id: str) -> tuple[SessionRow, LoopState]:
    """The session's row and the state of its newest replay snapshot."""
    row = await jobs.store.run(jobs.store.get_session, session_id)
    path = None
    if row is not None and jobs.recording is not None:
        path = newest_snapshot(jobs.recording.snapshot_dir, session_id)
    if row is None or path is None:
        raise UnsupportedTaskError(
            "program",
            f"session {session_id!r} is not running here and has no snapshot to continue",
        )
    served = jobs.models.resolve(row["model_id"])
    device = getattr(served, "device", None)
    blob = await asyncio.to_thread(path.read_bytes)
    state_type = resolve_state_type(served.loop("chunk_rollout"), blob)
    state = await asyncio.to_thread(restore_state, blob, state_type, device=device)
    # its waiting inputs died with the session's ledger: nobody is told they applied
    return row, msgspec.structs.replace(state, acks=[], next_acks=[])
