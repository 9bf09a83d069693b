"""A session's row keeps a ceiling over its event ids (``Persistence``): most of its events
(``media.chunk``) are not stored, yet a later process must number its new ones above every id
a client may have seen."""

from __future__ import annotations

from sessions.events import EventStream, MediaChunk, SessionStateChanged
from sessions.persistence import EVENT_ID_RESERVE, SESSION_EVENT_TYPES, Persistence
from sessions.store import Store


def chunk_event(k: int) -> MediaChunk:
    return MediaChunk(chunk=k, pts_start=k * 100, frames=4, segment=0, digest="0" * 16)


def ceiling(store: Store, session_id: str) -> int | None:
    return store.get_session(session_id)["event_id_ceiling"]


def test_the_ceiling_is_reserved_ahead_then_exact_at_the_end(tmp_path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    events = EventStream(first_id=1)
    events.add_sink(Persistence(store, "s1", row="session", event_types=SESSION_EVENT_TYPES).event)
    events.publish(SessionStateChanged(state="created"))  # as a Session does, then its host:
    store.defer(
        store.add_session,
        session_id="s1",
        model_id="m",
        prompt="p",
        seed=0,
        fps=8,
        width=8,
        height=8,
        priority_class="realtime",
        state="created",
    )
    events.publish(SessionStateChanged(state="live"))
    for k in range(3):
        events.publish(chunk_event(k))  # not stored
    stored = [e["event_id"] for e in _drained(store).events("s1")]
    assert stored == [1, 2] and events.last_id == 5
    assert ceiling(store, "s1") == 2 + EVENT_ID_RESERVE  # one write covers the next ids
    for k in range(3, 3 + EVENT_ID_RESERVE):
        events.publish(chunk_event(k))
    assert events.last_id == 5 + EVENT_ID_RESERVE
    assert ceiling(_drained(store), "s1") == 3 + 2 * EVENT_ID_RESERVE  # reserved again at 67
    events.publish(SessionStateChanged(state="closed", previous="live"))
    assert ceiling(_drained(store), "s1") == events.last_id  # exact: the next id follows it
    store.close()


def _drained(store: Store) -> Store:
    """``store`` once its deferred writes ran (the writer thread is FIFO)."""
    store._writer.submit(lambda: None).result()  # noqa: SLF001 - a barrier, tests only
    return store
