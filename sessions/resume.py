"""Resume after a restart: a session from its last replay snapshot, a job from its newest one.

A session of a previous process may resume here, under the same id, when its client comes
back within the grace period (``Resumer``, ``dreamrt serve --resume-grace``) with its old token
(``POST /v1/sessions/{id}/offer``, ``server.api.sessions``). It must have ended by that
restart: ``closed`` by a graceful shutdown (which leaves a marker ``resume/<id>.json`` naming
the loop whose snapshot it took last) or left live by a killed process (``Store.recover``
marks it ``failed``, "interrupted: the server restarted"). Its state comes from the newest
snapshot of its loop under ``snapshots/`` (``sessions.recording``): the loop taken over by a
chosen fork candidate keeps writing under that candidate's loop id, which the marker names
(after a kill: the newest snapshot of the session's loop and of the candidates it chose,
``Store.forks``).

``restore_session`` is the one entry point (fleet failover calls it too): it restores the
snapshot off the event loop, then the host admits the session again (a KV slab, compute) and
spawns its loop *forked* from the restored state, so the chunk-KV goes into the new slab
(``SessionHost.create_session(resume=...)``). Chunk-KV, the loop's prompt memory (active
prompt, its cross K/V, a waiting switch), segment, chunk index and frame count (so the PTS)
continue from the snapshot; inputs that were waiting unacknowledged are dropped (their client
sends them again). After a graceful shutdown the snapshot is of the chunk boundary after the
last chunk generated; after a kill it is the newest periodic one (``--snapshot-every``
chunks): the chunks after it are generated again, with the same seed and inputs.

Jobs are snapshotted as they run (``sessions.job_snapshots``) and at a step boundary by a
graceful shutdown (``JobHost.suspend``); the next process restores the newest file
(``JobHost.resume_jobs``), so a job goes on from there after a kill too. A job with no snapshot
yet runs again from its request (same seed, same result) or, if it cannot, ends ``failed``
with the reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from runtime.admission import Reject
from runtime.contract import LoopState
from runtime.snapshot import clone_state, resolve_state_type, restore_state, write_snapshot
from sessions.loop_handle import LoopHandleLike
from sessions.recording import Recording

__all__ = [
    "ResumeError",
    "Resumer",
    "newest_snapshot",
    "restore_session",
    "snapshot_loop",
    "write_marker",
]

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted: the server restarted"  # Store.recover's error of a killed session


class ResumeError(RuntimeError):
    """The session cannot resume here (the message says why)."""


def newest_snapshot(data_dir: Path, loop_id: str) -> Path | None:
    """The newest ``.snap`` file of ``loop_id`` (names are zero-padded steps: sorted = time)."""
    files = sorted((Path(data_dir) / "snapshots" / loop_id).glob("*.snap"))
    return files[-1] if files else None


def snapshot_loop(
    recording: Recording, handle: LoopHandleLike, *, after_chunk: bool, advance: bool
) -> asyncio.Future[int]:
    """Takes a snapshot of ``handle``'s loop at its next (chunk) boundary, written like the
    periodic ones (``Recording.write_snapshot``: off the event loop, atomic, retention);
    the future resolves once the state is cloned. ``advance``: a paused loop runs to it."""

    def take(state: LoopState) -> int:
        step = int(state.step)
        clone = clone_state(state)
        recording.write_snapshot(f"{handle.loop_id}@{step}", partial(write_snapshot, clone))
        return step

    return handle.at_boundary(take, after_chunk=after_chunk, advance=advance)


def _marker(data_dir: Path, session_id: str) -> Path:
    return Path(data_dir) / "resume" / f"{session_id}.json"


def write_marker(data_dir: Path, session_id: str, loop_id: str) -> None:
    """Says that ``session_id`` closed for a shutdown with its state in ``loop_id``'s snapshots
    (written then renamed)."""
    path = _marker(data_dir, session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps({"loop_id": loop_id, "at": time.time(), "reason": "shutdown"}))
    os.replace(tmp, path)


def _resume_point(store: Any, data_dir: Path, session_id: str) -> tuple[dict[str, Any], Path]:
    """The session's row (with ``last_event_id``, of its stored events) and its snapshot file
    (store thread); ResumeError when it cannot."""
    row = store.get_session(session_id)
    if row is None:
        raise ResumeError(f"no session {session_id!r} was ever here")
    marker = _marker(data_dir, session_id)
    if marker.is_file():
        loops = [json.loads(marker.read_text())["loop_id"]]
    elif row["state"] == "failed" and row["error"] == INTERRUPTED:
        # its own loop, or that of a fork candidate it chose (their steps go on from its)
        loops = [session_id, *(f["chosen"] for f in store.forks(session_id) if f["chosen"])]
    else:
        raise ResumeError(f"session {session_id!r} ended ({row['state']}); it cannot resume")
    paths = [p for p in (newest_snapshot(data_dir, loop) for loop in loops) if p is not None]
    if not paths:
        raise ResumeError(f"session {session_id!r} has no snapshot to resume from")
    # no event of it has a larger id (sessions.persistence): its new ones are numbered above
    stored = max((e["event_id"] for e in store.events(session_id)), default=0)
    row["last_event_id"] = max(stored, row.get("event_id_ceiling") or 0)
    # the newest step; on a tie the later loop (a candidate forked at that very boundary)
    return row, max(reversed(paths), key=lambda p: int(p.stem))


def _restored(loop: Any, path: Path, device: Any) -> Any:
    blob = path.read_bytes()
    state = restore_state(blob, resolve_state_type(loop, blob), device=device)
    # inputs waiting unacknowledged died with the old process's ledger: the client resends
    return msgspec.structs.replace(state, acks=[], next_acks=[])


async def restore_session(host: Any, session_id: str, *, data_dir: Path) -> Any:
    """Admits ``session_id`` again from its newest snapshot (module docstring): the live
    ``Session`` (same id, spawned paused until a viewer pulls), or ``Reject`` (no capacity
    now). Raises ``ResumeError`` when it cannot resume, ``KeyError`` for a model not served."""
    from sessions.served_models import SESSION_LOOP

    if host.session(session_id) is not None:
        raise ResumeError(f"session {session_id!r} is live here already")
    row, path = await host.store.run(_resume_point, host.store, data_dir, session_id)
    served = host.models.resolve(row["model_id"])
    state = await asyncio.to_thread(_restored, served.loop(SESSION_LOOP), path, served.device)
    answer = host.create_session(
        prompt=state.active_prompt or state.prompt,
        model=row["model_id"],
        fps=row["fps"],
        width=row["width"],
        height=row["height"],
        seed=state.seed,  # a chosen fork candidate's, if it went on in one
        priority_class=row["class"],
        session_id=session_id,
        resume=state,
        first_event_id=row["last_event_id"] + 1,  # its event stream goes on (Last-Event-ID)
    )
    if not isinstance(answer, Reject):
        _marker(data_dir, session_id).unlink(missing_ok=True)
        log.info("session %s resumed from %s (chunk %d)", session_id, path, state.chunk)
    return answer


class Resumer:
    """Which sessions of a previous process may resume, until ``grace_s`` after this one
    started (0: none). Serialises resumes of one id."""

    def __init__(
        self,
        host: Any,
        data_dir: Path,
        *,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.data_dir = Path(data_dir)
        self.grace_s = grace_s
        self._clock = clock
        self._started_s = clock()
        self._locks: dict[str, asyncio.Lock] = {}
        self.resumed = 0

    @property
    def open(self) -> bool:
        return self.grace_s > 0 and self._clock() - self._started_s <= self.grace_s

    async def resume(self, session_id: str) -> Any:
        """The resumed session or ``Reject``; ``ResumeError`` outside the grace or when the
        session cannot resume."""
        if not self.open:
            raise ResumeError(f"no live session {session_id!r} (the resume grace is over)")
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            live = self.host.session(session_id)
            if live is not None:  # resumed by a request that held the lock before this one
                return live
            answer = await restore_session(self.host, session_id, data_dir=self.data_dir)
        self._locks.pop(session_id, None)
        if not isinstance(answer, Reject):
            self.resumed += 1
        return answer
