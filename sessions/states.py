"""Session and job lifecycles: string enums and their one transition table each.

Session (docs/architecture.md §5)::

    created ──► negotiating ──► live ◄──► paused
       │            │  ▲          │          │ ▲
       │            ▼  │          │          │ └── negotiating (a viewer reconnects)
       │         created (offer failed)      │
       └────────────┴──────────┴──────────┴──► closing ──► closed
                                   any non-terminal ──► failed

Job: queued ──► running ──► succeeded | failed | cancelled (queued may also fail or be
cancelled). ``TransitionError`` names the current state and the attempted one; the owners
(``Session._transition`` / ``Job._transition``) log ``old -> new`` and emit the event.
"""

from __future__ import annotations

import enum

from runtime.errors import DreamrtError

__all__ = [
    "JOB_TERMINAL",
    "SESSION_TERMINAL",
    "JobState",
    "SessionClosedError",
    "SessionState",
    "SessionStateError",
    "TransitionError",
    "check_job_transition",
    "check_session_transition",
]


class TransitionError(RuntimeError):
    """An illegal lifecycle transition (a protocol misuse, not a capacity condition)."""

    def __init__(self, what: str, current: str, target: str, allowed: frozenset[str]) -> None:
        expected = ", ".join(sorted(allowed)) or "nothing (terminal)"
        super().__init__(f"{what} is {current!r}: cannot go to {target!r} (allowed: {expected})")
        self.current = current
        self.target = target


class SessionStateError(DreamrtError, RuntimeError):
    """The request does not fit the session's current state (e.g. resume without a viewer): a
    409 whose message names the state."""

    code = "conflict"
    status = 409


class SessionClosedError(SessionStateError):
    """The session is closing, closed or failed; it accepts no more inputs."""


class SessionState(str, enum.Enum):
    CREATED = "created"
    NEGOTIATING = "negotiating"
    LIVE = "live"
    PAUSED = "paused"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


_S = SessionState
_SESSION_ALLOWED: dict[SessionState, frozenset[SessionState]] = {
    _S.CREATED: frozenset({_S.NEGOTIATING, _S.CLOSING, _S.FAILED}),
    _S.NEGOTIATING: frozenset({_S.LIVE, _S.CREATED, _S.PAUSED, _S.CLOSING, _S.FAILED}),
    _S.LIVE: frozenset({_S.PAUSED, _S.CLOSING, _S.FAILED}),
    _S.PAUSED: frozenset({_S.LIVE, _S.NEGOTIATING, _S.CLOSING, _S.FAILED}),
    _S.CLOSING: frozenset({_S.CLOSED, _S.FAILED}),
    _S.CLOSED: frozenset(),
    _S.FAILED: frozenset(),
}
SESSION_TERMINAL = frozenset({_S.CLOSED, _S.FAILED})


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


_J = JobState
_JOB_ALLOWED: dict[JobState, frozenset[JobState]] = {
    _J.QUEUED: frozenset({_J.RUNNING, _J.FAILED, _J.CANCELLED}),
    _J.RUNNING: frozenset({_J.SUCCEEDED, _J.FAILED, _J.CANCELLED}),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset(),
    _J.CANCELLED: frozenset(),
}
JOB_TERMINAL = frozenset({_J.SUCCEEDED, _J.FAILED, _J.CANCELLED})


def check_session_transition(what: str, current: SessionState, target: SessionState) -> None:
    allowed = _SESSION_ALLOWED[current]
    if target not in allowed:
        raise TransitionError(
            what, current.value, target.value, frozenset(s.value for s in allowed)
        )


def check_job_transition(what: str, current: JobState, target: JobState) -> None:
    allowed = _JOB_ALLOWED[current]
    if target not in allowed:
        raise TransitionError(
            what, current.value, target.value, frozenset(s.value for s in allowed)
        )
