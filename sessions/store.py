"""The durable store: one SQLite file (WAL) under ``--data-dir`` (docs/architecture.md §5).

Tables: ``sessions`` and ``jobs`` (their last known state and parameters), ``events`` (the
lifecycle/acknowledgement events needed to reconstruct what happened — not every media
chunk), ``records`` (one behaviour record per generated chunk: enough to replay it),
``feedback``, ``forks``, ``preferences`` (pairs for RL export), ``inputs`` (the input log:
every input as its loop absorbed it, by loop and step, so a replay feeds it back at the same
boundary) and ``tokens`` (hashes of issued API tokens). Times are Unix seconds (``*_at`` REAL).
Their columns, and how an older file is migrated when opened, are ``sessions.store_schema``.

Durability: the connection runs ``synchronous=NORMAL`` (WAL: a commit survives a killed
process; only an OS crash or power loss may take the last commits back) and switches to
``synchronous=FULL`` around the writes an answer promises (feedback, fork, choose:
``durable=True``), so their 201 means the row is on disk. Deferred writes (events, records, the
input log) queue on the writer thread: a kill loses what still waits; ``close()`` drains it.

Threading: the synchronous methods are safe from any thread (one connection, one lock); the
asyncio side calls them through the single writer thread: ``await store.run(store.method, ...)``
resolves after COMMIT (durable before the answer), ``store.defer(...)`` is fire-and-forget
(failures logged). ``close()`` drains the writer and is idempotent.

Recovery (``recover()``): sessions a previous process left live are ``failed`` (a client may
resume one from its snapshot: ``sessions.resume``); its unfinished jobs are queued again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar, cast

from sessions.store_rows import (
    EventRow,
    FeedbackRow,
    ForkRow,
    InputRow,
    JobParams,
    JobRow,
    PreferenceRow,
    RecordRow,
    SessionRow,
    TokenRow,
)
from sessions.store_schema import RECORD_JSON, SCHEMA_VERSION, open_schema

__all__ = ["SCHEMA_VERSION", "Store"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Row = TypeVar("Row", bound=Mapping[str, object])

_SESSION_FIELDS = frozenset(
    {"state", "segment", "frames_sent", "stalls", "fps_measured", "error", "prompt"}
    | {"event_id_ceiling"}
)
_JOB_FIELDS = frozenset({"state", "progress", "error", "artifact_path", "media_type"})
_LIVE_SESSION_STATES = ("created", "negotiating", "live", "paused", "closing")


class Store:
    """SQLite persistence for sessions, jobs, events, records, feedback, preferences, tokens."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        open_schema(self._conn)  # sessions.store_schema: tables, added columns, version
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dreamrt-store"
        )
        self._closed = False

    # ---------------------------------------------------------------- async bridge

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Runs ``fn`` on the writer thread; resolves after it returned (and committed)."""
        return await asyncio.wrap_future(self._writer.submit(fn, *args, **kwargs))

    def defer(self, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        """Fire-and-forget on the writer thread, in submission order; failures are logged."""
        if self._closed:
            log.warning("store closed; dropping deferred %s", getattr(fn, "__name__", fn))
            return
        future = self._writer.submit(fn, *args, **kwargs)
        future.add_done_callback(_log_failure)

    def close(self) -> None:
        """Waits for queued writes, then closes the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writer.shutdown(wait=True)
        with self._lock:
            self._conn.close()

    # ---------------------------------------------------------------- helpers

    def _durable(self, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
        """One statement committed with ``synchronous=FULL`` (on disk when this returns)."""
        with self._lock:
            self._conn.execute("PRAGMA synchronous=FULL")
            try:
                return self._conn.execute(sql, params)
            finally:
                self._conn.execute("PRAGMA synchronous=NORMAL")

    def synchronous(self) -> int:
        """The connection's current ``synchronous`` level (1 NORMAL, 2 FULL)."""
        level = self._query("PRAGMA synchronous")[0]["synchronous"]
        assert isinstance(level, int)  # SQLite answers an INTEGER
        return level

    def _execute(
        self, sql: str, params: tuple[object, ...] | Mapping[str, object] = ()
    ) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.execute(sql, params)

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[dict[str, object]]:
        """The rows of ``sql`` as dicts (column -> SQLite value); the typed readers below cast
        them to their table's row (``sessions.store_rows``: the schema's columns)."""
        with self._lock:
            return [dict(row) for row in self._conn.execute(sql, params).fetchall()]

    def _rows(self, _row: type[Row], sql: str, params: tuple[object, ...] = ()) -> list[Row]:
        """``_query`` read as rows of ``_row`` (a table's row type: its columns, as stored)."""
        return cast("list[Row]", self._query(sql, params))

    def journal_mode(self) -> str:
        return str(self._query("PRAGMA journal_mode")[0]["journal_mode"])

    # ---------------------------------------------------------------- sessions

    def add_session(
        self,
        *,
        session_id: str,
        model_id: str,
        prompt: str,
        seed: int,
        fps: int,
        width: int,
        height: int,
        priority_class: str,
        state: str,
        fork_of: str | None = None,
    ) -> None:
        now = self._clock()
        self._execute(
            "INSERT INTO sessions(id, model_id, prompt, seed, fps, width, height, class, state,"
            " fork_of, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                session_id,
                model_id,
                prompt,
                seed,
                fps,
                width,
                height,
                priority_class,
                state,
                fork_of,
                now,
                now,
            ),
        )

    def update_session(self, session_id: str, **fields: object) -> None:
        unknown = set(fields) - _SESSION_FIELDS
        if unknown:
            raise ValueError(
                f"unknown session fields {sorted(unknown)}; known: {sorted(_SESSION_FIELDS)}"
            )
        if not fields:
            return
        assignments = ", ".join(f"{name} = :{name}" for name in fields)
        self._execute(
            f"UPDATE sessions SET {assignments}, updated_at = :updated_at WHERE id = :id",
            {**fields, "updated_at": self._clock(), "id": session_id},
        )

    def get_session(self, session_id: str) -> SessionRow | None:
        rows = self._rows(SessionRow, "SELECT * FROM sessions WHERE id = ?", (session_id,))
        return rows[0] if rows else None

    # ---------------------------------------------------------------- jobs

    def add_job(
        self,
        *,
        job_id: str,
        task: str,
        model_id: str,
        prompt: str,
        params: JobParams,
        state: str,
    ) -> None:
        now = self._clock()
        self._execute(
            "INSERT INTO jobs(id, task, model_id, prompt, params, state, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (job_id, task, model_id, prompt, json.dumps(params, sort_keys=True), state, now, now),
        )

    def update_job(self, job_id: str, **fields: object) -> None:
        unknown = set(fields) - _JOB_FIELDS
        if unknown:
            raise ValueError(f"unknown job fields {sorted(unknown)}; known: {sorted(_JOB_FIELDS)}")
        if not fields:
            return
        assignments = ", ".join(f"{name} = :{name}" for name in fields)
        self._execute(
            f"UPDATE jobs SET {assignments}, updated_at = :updated_at WHERE id = :id",
            {**fields, "updated_at": self._clock(), "id": job_id},
        )

    def get_job(self, job_id: str) -> JobRow | None:
        rows = self._jobs("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def list_jobs(self, task: str, *, newest_first: bool = True) -> list[JobRow]:
        """Every job of ``task``, by creation time (then id); ``params`` decoded."""
        order = "DESC" if newest_first else "ASC"
        return self._jobs(
            f"SELECT * FROM jobs WHERE task = ? ORDER BY created_at {order}, id {order}", (task,)
        )

    def _jobs(self, sql: str, params: tuple[object, ...]) -> list[JobRow]:
        rows = self._query(sql, params)
        for row in rows:
            row["params"] = json.loads(str(row["params"]))
        return cast("list[JobRow]", rows)

    # ---------------------------------------------------------------- events

    def add_event(
        self, owner_id: str, event_id: int, event_type: str, body: bytes | str, time_s: float
    ) -> None:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        self._execute(
            "INSERT OR REPLACE INTO events(owner_id, event_id, type, body, time_s)"
            " VALUES (?,?,?,?,?)",
            (owner_id, event_id, event_type, text, time_s),
        )

    def events(self, owner_id: str) -> list[EventRow]:
        return self._rows(
            EventRow,
            "SELECT event_id, type, body, time_s FROM events WHERE owner_id = ? ORDER BY event_id",
            (owner_id,),
        )

    # ---------------------------------------------------------------- behaviour records

    def add_record(self, record: Mapping[str, object]) -> None:
        row = dict(record)
        for name in RECORD_JSON:
            if name in row:
                row[name] = json.dumps(row[name], sort_keys=True)
        row.setdefault("created_at", self._clock())
        columns = ", ".join(row)
        placeholders = ", ".join(f":{name}" for name in row)
        self._execute(f"INSERT OR REPLACE INTO records({columns}) VALUES ({placeholders})", row)

    def records(self, session_id: str) -> list[RecordRow]:
        rows = self._query(
            "SELECT * FROM records WHERE session_id = ? ORDER BY segment, chunk", (session_id,)
        )
        for row in rows:
            for name in RECORD_JSON:
                if row.get(name) is not None:
                    row[name] = json.loads(str(row[name]))
        return cast("list[RecordRow]", rows)

    def record(self, session_id: str, chunk: int, segment: int | None = None) -> RecordRow:
        """The record of ``chunk`` (the latest segment's unless ``segment`` is given);
        ``KeyError`` naming the session's recorded chunks when there is none."""
        rows = [
            r
            for r in self.records(session_id)
            if r["chunk"] == chunk and segment in (None, r["segment"])
        ]
        if not rows:
            have = sorted({r["chunk"] for r in self.records(session_id)})
            raise KeyError(f"session {session_id!r} has no record of chunk {chunk}; has {have}")
        return rows[-1]

    # ---------------------------------------------------------------- input log

    def add_inputs(
        self, loop_id: str, step: int, rows: list[tuple[int, str, bytes, float]]
    ) -> None:
        """Inputs handed to loop ``loop_id`` at the boundary after ``step`` plans: (seq, kind,
        payload, received_s) each (``sessions.input_log`` encodes the payloads)."""
        with self._lock:
            self._conn.executemany(
                "INSERT OR REPLACE INTO inputs(loop_id, step, seq, kind, payload, received_s)"
                " VALUES (?,?,?,?,?,?)",
                [(loop_id, step, seq, kind, payload, t) for seq, kind, payload, t in rows],
            )

    def inputs(self, loop_id: str, from_step: int = 0) -> list[InputRow]:
        return self._rows(
            InputRow,
            "SELECT step, seq, kind, payload, received_s FROM inputs"
            " WHERE loop_id = ? AND step >= ? ORDER BY step, seq",
            (loop_id, from_step),
        )

    # ---------------------------------------------------------------- feedback, forks, preferences

    def add_feedback(
        self, *, session_id: str, rating: int, chunk: int | None, note: str | None
    ) -> int:
        cursor = self._durable(
            "INSERT INTO feedback(session_id, chunk, rating, note, created_at) VALUES (?,?,?,?,?)",
            (session_id, chunk, rating, note, self._clock()),
        )
        return int(cursor.lastrowid or 0)

    def feedback(self, session_id: str) -> list[FeedbackRow]:
        return self._rows(
            FeedbackRow, "SELECT * FROM feedback WHERE session_id = ? ORDER BY id", (session_id,)
        )

    def add_fork(
        self,
        *,
        session_id: str,
        n: int,
        prompt: str | None,
        candidates: list[str],
        seeds: list[int] | None = None,
        context_ref: str | None = None,
    ) -> int:
        cursor = self._durable(
            "INSERT INTO forks(session_id, n, prompt, candidates, seeds, context_ref, created_at)"
            " VALUES (?,?,?,?,?,?,?)",
            (
                session_id,
                n,
                prompt,
                json.dumps(candidates),
                json.dumps(seeds),
                context_ref,
                self._clock(),
            ),
        )
        return int(cursor.lastrowid or 0)

    def forks(self, session_id: str) -> list[ForkRow]:
        """The forks of ``session_id``, newest first (``candidates`` decoded)."""
        rows = self._query(
            "SELECT * FROM forks WHERE session_id = ? ORDER BY id DESC", (session_id,)
        )
        for row in rows:
            row["candidates"] = json.loads(str(row["candidates"]))
        return cast("list[ForkRow]", rows)

    def find_fork(self, session_id: str, candidate: str) -> ForkRow | None:
        return next((r for r in self.forks(session_id) if candidate in r["candidates"]), None)

    def choose_fork(
        self,
        fork_id: int,
        chosen: str,
        context_ref: str,
        rejected: list[str],
        *,
        session_id: str | None = None,
        model_id: str | None = None,
        weights_version: str | None = None,
    ) -> None:
        """Records the choice and one preference pair per rejected candidate, atomically and
        durably (``synchronous=FULL``)."""
        now = self._clock()
        pairs = [
            (context_ref, chosen, other, "fork-choice", now, session_id, model_id, weights_version)
            for other in rejected
        ]
        with self._lock:
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("BEGIN")
            try:
                self._conn.execute("UPDATE forks SET chosen = ? WHERE id = ?", (chosen, fork_id))
                self._conn.executemany(
                    "INSERT INTO preferences(context_ref, chosen_ref, rejected_ref, source,"
                    " created_at, session_id, model_id, weights_version)"
                    " VALUES (?,?,?,?,?,?,?,?)",
                    pairs,
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            finally:
                self._conn.execute("PRAGMA synchronous=NORMAL")

    def preferences(self) -> list[PreferenceRow]:
        return self._rows(PreferenceRow, "SELECT * FROM preferences ORDER BY id")

    # ---------------------------------------------------------------- tokens

    def add_token(self, *, token_hash: str, scope: str, expires_at: float) -> None:
        self._execute(
            "INSERT INTO tokens(hash, scope, expires_at, created_at) VALUES (?,?,?,?)",
            (token_hash, scope, expires_at, self._clock()),
        )

    def get_token(self, token_hash: str) -> TokenRow | None:
        rows = self._rows(TokenRow, "SELECT * FROM tokens WHERE hash = ?", (token_hash,))
        return rows[0] if rows else None

    # ---------------------------------------------------------------- recovery

    def recover(self) -> list[JobRow]:
        """Marks interrupted sessions failed; returns interrupted jobs (to queue again)."""
        placeholders = ",".join("?" * len(_LIVE_SESSION_STATES))
        self._execute(
            f"UPDATE sessions SET state = 'failed', error = 'interrupted: the server restarted',"
            f" updated_at = ? WHERE state IN ({placeholders})",
            (self._clock(), *_LIVE_SESSION_STATES),
        )
        return self._jobs(
            "SELECT * FROM jobs WHERE state IN ('queued', 'running') ORDER BY created_at", ()
        )


def _log_failure(future: concurrent.futures.Future[object]) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("deferred store write failed: %r", exc, exc_info=exc)
