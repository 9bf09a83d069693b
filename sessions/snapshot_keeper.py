"""Replay snapshots of one engine loop, and the replay key of each chunk it generates.

A snapshot is taken at the loop's first boundary (before chunk 0) and then at the chunk
boundary after every ``Recording.snapshot_every`` chunks, but no sooner than its size allows
(``Recording.snapshot_pause_s``: a 3.5-GB Wan state at 64 MB/s waits ~55 s, a tiny-world state
of a few MB never waits). Taking one costs the event loop a state clone on the device
(``runtime.snapshot.clone_state``: no host copy, no sync); the host copy and the file write
run on the recording writer thread (``runtime.snapshot.write_snapshot``, streamed). The key of
a chunk is the newest snapshot taken at or before the step its decode was described at (the
``step`` of its capture): replaying from there with the loop's input log regenerates it
(``server.data.replay``). A key names its file (``recording.snapshot_path``) as soon as the clone is
taken; a write that then fails (logged) leaves a key whose replay reports the missing file.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable
from functools import partial

from runtime.contract import LoopState
from runtime.loop_handle import LoopStatusError
from runtime.snapshot import clone_state, snapshot_nbytes, write_snapshot
from sessions.loop_handle import LoopHandleLike
from sessions.recording import Recording

__all__ = ["SnapshotKeeper"]

log = logging.getLogger(__name__)


class SnapshotKeeper:
    """See the module docstring. Event-loop thread only. ``clock``: the monotonic time the
    snapshot pause is paced on."""

    def __init__(
        self,
        recording: Recording,
        handle: LoopHandleLike,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recording = recording
        self._clock = clock
        self._handle = handle
        self.loop_id = handle.loop_id
        self._steps: list[int] = []  # steps of the snapshots taken, ascending
        self._chunks_since = 0
        self._not_before_s = 0.0  # monotonic time the size of the last snapshot paces to
        self._pending: asyncio.Future[None] | None = None

    def start(self) -> None:
        self._request()

    def chunk_done(self) -> None:
        """A chunk of this loop was recorded: request a snapshot every ``snapshot_every``."""
        self._chunks_since += 1
        if (
            self._chunks_since >= self._recording.snapshot_every
            and self._clock() >= self._not_before_s
        ):
            self._request()

    def key_for(self, step: int) -> str:
        """The replay key of a chunk decoded at ``step`` ("" if no snapshot precedes it)."""
        i = bisect.bisect_right(self._steps, step)
        return f"{self.loop_id}@{self._steps[i - 1]}" if i else ""

    def _request(self) -> None:
        if self._pending is not None and not self._pending.done():
            return
        self._pending = self._handle.at_boundary(self._clone, after_chunk=True)
        self._pending.add_done_callback(self._taken)

    def _taken(self, future: asyncio.Future[None]) -> None:
        exc = None if future.cancelled() else future.exception()
        if isinstance(exc, LoopStatusError):
            log.debug("loop %s ended before its next snapshot", self.loop_id)
        elif exc is not None:
            log.error("loop %s: replay snapshot failed: %r", self.loop_id, exc)

    def _clone(self, state: LoopState) -> None:
        step = int(state.step)
        clone = clone_state(state)
        if not self._steps or step > self._steps[-1]:
            self._steps.append(step)
        self._chunks_since = 0
        pause_s = self._recording.snapshot_pause_s(snapshot_nbytes(clone))
        self._not_before_s = self._clock() + pause_s
        self._recording.write_snapshot(f"{self.loop_id}@{step}", partial(write_snapshot, clone))
