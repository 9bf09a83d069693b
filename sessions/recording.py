"""Where and how a server records behaviour beyond the store: replay snapshots and chunk media.

Layout under the data directory (paths in records are relative to it)::

    snapshots/<loop id>/<step:012d>.snap    loop-state snapshots (runtime.snapshot format)
    media/<session id>/<segment>_<chunk>.mp4  each recorded chunk's frames, as generated

Media are kept **at generation time**, encoded by PyAV on the writer thread: an export then
needs neither the model nor a GPU, costs no generation time, and works on any machine (a replay
is bit-identical only on the device type and build that generated the chunk). A chunk's MP4 is
a few kB at 96x96 and some tens of kB at 832x480; the frames digest in the record is of the raw
uint8 frames, not of the (lossy) MP4.

All file work runs on one writer thread (never on the event loop), each file written to a
temporary name and renamed (a crash leaves the old file or the new one, never a torn one).
Chunk media are encoded with libx264's ``ultrafast`` preset (a 64x64 chunk of 12 frames costs
~6 ms of CPU) and at most ``max_pending_media`` chunks wait for the writer: beyond that a
chunk's media is not kept (its record says ``media_ref`` null, and the loss is logged), so a
writer that falls behind never grows memory without bound. Snapshots are always queued, and
streamed into their file (a Wan session's state is ~3.5 GB; ``runtime.snapshot``); their size
paces them (``snapshot_mbps``) and bounds how many are kept (``snapshot_keep_gb``).
``close()`` drains the queue (server shutdown); a killed process loses what was still queued.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sessions.artifacts import write_mp4

__all__ = ["Recording", "media_ref", "snapshot_path"]

log = logging.getLogger(__name__)


def snapshot_path(data_dir: Path, replay_key: str) -> Path:
    """The file of a replay key ``"<loop id>@<step>"``."""
    loop_id, _, step = replay_key.rpartition("@")
    return data_dir / "snapshots" / loop_id / f"{int(step):012d}.snap"


def media_ref(session_id: str, segment: int, chunk: int) -> str:
    return f"media/{session_id}/{segment}_{chunk}.mp4"


class Recording:
    """A server's recording settings and its writer thread (module docstring).

    ``snapshot_every``: chunks between replay snapshots of a loop (0: none, so no replay);
    ``snapshot_mbps``: at most this many MB of snapshots per second of wall time per loop (a
    big state waits longer than ``snapshot_every`` chunks; 0: no limit); ``snapshot_keep``: the
    newest snapshots kept per loop (older files are deleted: records that name them can no
    longer be replayed), fewer if they would take more than ``snapshot_keep_gb`` GB (0: no
    limit; the newest is always kept); ``media``: keep chunk MP4s; ``snapshot_dir``:
    where the snapshots go (default ``data_dir``; a fleet's shared storage, ``sessions.handoff``).
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        snapshot_every: int = 8,
        snapshot_keep: int = 16,
        snapshot_mbps: float = 64.0,
        snapshot_keep_gb: float = 8.0,
        media: bool = True,
        max_pending_media: int = 64,
        snapshot_dir: str | Path | None = None,
    ) -> None:
        if snapshot_every < 0 or snapshot_keep < 1 or snapshot_mbps < 0 or snapshot_keep_gb < 0:
            raise ValueError(
                f"snapshot_every, snapshot_mbps and snapshot_keep_gb must be >= 0 and "
                f"snapshot_keep >= 1, got {snapshot_every}, {snapshot_mbps}, "
                f"{snapshot_keep_gb} and {snapshot_keep}"
            )
        self.data_dir = Path(data_dir)
        self.snapshot_dir = self.data_dir if snapshot_dir is None else Path(snapshot_dir)
        self.snapshot_every = snapshot_every
        self.snapshot_keep = snapshot_keep
        self.snapshot_mbps = snapshot_mbps
        self.snapshot_keep_gb = snapshot_keep_gb
        self.media = media
        self.max_pending_media = max_pending_media
        self._pending_media = 0  # chunks queued, not yet written (event-loop side count)
        self.media_dropped = 0
        self._lock = threading.Lock()
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dreamrt-recording"
        )
        self._closed = False

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        """Runs ``fn(*args)`` on the writer thread, in order; failures are logged."""
        if self._closed:
            log.warning("recording closed; dropping %s", getattr(fn, "__name__", fn))
            return
        self._writer.submit(_logged, fn, *args)

    def write_media(self, ref: str, frames: np.ndarray, fps: int) -> bool:
        """Queue the chunk's frames (uint8 [n, H, W, 3], owned by the caller no more); False
        when media are off or ``max_pending_media`` chunks already wait (not kept)."""
        if not self.media or self._closed:
            return False
        with self._lock:
            if self._pending_media >= self.max_pending_media:
                self.media_dropped += 1
                log.warning("recording writer behind: media of %s not kept", ref)
                return False
            self._pending_media += 1
        self.submit(self._write_media, self.data_dir / ref, frames, fps)
        return True

    def _write_media(self, path: Path, frames: np.ndarray, fps: int) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_mp4(frames, path, fps=fps, preset="ultrafast")
        finally:
            with self._lock:
                self._pending_media -= 1

    def write_snapshot(self, replay_key: str, write: Callable[[BinaryIO], int]) -> None:
        """Queue ``write(file)`` (``runtime.snapshot.write_snapshot`` of a clone: it serialises
        on the writer thread) into the key's file, then apply the retention limits to its
        loop's snapshots."""
        self.submit(self._write_snapshot, replay_key, write)

    def snapshot_pause_s(self, nbytes: int) -> float:
        """Seconds a loop waits after a snapshot of ``nbytes`` before its next one, so that
        snapshots write at most ``snapshot_mbps`` MB per second of wall time (0: no pause)."""
        return nbytes / (self.snapshot_mbps * 1e6) if self.snapshot_mbps > 0 else 0.0

    def _write_snapshot(self, replay_key: str, write: Callable[[BinaryIO], int]) -> None:
        path = snapshot_path(self.snapshot_dir, replay_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial")
        try:
            with tmp.open("wb") as fh:
                write(fh)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed write leaves no partial file behind
            raise
        os.replace(tmp, path)
        self._retain(path.parent)

    def _retain(self, folder: Path) -> None:
        """Keeps the newest ``snapshot_keep`` snapshots of a loop, fewer if they would take
        more than ``snapshot_keep_gb`` together (never fewer than the newest one)."""
        kept = sorted(folder.glob("*.snap"), reverse=True)
        budget, total = self.snapshot_keep_gb * 1e9, 0
        for i, snap in enumerate(kept):
            total += snap.stat().st_size
            if i >= self.snapshot_keep or (i > 0 and self.snapshot_keep_gb > 0 and total > budget):
                snap.unlink(missing_ok=True)

    def close(self) -> None:
        """Waits for every queued write. Idempotent."""
        if not self._closed:
            self._closed = True
            self._writer.shutdown(wait=True)


def _logged(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("recording write %s failed", getattr(fn, "__name__", fn))
