"""``dreamrt export``: the behaviour and preference dataset of a data directory, as Parquet.

    dreamrt export --data-dir DIR --out DIR [--since ISO8601] [--format parquet] [--latents]

Layout of ``--out`` (README.md written there says the same, with the schema)::

    records/part-00000.parquet       one row per generated chunk (``RECORD_SCHEMA``)
    preferences/part-00000.parquet   one row per preference (``PREFERENCE_SCHEMA``): a rating,
                                     or a fork choice (one row per rejected candidate)
    media/<session>/<segment>_<chunk>.mp4            each exported chunk's frames, or with
    latents/<session>/<segment>_<chunk>.safetensors  --latents its final latents (replayed)
    export.json                      the parts written so far and the time window of each

``pandas.read_parquet(out / "records")`` and ``datasets.load_dataset("parquet",
data_dir=out / "records")`` read it as is (likewise ``preferences``); the README's front
matter declares both as configs, so ``datasets.load_dataset(str(out), "records")`` works too.

Incremental: a run exports the rows committed up to its start; ``--since T`` exports those
after T into a *new* part (existing files are never rewritten); without ``--since`` an output
that already has parts is refused. The store is read through SQLite (WAL: a running server
keeps writing meanwhile). A progress bar goes to stderr.

Exit codes: 0 done, 1 failed, 2 bad usage (bad time, existing export without ``--since``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["ExportError", "ExportSummary", "add_parser", "export", "main"]


class ExportError(ValueError):
    """The export cannot run as asked (the message says why)."""


class ExportSummary(dict[str, Any]):
    """What one run wrote: ``records``, ``preferences``, ``media`` counts and ``part``."""


def parse_since(text: str) -> float:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ExportError(f"--since {text!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def export(
    data_dir: Path,
    out: Path,
    *,
    since_s: float | None = None,
    latents: bool = False,
    progress: Any = None,
    until_s: float | None = None,
) -> ExportSummary:
    """Export the rows committed after ``since_s`` (all when None) up to now (``until_s``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from server.data.export_schema import (
        PREFERENCE_SCHEMA,
        RECORD_SCHEMA,
        preference_rows,
        readme,
        record_row,
    )

    db = data_dir / "dreamrt.sqlite3"
    if not db.is_file():
        raise ExportError(f"{db} does not exist: is {data_dir} a dreamrt data directory?")
    manifest_path = out / "export.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"parts": []}
    if manifest["parts"] and since_s is None:
        raise ExportError(
            f"{out} already holds an export ({len(manifest['parts'])} parts); pass --since "
            f"(the last part ends at {manifest['parts'][-1]['until']})"
        )
    until_s = time.time() if until_s is None else until_s
    lower = -1.0 if since_s is None else since_s
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        records = _rows(conn, "records", lower, until_s, "session_id, segment, chunk")
        feedback = _rows(conn, "feedback", lower, until_s, "id")
        pairs = _rows(conn, "preferences", lower, until_s, "id")
        sessions = {r["id"]: r for r in _rows(conn, "sessions", -1.0, float("inf"), "id")}
        context = _record_index(conn)
    finally:
        conn.close()
    bar = progress or _Progress(len(records))
    index = len(manifest["parts"])
    part = f"part-{index:05d}.parquet"
    record_out, media = [], 0
    replayer = _LatentReplayer(data_dir) if latents else None
    for i, row in enumerate(records):
        ref = _copy_media(data_dir, out, row, replayer)
        media += ref is not None
        record_out.append(record_row(row, ref))
        bar.update(i + 1)
    bar.close()
    prefs = preference_rows(feedback, pairs, sessions, context)
    for name, schema, rows in (
        ("records", RECORD_SCHEMA, record_out),
        ("preferences", PREFERENCE_SCHEMA, prefs),
    ):
        (out / name).mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(rows, schema=schema)
        tmp = out / name / f".{part}.partial"
        pq.write_table(table, tmp)
        tmp.replace(out / name / part)
    entry = {
        "part": part,
        "since": None if since_s is None else _iso(since_s),
        "until": _iso(until_s),
        "records": len(record_out),
        "preferences": len(prefs),
    }
    manifest["parts"].append(entry)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    (out / "README.md").write_text(readme(manifest, latents=latents))
    return ExportSummary(entry, media=media)


def _rows(
    conn: sqlite3.Connection, table: str, lower: float, upper: float, order: str
) -> list[dict[str, Any]]:
    sql = f"SELECT * FROM {table} WHERE created_at > ? AND created_at <= ? ORDER BY {order}"
    return [dict(r) for r in conn.execute(sql, (lower, upper))]


def _record_index(conn: sqlite3.Connection) -> dict[tuple[str, int], dict[str, Any]]:
    """(session, chunk) -> model and weights of that chunk, for the preferences' columns."""
    sql = "SELECT session_id, chunk, model_id, weights_version FROM records"
    return {(r[0], r[1]): {"model_id": r[2], "weights_version": r[3]} for r in conn.execute(sql)}


def _copy_media(
    data_dir: Path, out: Path, row: dict[str, Any], replayer: _LatentReplayer | None
) -> str | None:
    if replayer is not None:
        return replayer.write(out, row)
    ref = row.get("media_ref")
    if not ref or not (data_dir / ref).is_file():
        return None
    target = out / ref
    if not target.exists():  # an earlier part may have it already: never rewritten
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(data_dir / ref, target)
    return ref


class _LatentReplayer:
    """``--latents``: each chunk's final latents, regenerated through ``server.data.replay`` (the
    server keeps the frames of a chunk, not its latents: they are ~10x larger)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._instances: dict[str, Any] = {}

    def write(self, out: Path, row: dict[str, Any]) -> str | None:
        from safetensors.torch import save_file

        from server.data.replay import ReplayError, load_model, replay_chunk

        model = row["model_id"]
        if model not in self._instances:
            self._instances[model] = load_model(row)
        try:
            result = replay_chunk(
                self._data_dir,
                row["session_id"],
                row["chunk"],
                segment=row["segment"],
                instance=self._instances[model],
            )
        except ReplayError:
            return None
        if not result.matches or result.latents is None:
            return None
        ref = f"latents/{row['session_id']}/{row['segment']}_{row['chunk']}.safetensors"
        target = out / ref
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            save_file({"latents": result.latents.contiguous()}, str(target))
        return ref


class _Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width = total, width
        self.update(0)

    def update(self, done: int) -> None:
        filled = self.width * done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\rexport records [{bar}] {done}/{self.total}")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def add_parser(sub: argparse._SubParsersAction, parents: Iterable[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write the behaviour/preference dataset", parents=parents)
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--since", default=None, metavar="ISO8601", help="rows after this time only")
    p.add_argument("--format", default="parquet", choices=["parquet"])
    p.add_argument(
        "--latents",
        action="store_true",
        help="final latents as safetensors (regenerated by replay) instead of the chunk MP4s",
    )


def main(args: argparse.Namespace) -> int:
    try:
        since = None if args.since is None else parse_since(args.since)
        summary = export(args.data_dir, args.out, since_s=since, latents=args.latents)
    except ExportError as exc:
        sys.stderr.write(f"dreamrt export: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"dreamrt export: {exc}\n")
        return 1
    sys.stdout.write(
        f"exported {summary['records']} records, {summary['preferences']} preferences, "
        f"{summary['media']} media files into {args.out} ({summary['part']})\n"
    )
    return 0
