"""Group rollouts: K samples of one prompt through the serving loops, with behaviour records.

``RolloutGroups.submit(prompt=, k=, seeds=, steps=, ...)`` (``POST /v1/rollouts``) queues K
text-to-video jobs of the card (``JobHost.submit_job(group=True)``), spawned in one go so their
plans queue side by side: the model's group loop (``models.loops.rollout_group``) runs the K
samples' denoising steps as one batched DiT forward, and the prompt is encoded once (one cache
key). Each sample is a job like any (``GET /v1/jobs/{id}``, its artifact); its chunks also get
behaviour records in the ``records`` table, exactly as a session's (``sessions.records``: the
facts the loop captured as it generated the chunk - seed and noise seeds, timesteps and sigmas,
the weights version that made it, precision, attention backend - plus ``group_id``), so
``dreamrt export`` includes them. A sample's record names the sample's job id as its
``session_id`` (its ``chunk_ref`` is ``<job>@<chunk>``).

Seeds: ``seeds`` (K distinct ints) or K seeds derived from a random base. Groups are kept in
memory (``max_groups`` newest); their samples' jobs and records are in the store.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.contract import Emission, MediaMeta, Stream, pts_of_frame
from sessions.chunk_stream import EmissionOrder
from sessions.job import Job
from sessions.job_host import JobHost
from sessions.records import ChunkRecorder, frames_digest
from sessions.served_models import UnsupportedTaskError, new_id, record_template
from sessions.store import Store
from sessions.store_rows import RecordRow

__all__ = ["RolloutGroup", "RolloutGroups"]

log = logging.getLogger(__name__)

MAX_K = 64


@dataclass
class RolloutGroup:
    """One group: its samples' jobs in seed order, and their record writers."""

    group_id: str
    prompt: str
    model_id: str
    seeds: tuple[int, ...]
    created_at: float
    jobs: list[Job] = field(default_factory=list)
    recorders: list[ChunkRecorder] = field(default_factory=list)
    watcher: asyncio.Task[None] | None = None
    latents: dict[tuple[str, int], Path] = field(default_factory=dict)  # (sample, chunk) -> npz
    pending: list[asyncio.Future[None]] = field(default_factory=list)  # latents being written
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # every record written

    @property
    def state(self) -> str:
        """``running`` until every sample ended; then ``succeeded`` if all did, else ``failed``."""
        states = [job.state.value for job in self.jobs]
        if any(s in ("queued", "running") for s in states):
            return "running"
        return "succeeded" if all(s == "succeeded" for s in states) else "failed"

    def write_latents(self, root: Path, sample: str, chunk: int, steps: list[Any]) -> None:
        """Writes ``steps`` (tensors ``[1, C, c, h, w]``, one per denoising step) of one chunk
        as ``<root>/<sample>/<chunk>.npz`` (``step_0`` ...; float32) on a worker thread."""
        path = root / sample / f"{chunk}.npz"
        self.latents[(sample, chunk)] = path
        self.pending.append(asyncio.get_running_loop().run_in_executor(None, _save, path, steps))

    def view(self) -> dict[str, Any]:
        return {
            "id": self.group_id,
            "prompt": self.prompt,
            "model": self.model_id,
            "k": len(self.seeds),
            "state": self.state,
            "created_at": self.created_at,
            "samples": [
                {
                    "id": job.id,
                    "seed": seed,
                    **_sample(job),
                    "latents": sorted(c for s, c in self.latents if s == job.id),
                }
                for job, seed in zip(self.jobs, self.seeds, strict=True)
            ],
        }


def _sample(job: Job) -> dict[str, Any]:
    view = job.snapshot()
    return {k: view.get(k) for k in ("state", "progress", "error", "artifact")}


class RolloutGroups:
    """See the module docstring. Event-loop thread only."""

    def __init__(self, jobs: JobHost, store: Store, *, max_groups: int = 256) -> None:
        self._jobs = jobs
        self._latents_dir = Path(jobs.artifact_dir) / "rollout_latents"
        self._store = store
        self._max_groups = max_groups
        self._groups: OrderedDict[str, RolloutGroup] = OrderedDict()
        self._order = EmissionOrder(frames_digest, on_error=self._digest_failed)

    @staticmethod
    def _digest_failed(exc: Exception) -> None:
        log.error("a rollout sample's chunk record failed: %s", exc)

    def group(self, group_id: str) -> RolloutGroup | None:
        return self._groups.get(group_id)

    def submit(
        self,
        *,
        prompt: str,
        k: int,
        seeds: Sequence[int] | None = None,
        steps: int | None = None,
        num_frames: int | None = None,
        width: int | None = None,
        height: int | None = None,
        model: str | None = None,
        latents: bool = False,
    ) -> RolloutGroup:
        """Queue a group (module docstring). Raises what ``JobHost.submit_job`` raises, and
        ``UnsupportedTaskError`` for ``k``/``seeds`` that do not fit."""
        if not 1 <= k <= MAX_K:
            raise UnsupportedTaskError("k", f"k={k}; a group has 1..{MAX_K} samples")
        if seeds is None:
            base = secrets.randbelow(2**31)
            seeds = [base + i for i in range(k)]
        if len(seeds) != k or len(set(seeds)) != k:
            raise UnsupportedTaskError("seeds", f"seeds must be {k} distinct ints, got {seeds}")
        served = self._jobs.models.resolve(model)
        card = served.card
        profile = card.resolve_profile(width=width, height=height)
        group = RolloutGroup(
            new_id("grp"), prompt, card.model_id, tuple(int(s) for s in seeds), time.time()
        )
        template = {**record_template(served, profile), "group_id": group.group_id}
        for i, seed in enumerate(group.seeds):
            sample_id = f"{group.group_id}-{i}"
            recorder = ChunkRecorder(
                self._store,
                session_id=sample_id,
                model_id=card.model_id,
                seed=seed,
                template=template,
            )
            recorder.loop_ref = sample_id
            job = self._jobs.submit_job(
                task="t2v",
                prompt=prompt,
                model=card.model_id,
                num_frames=num_frames,
                width=width,
                height=height,
                steps=steps,
                seed=seed,
                job_id=sample_id,
                group=True,
                tap=self._tap(recorder, sample_id, prompt, group if latents else None),
                keep_latents=latents,
            )
            group.jobs.append(job)
            group.recorders.append(recorder)
        group.watcher = asyncio.get_running_loop().create_task(
            self._finish(group), name=f"job-group-{group.group_id}"
        )
        self._groups[group.group_id] = group
        while len(self._groups) > self._max_groups:
            self._groups.popitem(last=False)
        return group

    async def _finish(self, group: RolloutGroup) -> None:
        """Once every sample ended: the last records written (after their digests)."""
        for job in group.jobs:
            await job.wait_finished()
        await self._order.drain()
        await asyncio.gather(*group.pending)
        for recorder in group.recorders:
            recorder.flush()
        group.finished.set()

    async def close(self) -> None:
        """Waits for no group (their jobs end with the job host); writes what was recorded."""
        for group in self._groups.values():
            if group.watcher is not None and not group.watcher.done():
                group.watcher.cancel()
        await asyncio.gather(
            *(g.watcher for g in self._groups.values() if g.watcher is not None),
            return_exceptions=True,
        )
        await self._order.drain()
        for group in self._groups.values():
            for recorder in group.recorders:
                recorder.flush()

    def records(self, group: RolloutGroup) -> list[RecordRow]:
        """Every written record of the group's samples, in sample then chunk order (store
        thread: ``await store.run(groups.records, group)``)."""
        return [r for job in group.jobs for r in self._store.records(job.id)]

    def _tap(
        self,
        recorder: ChunkRecorder,
        sample_id: str,
        prompt: str,
        latents_of: RolloutGroup | None,
    ) -> Callable[[Emission], None]:
        """A sample's media emissions -> its behaviour records (parts of a chunk joined; the
        digest off the event loop, in emission order) and, with ``latents_of``, its per-step
        latents written to the group's directory on a worker thread."""
        parts: list[np.ndarray] = []

        def tap(emission: Emission) -> None:
            if emission.spec.stream != Stream.MEDIA:
                return
            meta: MediaMeta = emission.spec.meta
            steps = (meta.capture or {}).get("step_latents")
            if latents_of is not None and steps:
                latents_of.write_latents(self._latents_dir, sample_id, meta.chunk, steps)
            parts.append(np.asarray(emission.output).copy())
            if not meta.final:
                return
            frames = np.concatenate(parts)
            parts.clear()
            first = meta.frame_start + int(np.asarray(emission.output).shape[0]) - frames.shape[0]
            pts_start = pts_of_frame(first, meta.fps)
            pts_end = pts_of_frame(first + frames.shape[0] - 1, meta.fps)

            def record(digest: str) -> None:
                recorder.media(
                    chunk=meta.chunk,
                    segment=meta.segment,
                    pts_start=pts_start,
                    pts_end=pts_end,
                    num_frames=frames.shape[0],
                    digest=digest,
                    prompt=prompt,
                    prompt_seq=0,
                    capture=meta.capture,
                )

            self._order.digest(frames, record)

        return tap


def _save(path: Path, steps: list[Any]) -> None:
    # the loop's own copies (it starts a new list each chunk): read to the host here, off the
    # event loop (a device read waits for the GPU)
    arrays = {f"step_{i}": t.detach().float().cpu().numpy() for i, t in enumerate(steps)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)  # never a torn file
