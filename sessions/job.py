"""An offline job: a batch-class loop with no viewer and an artifact sink.

The loop is the one the model card names for the task (``ModelCard.loop_for``):
``diffusion_denoise`` on a bidirectional card, ``chunk_rollout`` on a chunk-causal one.

Lifecycle (``sessions.states.JobState``): ``queued`` when accepted; ``running`` at the first
``"progress"`` emission (the scheduler actually ran a plan of it); ``succeeded`` once the
artifact is on disk; ``failed`` when the loop fails or the artifact cannot be written;
``cancelled`` on DELETE. Progress is ``done / total`` plans from the loop's ``"progress"``
emissions, published as ``job.progress`` and monotone (never goes back).

When the loop's ``LoopResult`` arrives, ``outputs["frames"]`` (uint8 ``[F, H, W, 3]``) is
written by ``sessions.artifacts`` on a worker thread (MP4 for ``t2v``, PNG for ``t2i``) under
``artifact_dir`` as ``<job id>.mp4|png``. Event-loop thread only, like ``Session``.

With ``snapshots`` (``sessions.job_snapshots``, set by the host) each progress step may
snapshot the loop, so that a killed server resumes the job from its newest snapshot; they are
deleted when the job ends.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.contract import Emission, LoopResult, MediaMeta, Stream
from sessions.artifacts import Artifact, jpeg_b64, write_task_artifact
from sessions.events import EventStream, JobArtifact, JobPreview, JobProgress, JobStateChanged
from sessions.job_snapshots import JobSnapshots
from sessions.loop_handle import LoopHandleLike
from sessions.loop_watch import LoopWatch
from sessions.persistence import Persistence
from sessions.states import JOB_TERMINAL, JobState, check_job_transition
from sessions.store import Store
from sessions.store_rows import JobParams

__all__ = ["Job", "JobConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobConfig:
    job_id: str
    task: str  # "t2v" | "t2i"
    model_id: str
    prompt: str
    fps: int
    params: JobParams


class Job:
    """See the module docstring. Construct, then ``attach`` the engine handle."""

    def __init__(
        self,
        config: JobConfig,
        *,
        artifact_dir: str | Path,
        store: Store | None = None,
        wall_clock: Callable[[], float] = time.time,
        first_event_id: int = 1,
    ) -> None:
        self.config = config
        self.id = config.job_id
        self._artifact_dir = Path(artifact_dir)
        self._wall = wall_clock
        self.created_at = wall_clock()
        self._persistence = Persistence(store, self.id, row="job")
        # > 1: a job resumed after a restart numbers its events after its stored ones
        self.events = EventStream(clock=wall_clock, first_id=first_event_id)
        self.events.add_sink(self._persistence.event)
        self._state = JobState.QUEUED
        self.progress = 0.0
        self.error: str | None = None
        self.artifact: Artifact | None = None
        self._loop = LoopWatch(f"job {self.id}")
        self.suspended = False  # stopped by a graceful shutdown, to resume in the next process
        self.snapshots: JobSnapshots | None = None
        # hear a program's streamed frames: (stream name, uint8 [n, H, W, 3], MediaMeta)
        self.preview_listeners: list[Callable[[str, np.ndarray, MediaMeta], None]] = []
        self.price_gpu_s: float | None = None  # a program's: its nodes' plans, costed
        # the newest previewed frames (uint8 [n, H, W, 3] per decode), for a late viewer
        self.preview_history: collections.deque[np.ndarray] = collections.deque(maxlen=64)
        self.events.publish(JobStateChanged(state=self._state.value))

    @property
    def state(self) -> JobState:
        return self._state

    @property
    def terminal(self) -> bool:
        return self._state in JOB_TERMINAL

    def _transition(self, target: JobState, error: str | None = None) -> None:
        old = self._state
        check_job_transition(f"job {self.id}", old, target)
        self._state = target
        self.error = error or self.error
        log.info(
            "job %s: %s -> %s%s", self.id, old.value, target.value, f" ({error})" if error else ""
        )
        self.events.publish(JobStateChanged(state=target.value, previous=old.value, error=error))
        self._persistence.update(state=target.value, progress=self.progress, error=self.error)
        if self.terminal and self.snapshots is not None:
            self.snapshots.discard()  # nothing is left to resume

    def attach(
        self, handle: LoopHandleLike, *, on_finished: Callable[[Job], None] | None = None
    ) -> None:
        self._loop.attach(
            handle, self, on_finished=None if on_finished is None else lambda: on_finished(self)
        )

    def on_emission(self, emission: Emission) -> None:
        """The engine's ``on_emit`` callback. Never raises."""
        try:
            if self.terminal:
                return
            if emission.spec.stream not in (Stream.PROGRESS, Stream.MEDIA, Stream.APPLIED):
                if isinstance(emission.spec.meta, MediaMeta):  # a program's stream node
                    self._preview(emission)
                return
            if emission.spec.stream != Stream.PROGRESS:
                return
            done, total = emission.spec.meta.done, emission.spec.meta.total
            if self._state is JobState.QUEUED:
                self._transition(JobState.RUNNING)
            progress = min(1.0, done / total) if total > 0 else 0.0
            if progress > self.progress:
                self.progress = progress
                self.events.publish(JobProgress(progress=progress, done=done, total=total))
            if self.snapshots is not None:
                self.snapshots.step_done()
        except Exception:
            log.exception("job %s: emission %r failed", self.id, emission.spec)

    def _preview(self, emission: Emission) -> None:
        meta = emission.spec.meta
        frames = np.asarray(emission.output)  # uint8 [n, H, W, 3]
        self.events.publish(
            JobPreview(
                stream=str(emission.spec.stream),
                frame_start=meta.frame_start,
                num_frames=int(frames.shape[0]),
                pts_90k=meta.pts_90k,
                width=int(frames.shape[2]),
                height=int(frames.shape[1]),
                jpeg_b64=jpeg_b64(frames[-1]),
            )
        )
        self.preview_history.append(frames)
        for listener in list(self.preview_listeners):
            listener(emission.spec.stream, frames, meta)

    # LoopOutcome: how the loop's end moves the job (sessions.loop_watch)

    async def loop_completed(self, result: LoopResult) -> None:
        await self._write_artifact(result)

    def loop_cancelled(self, reason: str) -> None:
        if not self.terminal and not self.suspended:
            self._transition(JobState.CANCELLED, reason)

    def loop_failed(self, code: str, message: str) -> None:
        if not self.terminal:
            self._transition(JobState.FAILED, f"{code}: {message}")

    def loop_raised(self, exc: Exception) -> None:
        if not self.terminal:
            self._transition(JobState.FAILED, f"{type(exc).__name__}: {exc}")

    def loop_ended(self) -> None:
        self.events.close()
        if self.terminal:  # (a suspended job keeps its handle: the shutdown snapshots it)
            # listed long after (JobHost keeps the newest finished jobs): keep nothing of the
            # loop, whose handle holds its result, every frame of it (the artifact is on disk)
            self._loop.release()

    async def _write_artifact(self, result: LoopResult) -> None:
        if "frames" not in result.outputs:
            raise KeyError(f"loop result has no 'frames' output (has {sorted(result.outputs)})")
        frames = np.asarray(result.outputs["frames"])  # [F, H, W, 3] uint8
        if self._state is JobState.QUEUED:
            self._transition(JobState.RUNNING)
        artifact = await asyncio.to_thread(
            write_task_artifact,
            self.config.task,
            frames,
            self._artifact_dir,
            self.id,
            fps=self.config.fps,
        )
        if self.terminal:  # cancelled while the file was being written
            artifact.path.unlink(missing_ok=True)
            return
        self.artifact = artifact
        self.progress = 1.0
        self.events.publish(
            JobArtifact(media_type=artifact.media_type, size_bytes=artifact.size_bytes)
        )
        self._persistence.update(artifact_path=str(artifact.path), media_type=artifact.media_type)
        self._transition(JobState.SUCCEEDED)

    async def cancel(self, reason: str = "deleted") -> None:
        """Cancels the loop (lands at its next step boundary) and waits. Idempotent."""
        handle = self._loop.handle
        if self.terminal:
            await self._loop.wait()
            return
        if handle is None:
            self._transition(JobState.CANCELLED, reason)
            self.events.close()
            self._loop.finish()
            return
        handle.cancel(reason)
        if not handle.done:
            await self._loop.wait()
        elif not self.terminal:
            # The loop already finished and only the artifact write is pending.
            self._transition(JobState.CANCELLED, reason)
            await self._loop.wait()

    def discard_artifact(self, reason: str = "deleted") -> None:
        """Deletes the artifact file (a finished video deleted through the OpenAI API): the
        job keeps its state, its ``error`` says ``reason`` and its row has no artifact."""
        if self.artifact is not None:
            self.artifact.path.unlink(missing_ok=True)
            self.artifact = None
        self.error = reason
        self._persistence.update(artifact_path=None, error=reason)

    @property
    def previews(self) -> bool:
        """Whether the job's program streams previews (it has a stream node)."""
        nodes = self.config.params.get("program", {}).get("nodes")
        return isinstance(nodes, dict) and any(
            isinstance(n, dict) and n.get("kind") == "stream" for n in nodes.values()
        )

    @property
    def handle(self) -> LoopHandleLike | None:
        return self._loop.handle

    async def suspend(self) -> None:
        """Stops the loop for a shutdown without ending the job (no state change, nothing
        written): its store row still says ``queued``/``running`` for the next process."""
        handle = self._loop.handle
        if self.terminal or handle is None:
            return
        self.suspended = True
        handle.cancel("server shutdown")
        await self._loop.wait()

    async def wait_finished(self) -> None:
        await self._loop.wait()

    def snapshot(self) -> dict[str, Any]:
        """The body of ``GET /v1/jobs/{id}``."""
        body: dict[str, Any] = {
            "id": self.id,
            "state": self._state.value,
            "progress": round(self.progress, 4),
            "task": self.config.task,
            "model": self.config.model_id,
            "created_at": self.created_at,
        }
        program = self.config.params.get("program")
        if program is not None:
            body["program"] = program["name"]
        if self.price_gpu_s is not None:
            body["price_gpu_s"] = round(self.price_gpu_s, 6)
        if self.error is not None:
            body["error"] = self.error
        if self.artifact is not None:
            body["artifact"] = {
                "media_type": self.artifact.media_type,
                "size_bytes": self.artifact.size_bytes,
            }
        return body
