"""The job host: queues, finds, resumes and cancels the offline jobs of one server.

Jobs (``submit_job``) are batch-class loops without admission: they run in the realtime
sessions' slack and are queued, never refused. The model card says which loop serves the task
(``ModelCard.loop_for``: ``diffusion_denoise`` on a bidirectional card, ``chunk_rollout`` on a
chunk-causal one), and a request the card's recipe does not fit (another step count, several
frames for ``t2i``) is refused with ``UnsupportedTaskError`` naming the field. Finished jobs
beyond ``max_finished_jobs`` leave memory and are read back from the store. It sits beside
``sessions.host.SessionHost``; the composition root (``server.app``) builds both on one engine.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from models.loops.requests import JobRequest, ProgramRequest
from models.programs.graph import Program
from models.programs.presets import resolve
from models.programs.validation import artifact_task
from models.programs.validation import check as check_program
from runtime.contract import Emission, Priority
from sessions.job import Job, JobConfig
from sessions.job_snapshots import JobSnapshots
from sessions.recording import Recording
from sessions.resume import newest_snapshot, snapshot_loop
from sessions.served_models import (
    EngineLike,
    HostError,
    ServedModels,
    UnsupportedTaskError,
    new_id,
)
from sessions.states import JobState
from sessions.store import Store
from sessions.store_rows import JobOrigin, JobParams, JobRow

__all__ = ["JobHost"]

log = logging.getLogger(__name__)

_TASK_CAPABILITY = {"t2v": "text_to_video", "t2i": "text_to_image"}


class JobHost:
    """See the module docstring. Event-loop thread only."""

    def __init__(
        self,
        *,
        engine: EngineLike,
        models: ServedModels,
        store: Store,
        artifact_dir: str | Path,
        max_finished_jobs: int = 256,
        recording: Recording | None = None,
    ) -> None:
        self.engine = engine
        self.models = models
        self.store = store
        self.artifact_dir = Path(artifact_dir)
        self.max_finished_jobs = max_finished_jobs
        self.recording = recording  # where a shutdown's job snapshots go (sessions.resume)
        self._jobs: dict[str, Job] = {}
        self._closed = False

    def job(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def submit_job(
        self,
        *,
        task: Literal["t2v", "t2i"],
        prompt: str,
        model: str | None = None,
        num_frames: int | None = None,
        width: int | None = None,
        height: int | None = None,
        steps: int | None = None,
        seed: int | None = None,
        job_id: str | None = None,
        extensions: dict[str, dict[str, object]] | None = None,
        exact: bool = False,
        group: bool = False,
        tap: Callable[[Emission], None] | None = None,
        keep_latents: bool = False,
        restore_from: bytes | None = None,
        first_event_id: int = 1,
        program: str | dict[str, object] | None = None,
        origin: JobOrigin | None = None,
        fork_from: Any = None,
    ) -> Job:
        """Queues a job (batch class; never refused but while the model is held:
        ``ModelUnavailableError``). Raises ``KeyError``, ``ProfileError`` or
        ``UnsupportedTaskError`` for requests the model cannot serve. ``group``: a sample of a
        rollout group (the model's ``group_loop``: denoising steps batch with the group's
        other samples); ``tap`` also hears every emission of its loop (the group's records);
        ``keep_latents``: each chunk's capture carries its per-step latents; ``restore_from``:
        the job's snapshot (it goes on from there); ``first_event_id``: a resumed job's event
        ids go on after its stored ones; ``program``: a built-in program's name or a graph
        (``models.programs``), checked against the card before the job exists
        (``ProgramError``, a 422 listing every problem): the request's fields are its loop
        nodes' defaults, and its artifact node's task is the job's; ``origin``: what the job
        was made from, kept with its parameters (a compiled workflow's node mapping:
        ``sessions.workflows``); ``fork_from``: the state a program's loop node continues (a
        session's, ``sessions.moments``)."""
        if self._closed:
            raise HostError("the job host is closed")
        served = self.models.resolve(model)
        card = served.card
        self.models.check_open(card.model_id)  # ModelUnavailableError: a sync, a sleep
        capability = _TASK_CAPABILITY.get(task)
        if capability is None or capability not in card.capabilities:
            raise UnsupportedTaskError(
                "task",
                f"model {card.model_id!r} cannot run task {task!r} (needs {capability!r}; "
                f"it has {sorted(card.capabilities)})",
            )
        profile = card.resolve_profile(width=width, height=height)
        spec = card.loop_for(capability)
        if spec is None:  # a validated card has a loop for every capability it declares
            raise HostError(f"model {card.model_id!r} names no loop for {capability!r}")
        assumed_steps = spec.schedule.steps if spec.schedule is not None else profile.steps
        if steps is not None and steps != assumed_steps:
            raise UnsupportedTaskError(
                "steps",
                f"model {card.model_id!r} samples with {assumed_steps} steps (recipe "
                f"{card.recipe.method!r}); {steps} steps were requested",
            )
        if task == "t2i" and num_frames not in (None, 1):
            raise UnsupportedTaskError(
                "num_frames", f"t2i makes one frame; num_frames={num_frames} was requested"
            )
        job_id = job_id or new_id("job")
        seed = seed if seed is not None else secrets.randbelow(2**31)
        request = JobRequest(
            task=task,
            prompt=prompt,
            num_frames=num_frames,
            width=profile.width,
            height=profile.height,
            steps=assumed_steps,
            seed=seed,
            extensions=extensions or {},
            exact=exact,
            keep_latents=keep_latents,
        )
        loop = served.group_loop(capability) if group else served.loop(spec.loop_id)
        graph: Program | None = None
        if program is not None:
            graph = resolve(program)
            check_program(graph, card)
            make = getattr(served, "program_loop", None)
            if make is None:
                raise UnsupportedTaskError("program", f"model {card.model_id!r} runs no programs")
            if (
                fork_from is None
                and restore_from is None
                and any(n.get("session") for n in graph.nodes)
            ):
                raise UnsupportedTaskError(
                    "program", "a program continuing a session starts from the session's state"
                )
            loop = make(graph)
            task = "t2i" if artifact_task(graph) == "t2i" else "t2v"
        check = getattr(loop, "check_request", None)
        if check is not None:  # extension pre-flight: refused here, before the job exists
            try:
                check(request)
            except ValueError as exc:
                raise UnsupportedTaskError("extensions", str(exc)) from None
        params: JobParams = {
            "num_frames": num_frames,
            "width": profile.width,
            "height": profile.height,
            "steps": assumed_steps,
            "seed": seed,
        }
        if extensions or exact:  # kept so that a resumed job runs as it was asked
            params |= {"extensions": extensions or {}, "exact": exact}
        if graph is not None:
            params["program"] = graph.to_dict()
        if origin is not None:
            if "workflow" in origin:
                params["workflow"] = origin["workflow"]
            if "moment" in origin:
                params["moment"] = origin["moment"]
        config = JobConfig(
            job_id=job_id,
            task=task,
            model_id=card.model_id,
            prompt=prompt,
            fps=profile.fps,
            params=params,
        )
        job = Job(
            config, artifact_dir=self.artifact_dir, store=self.store, first_event_id=first_event_id
        )
        self.store.defer(self._upsert_job, job_id, task, card.model_id, prompt, params)
        on_emit = job.on_emission
        if tap is not None:

            def on_emit(emission: Emission) -> None:
                job.on_emission(emission)
                tap(emission)

        run: Any = request
        if graph is not None:
            run = ProgramRequest(program=graph.to_dict(), job=request, loop_id=job_id)
        handle = self.engine.spawn(
            loop,  # the card says which loop serves the task (a group's: its batched steps)
            run,
            served,
            loop_id=job_id,
            priority=Priority.BATCH,
            on_emit=on_emit,
            restore_from=restore_from,
            fork_from=fork_from,
        )
        self._jobs[job_id] = job
        if self.recording is not None:
            job.snapshots = JobSnapshots(self.recording, handle)
        job.attach(handle, on_finished=self._job_finished)
        if graph is not None:
            self._price(job, handle, loop)
        log.info(
            "job %s queued: %s %s %dx%d", job_id, task, card.model_id, profile.width, profile.height
        )
        return job

    def _price(self, job: Job, handle: Any, loop: Any) -> None:
        """Sets ``job.price_gpu_s`` at the program's first step boundary: the GPU-seconds its
        nodes' plans cost by the engine's cost model (calibrated where measured, else the
        analytic prior), summed over the plans each node has left."""
        cost = getattr(self.engine, "cost", None)
        if cost is None:
            return

        def priced(future: asyncio.Future[Any]) -> None:
            if future.cancelled() or future.exception() is not None:
                return  # ended before its first boundary: nothing to price
            job.price_gpu_s = sum(
                count * cost.gpu_seconds(kind, sig, flops)
                for kind, sig, count, flops in future.result()
            )

        handle.at_boundary(loop.plan_table).add_done_callback(priced)

    def _job_finished(self, job: Job) -> None:
        """Keeps the newest ``max_finished_jobs`` finished jobs in memory; older ones are read
        back from the store (their rows hold state, progress, error and the artifact path)."""
        finished = [j for j in self._jobs.values() if j.terminal]
        for old in finished[: max(0, len(finished) - self.max_finished_jobs)]:
            del self._jobs[old.id]

    def _upsert_job(
        self, job_id: str, task: str, model_id: str, prompt: str, params: JobParams
    ) -> None:
        if self.store.get_job(job_id) is None:
            self.store.add_job(
                job_id=job_id,
                task=task,
                model_id=model_id,
                prompt=prompt,
                params=params,
                state=JobState.QUEUED.value,
            )
        else:
            self.store.update_job(job_id, state=JobState.QUEUED.value, progress=0.0, error=None)

    def resume_jobs(self, rows: list[JobRow]) -> list[Job]:
        """Queues again the jobs a previous process left unfinished (``Store.recover``): from
        their newest snapshot (a graceful shutdown's, or after a kill the newest periodic one,
        ``sessions.job_snapshots``), else from their request; one that cannot be queued ends
        ``failed`` with the reason (never left ``running``)."""
        resumed = []
        for row in rows:
            params = row["params"]
            try:
                blob = None
                if self.recording is not None:
                    path = newest_snapshot(self.recording.snapshot_dir, row["id"])
                    if path is not None:
                        blob = path.read_bytes()
                        log.info(
                            "job %s restored from its snapshot at step %d",
                            row["id"],
                            int(path.stem),
                        )
                resumed.append(
                    self.submit_job(
                        task=row["task"],
                        prompt=row["prompt"],
                        model=row["model_id"],
                        num_frames=params.get("num_frames"),
                        width=params.get("width"),
                        height=params.get("height"),
                        seed=params.get("seed"),
                        job_id=row["id"],
                        extensions=params.get("extensions"),
                        exact=params.get("exact", False),
                        program=params.get("program"),
                        origin={"workflow": params["workflow"]} if "workflow" in params else None,
                        restore_from=blob,
                        first_event_id=1
                        + max((e["event_id"] for e in self.store.events(row["id"])), default=0),
                    )
                )
            except Exception as exc:  # noqa: BLE001 - whatever it is, the job must not hang
                log.warning("job %s cannot be resumed: %s", row["id"], exc)
                self.store.defer(
                    self.store.update_job,
                    row["id"],
                    state=JobState.FAILED.value,
                    error=f"not resumable after restart: {exc}",
                )
        return resumed

    async def cancel_job(self, job_id: str) -> bool:
        """Cancels a job held in memory and waits for it; False if there is none."""
        job = self._jobs.get(job_id)
        if job is None:
            return False
        await job.cancel()
        return True

    async def delete_job(self, job_id: str) -> bool:
        """Cancels ``job_id`` if it is unfinished and deletes its artifact; afterwards its
        ``error`` is ``"deleted"`` (what the OpenAI video API's DELETE does). False when no
        job has that id, in memory or in the store."""
        job = self._jobs.get(job_id)
        if job is not None:
            await job.cancel("deleted")
            job.discard_artifact("deleted")
            return True
        row = await self.store.run(self.store.get_job, job_id)
        if row is None:
            return False
        if row["artifact_path"]:
            Path(row["artifact_path"]).unlink(missing_ok=True)
        await self.store.run(self.store.update_job, job_id, artifact_path=None, error="deleted")
        return True

    async def suspend(self, timeout_s: float) -> int:
        """A graceful shutdown: refuses new jobs, snapshots every running job at its next step
        boundary (waiting at most ``timeout_s``), then stops every unfinished one **without**
        ending it: its row stays ``queued``/``running``, so the next process resumes it
        (``resume_jobs``). Returns the snapshots taken."""
        self._closed = True
        live = [j for j in self._jobs.values() if not j.terminal and j.handle is not None]
        taken = 0
        if self.recording is not None:
            running = [j.handle for j in live if j.state.value == "running"]
            futures = [
                snapshot_loop(self.recording, handle, after_chunk=False, advance=False)
                for handle in running
                if handle is not None
            ]
            if futures:
                done, _ = await asyncio.wait(futures, timeout=timeout_s)
                taken = sum(1 for f in done if not f.cancelled() and f.exception() is None)
        await asyncio.gather(*(j.suspend() for j in live), return_exceptions=True)
        return taken

    async def close(self) -> None:
        """Cancels every unfinished job (not those suspended) and refuses new ones."""
        self._closed = True
        await asyncio.gather(
            *(
                job.cancel("server shutdown")
                for job in self._jobs.values()
                if not job.terminal and not job.suspended
            ),
            return_exceptions=True,
        )

    def counts(self) -> dict[str, int]:
        """Jobs in memory by state (metrics)."""
        return dict(Counter(j.state.value for j in self._jobs.values()))
