"""What one session or job writes to the store: its events and its row, always deferred.

A ``Session`` and a ``Job`` write the same two things, through one ``Persistence`` each: the
events of their stream (all of a job's; only the kinds that tell a session's story, since a
session publishes a ``media.chunk`` per chunk for hours) and updates of their own row. Every
write goes through ``Store.defer`` (the store's one writer thread), so nothing here blocks the
event loop; without a store (unit tests) every call is a no-op.

A session stores only some of its events, so the largest stored id is not the last one it
published (a ``media.chunk`` most of the time). Its row also keeps ``event_id_ceiling``: no
event of the session has a larger id. It is written ahead, ``EVENT_ID_RESERVE`` ids at a time
(one row update per that many events), and exactly at the session's end (``closed`` or
``failed``). A session resumed in a later process numbers its events from above the ceiling
(``sessions.resume``): after a graceful shutdown they go on from the very next id; after a kill
they jump ahead at most ``EVENT_ID_RESERVE``, and no id is ever used twice, so an SSE client's
``Last-Event-ID`` never hides a new event nor replays an old one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from sessions.events import Event, encode_event
from sessions.store import Store

__all__ = ["EVENT_ID_RESERVE", "SESSION_EVENT_TYPES", "Persistence"]

EVENT_ID_RESERVE = 64  # event ids a session's row reserves ahead (module docstring)

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
        self._update: Callable[..., object] | None = None
        if store is not None:
            self._update = store.update_session if row == "session" else store.update_job
        self._ceiling: int | None = 0 if row == "session" else None  # ids written ahead to

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
        if self._ceiling is None:
            return
        if self._ceiling == 0:
            # The first event (``created``) is published before the host defers the row's
            # insert: reserving now would update no row. It is stored (a ``session.state``),
            # so the next event reserves, after the insert.
            self._ceiling = event.event_id
            return
        if event_type == "session.state" and getattr(event, "state", "") in ("closed", "failed"):
            self._ceiling = event.event_id  # its end: the next process goes on from the next id
            self.update(event_id_ceiling=self._ceiling)
        elif event.event_id > self._ceiling:
            self._ceiling = event.event_id + EVENT_ID_RESERVE
            self.update(event_id_ceiling=self._ceiling)

    def update(self, **fields: object) -> None:
        """Updates the owner's row (the columns ``Store.update_session`` / ``update_job`` take)."""
        if self.store is not None and self._update is not None:
            self.store.defer(self._update, self._owner_id, **fields)
