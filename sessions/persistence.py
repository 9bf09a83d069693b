"""What one session or job writes to the store: its events and its row, always deferred.

A ``Session`` and a ``Job`` write the same two things, through one ``Persistence`` each: the
events of their stream (all of a job's; only the kinds that tell a session's story, since a
session publishes a ``media.chunk`` per chunk for hours) and updates of their own row. Every
write goes through ``Store.defer`` (the store's one writer thread), so nothing here blocks the
event loop; without a store (unit tests) every call is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from sessions.events import Event, encode_event
from sessions.store import Store

__all__ = ["SESSION_EVENT_TYPES", "Persistence"]

# The events of a session that tell its story (what a replay or an audit reads back).
SESSION_EVENT_TYPES = frozenset(
    {
        "session.state",
        "input.received",
        "input.superseded",
        "prompt.applied",
        "action.applied",
        "audio.applied",
        "error",
        "feedback.recorded",
        "livekit.state",
    }
)


class Persistence:
    """The store writes of the session or job ``owner_id`` (its ``row`` says which table).

    ``event_types``: the event types written (None: every one). ``event`` is an
    ``EventStream`` sink.
    """

    def __init__(
        self,
        store: Store | None,
        owner_id: str,
        *,
        row: Literal["session", "job"],
        event_types: frozenset[str] | None = None,
    ) -> None:
        self.store = store
        self._owner_id = owner_id
        self._event_types = event_types
        self._update: Callable[..., Any] | None = None
        if store is not None:
            self._update = store.update_session if row == "session" else store.update_job

    def event(self, event: Event) -> None:
        if self.store is None:
            return
        event_type = type(event).__struct_config__.tag
        if self._event_types is None or event_type in self._event_types:
            self.store.defer(
                self.store.add_event,
                self._owner_id,
                event.event_id,
                event_type,
                encode_event(event),
                event.time_s,
            )

    def update(self, **fields: Any) -> None:
        """Updates the owner's row (the columns ``Store.update_session`` / ``update_job`` take)."""
        if self.store is not None and self._update is not None:
            self.store.defer(self._update, self._owner_id, **fields)
