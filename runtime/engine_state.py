"""The engine's lifecycle: ``created -> running -> closing -> closed`` (``created -> closed``
when it never started), one transition table, and the error for misuse."""

from __future__ import annotations

import enum

__all__ = ["EngineError", "EngineState", "check_engine_transition"]


class EngineError(RuntimeError):
    """Misuse: spawn before start or after close, duplicate loop ids."""


class EngineState(str, enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED = {
    EngineState.CREATED: frozenset({EngineState.RUNNING, EngineState.CLOSED}),
    EngineState.RUNNING: frozenset({EngineState.CLOSING}),
    EngineState.CLOSING: frozenset({EngineState.CLOSED}),
    EngineState.CLOSED: frozenset(),
}


def check_engine_transition(old: EngineState, new: EngineState) -> None:
    """Raises ``EngineError`` naming both states if the table forbids ``old -> new``."""
    if new not in _ALLOWED[old]:
        raise EngineError(f"engine cannot go {old.value!r} -> {new.value!r}")
