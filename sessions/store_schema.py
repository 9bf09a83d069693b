"""The store's SQLite schema (``sessions.store.Store``, whose docstring says what each table
holds): the tables, the columns added since schema version 1, which record columns hold JSON,
and how a file is brought to the current version when it is opened (``open_schema``: missing
tables created, missing columns added with ``ALTER TABLE``, the version recorded in ``meta``).
"""

from __future__ import annotations

import sqlite3

__all__ = ["RECORD_JSON", "SCHEMA_VERSION", "open_schema"]

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, model_id TEXT NOT NULL, prompt TEXT NOT NULL, seed INTEGER NOT NULL,
    fps INTEGER NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL,
    class TEXT NOT NULL, state TEXT NOT NULL, segment INTEGER NOT NULL DEFAULT 0,
    frames_sent INTEGER NOT NULL DEFAULT 0, stalls INTEGER NOT NULL DEFAULT 0,
    fps_measured REAL NOT NULL DEFAULT 0, error TEXT, fork_of TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, model_id TEXT NOT NULL, prompt TEXT NOT NULL,
    params TEXT NOT NULL, state TEXT NOT NULL, progress REAL NOT NULL DEFAULT 0, error TEXT,
    artifact_path TEXT, media_type TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    owner_id TEXT NOT NULL, event_id INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    time_s REAL NOT NULL, PRIMARY KEY (owner_id, event_id)
);
CREATE TABLE IF NOT EXISTS records (
    session_id TEXT NOT NULL, segment INTEGER NOT NULL, chunk INTEGER NOT NULL,
    seed INTEGER NOT NULL, model_id TEXT NOT NULL, weights_version TEXT NOT NULL,
    loop_id TEXT NOT NULL, sampler TEXT NOT NULL, steps INTEGER NOT NULL, timesteps TEXT NOT NULL,
    precision TEXT NOT NULL, prompt TEXT NOT NULL, prompt_seq INTEGER NOT NULL,
    actions TEXT NOT NULL, pts_start INTEGER NOT NULL, pts_end INTEGER NOT NULL,
    num_frames INTEGER NOT NULL, digest TEXT NOT NULL, replay_key TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (session_id, segment, chunk)
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, chunk INTEGER,
    rating INTEGER NOT NULL, note TEXT, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS forks (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, n INTEGER NOT NULL,
    prompt TEXT, candidates TEXT NOT NULL, chosen TEXT, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS preferences (
    id INTEGER PRIMARY KEY AUTOINCREMENT, context_ref TEXT NOT NULL, chosen_ref TEXT NOT NULL,
    rejected_ref TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS inputs (
    loop_id TEXT NOT NULL, step INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
    payload BLOB NOT NULL, received_s REAL NOT NULL, PRIMARY KEY (loop_id, step, seq)
);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY, scope TEXT NOT NULL, expires_at REAL NOT NULL, created_at REAL NOT NULL
);
"""

# Columns added after schema version 1 (``ALTER TABLE`` on an older file), name -> SQL type.
_ADDED_COLUMNS = {
    "records": {
        "recipe_id": "TEXT",
        "weights_label": "TEXT",
        "loop_ref": "TEXT",
        "rng": "TEXT",
        "noise_seeds": "TEXT",
        "sigmas": "TEXT",
        "prompt_digest": "TEXT",
        "action_digest": "TEXT",
        "audio_digest": "TEXT",
        "kv_window": "TEXT",
        "latent_frame_start": "INTEGER",
        "fps": "INTEGER",
        "width": "INTEGER",
        "height": "INTEGER",
        "media_ref": "TEXT",
        "restart_policy": "TEXT",
        "attention": "TEXT",
        "decoder": "TEXT",
        "step_batch": "INTEGER",
        "group_id": "TEXT",
        "adapters": "TEXT",
    },
    "preferences": {"session_id": "TEXT", "model_id": "TEXT", "weights_version": "TEXT"},
    "forks": {"seeds": "TEXT", "context_ref": "TEXT"},
    "sessions": {"event_id_ceiling": "INTEGER"},  # sessions.persistence
}
# record columns holding JSON
RECORD_JSON = ("timesteps", "actions", "noise_seeds", "sigmas", "kv_window", "adapters")


def open_schema(conn: sqlite3.Connection) -> None:
    """Creates the tables ``conn``'s file lacks, adds the columns an older file lacks and
    records the schema version (a file of any earlier version opens as the current one)."""
    conn.executescript(_SCHEMA)
    _migrate(conn)
    conn.execute(
        "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
        (str(SCHEMA_VERSION),),
    )


def _migrate(conn: sqlite3.Connection) -> None:
    for table, columns in _ADDED_COLUMNS.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, sql_type in columns.items():
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
