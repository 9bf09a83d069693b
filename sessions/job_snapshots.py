"""Periodic snapshots of one running job, so that a killed server resumes it where it was.

A graceful shutdown snapshots every running job at its next step boundary (``JobHost.suspend``);
a killed process gets no such chance. So a running job is also snapshotted as it goes: at the
step boundary after every ``Recording.snapshot_every`` progress steps (plans), no sooner than
the size of its last snapshot allows (``Recording.snapshot_pause_s``, as for sessions), into
``snapshots/<job id>/<step>.snap`` like every other loop snapshot. The next process restores
the newest one (``JobHost.resume_jobs``): the steps after it
run again, with the same seed, so the artifact is the one an uninterrupted run makes.

Taking one costs the event loop a state clone on the device (``runtime.snapshot.clone_state``);
the host copy and the file write run on the recording writer thread. When the job ends
(succeeded, failed, cancelled) its snapshots are deleted, after any write still queued: nothing
is left to resume, and a server running jobs for hours must not fill its disk with them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from functools import partial

from runtime.contract import LoopState
from runtime.loop_handle import LoopStatusError
from runtime.snapshot import clone_state, snapshot_nbytes, write_snapshot
from sessions.loop_handle import LoopHandleLike
from sessions.recording import Recording

__all__ = ["JobSnapshots"]

log = logging.getLogger(__name__)


class JobSnapshots:
    """See the module docstring. Event-loop thread only. ``clock``: the monotonic time the
    pause after a snapshot is paced on. ``steps``: the steps of the snapshots taken."""

    def __init__(
        self,
        recording: Recording,
        handle: LoopHandleLike,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recording = recording
        self._handle = handle
        self._clock = clock
        self.loop_id = handle.loop_id
        self._steps_since = 0
        self._not_before_s = 0.0
        self._pending: asyncio.Future[int] | None = None
        self._ended = False
        self.steps: list[int] = []

    def step_done(self) -> None:
        """The job reported a step of progress: snapshot at the next boundary when due."""
        every = self._recording.snapshot_every
        if self._ended or every <= 0:
            return
        self._steps_since += 1
        if self._steps_since < every or self._clock() < self._not_before_s:
            return
        if self._pending is not None and not self._pending.done():
            return
        self._pending = self._handle.at_boundary(self._take)
        self._pending.add_done_callback(self._taken)

    def discard(self) -> None:
        """The job ended: delete its snapshots once the writes queued before are done.
        Idempotent."""
        if self._ended:
            return
        self._ended = True
        folder = self._recording.snapshot_dir / "snapshots" / self.loop_id
        self._recording.submit(partial(shutil.rmtree, folder, ignore_errors=True))

    def _take(self, state: LoopState) -> int:
        step = int(state.step)
        self._steps_since = 0
        if self._ended or (self.steps and step <= self.steps[-1]):
            return step
        clone = clone_state(state)
        self.steps.append(step)
        self._not_before_s = self._clock() + self._recording.snapshot_pause_s(
            snapshot_nbytes(clone)
        )
        self._recording.write_snapshot(f"{self.loop_id}@{step}", partial(write_snapshot, clone))
        return step

    def _taken(self, future: asyncio.Future[int]) -> None:
        exc = None if future.cancelled() else future.exception()
        if isinstance(exc, LoopStatusError):
            log.debug("job %s ended before its next snapshot", self.loop_id)
        elif exc is not None:
            log.error("job %s: snapshot failed: %r", self.loop_id, exc)
