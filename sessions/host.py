"""The session host: admits, starts, finds and ends the sessions and jobs of one server.

It owns the id -> Session/Job maps and the bookkeeping around the engine; the engine, the
served models and the store are handed in by the composition root (``server.app``), so this
module imports no model code.

Admission of a session is one gate (capacity is a value: ``create_session`` returns
``Reject``): ``engine.admission.admit`` reserves the session's compute share (the cost model's
prior for one chunk over the chunk's media seconds), its peak activation bytes and a chunk-KV
slab from the slab pool of its geometry. The first session of a geometry makes the served model
preallocate that geometry's K/V buffer (``slabs_per_geometry`` slabs) and registers its pool
with admission; the slab index travels to the loop in ``SessionRequest.kv_slab``.

Then the loop (``chunk_rollout``) is spawned **paused** (it runs once a viewer pulls the
video, see ``sessions.session``) and the session is attached to it. When the loop ends for any
reason the engine releases the reservation, which returns the slab to its pool.

Jobs (``submit_job``) are batch-class loops (the loop the card names for the task) without
admission: they run in the realtime sessions' slack and are queued, never refused.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from models.card import ModelCard, Profile
from models.loops.requests import JobRequest, SessionRequest
from runtime.admission import AdmissionRequest, Reject
from runtime.contract import Loop, Priority
from runtime.pools import KVSlabPool
from sessions.job import Job, JobConfig
from sessions.recording import Recording
from sessions.session import Session, SessionConfig
from sessions.states import JobState
from sessions.store import Store

__all__ = ["HostError", "ServedModel", "SessionHost", "UnsupportedTaskError"]

log = logging.getLogger(__name__)

SESSION_LOOP = "chunk_rollout"
_TASK_CAPABILITY = {"t2v": "text_to_video", "t2i": "text_to_image"}


class HostError(RuntimeError):
    """The host is closed, or an id is already in use."""


class UnsupportedTaskError(ValueError):
    """The model card cannot serve this request (capability or recipe); ``field`` names the
    request field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ServedModel(Protocol):
    """A loaded model as the host needs it (``models.instance.WanInstance`` satisfies it)."""

    card: ModelCard

    def loop(self, loop_id: str) -> Loop[Any]: ...

    def kv_slab_bytes(self, profile: Profile) -> int: ...

    def slab_geometry(self, profile: Profile) -> Any: ...

    def reserve_kv_slabs(self, profile: Profile, num_slabs: int) -> Any: ...

    def peak_bytes(self, profile: Profile) -> int: ...

    def chunk_flops(self, profile: Profile) -> float: ...

    def chunk_seconds(self, profile: Profile) -> float: ...


class EngineLike(Protocol):
    admission: Any
    cost: Any

    def spawn(self, loop: Any, request: Any, model: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class _Live:
    session: Session


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class SessionHost:
    """See the module docstring. Event-loop thread only."""

    def __init__(
        self,
        *,
        engine: EngineLike,
        models: Mapping[str, ServedModel],
        default_model: str,
        store: Store,
        artifact_dir: str | Path,
        slabs_per_geometry: int = 4,
        action_validator: Callable[[list[str], tuple[float, float]], list[str]] | None = None,
        media_seconds: float = 4.0,
        max_finished_jobs: int = 256,
        recording: Recording | None = None,
    ) -> None:
        if default_model not in models:
            raise HostError(
                f"default model {default_model!r} is not among the served {sorted(models)}"
            )
        self.engine = engine
        self.models = dict(models)
        self.default_model = default_model
        self.store = store
        self.artifact_dir = Path(artifact_dir)
        self.slabs_per_geometry = slabs_per_geometry
        self._action_validator = action_validator
        self._media_seconds = media_seconds
        self._max_finished_jobs = max_finished_jobs
        self.recording = recording
        self._sessions: dict[str, _Live] = {}
        self._jobs: dict[str, Job] = {}
        self._closed = False
        self._reaper: asyncio.Task[None] | None = None
        self.rejections: Counter[str] = Counter()
        self.finished_totals: Counter[str] = (
            Counter()
        )  # frames_sent / stalls / media_dropped of ended sessions
        self.finished_states: Counter[str] = Counter()

    # ---------------------------------------------------------------- lookup

    def model(self, model_id: str | None) -> ServedModel:
        """The served model ``model_id`` (default when None); ``KeyError`` names the served ids."""
        key = model_id or self.default_model
        if key not in self.models:
            raise KeyError(f"model {key!r} is not served here; served: {sorted(self.models)}")
        return self.models[key]

    def session(self, session_id: str) -> Session | None:
        live = self._sessions.get(session_id)
        return None if live is None else live.session

    def job(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def sessions(self) -> list[Session]:
        return [live.session for live in self._sessions.values()]

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    # ---------------------------------------------------------------- sessions

    def create_session(
        self,
        *,
        prompt: str,
        model: str | None = None,
        fps: int | None = None,
        width: int | None = None,
        height: int | None = None,
        seed: int | None = None,
        priority_class: Literal["realtime", "batch"] = "realtime",
    ) -> Session | Reject:
        """Admits and starts a session, or returns ``Reject`` (capacity). Raises ``KeyError``
        (unknown model), ``models.card.ProfileError`` (bad geometry) or ``UnsupportedTaskError``."""
        self._check_open()
        served = self.model(model)
        card = served.card
        if "session.realtime" not in card.capabilities:
            raise UnsupportedTaskError(
                "model", f"model {card.model_id!r} cannot stream sessions (no 'session.realtime')"
            )
        profile = card.resolve_profile(fps=fps, width=width, height=height)
        session_id = _new_id("ses")
        reservation_id, slab_id = None, None
        if self.engine.admission is not None:
            answer = self.engine.admission.admit(
                self._admission_request(session_id, served, profile)
            )
            if isinstance(answer, Reject):
                return self._reject(answer)
            reservation_id = answer.reservation_id
            slab_id = answer.slab.slab_id if answer.slab is not None else None
        config = SessionConfig(
            session_id=session_id,
            model_id=card.model_id,
            prompt=prompt,
            seed=seed if seed is not None else secrets.randbelow(2**31),
            fps=profile.fps,
            width=profile.width,
            height=profile.height,
            priority_class=priority_class,
            capabilities=card.capabilities,
            record_template=self._record_template(served, profile),
            action_validator=self._action_validator,
        )
        frames_per_chunk = max(1, round(served.chunk_seconds(profile) * profile.fps))
        capacity = max(3 * frames_per_chunk, round(self._media_seconds * profile.fps))
        session = Session(
            config, media_capacity_frames=capacity, store=self.store, recording=self.recording
        )
        self.store.defer(
            self.store.add_session,
            session_id=session_id,
            model_id=card.model_id,
            prompt=prompt,
            seed=config.seed,
            fps=profile.fps,
            width=profile.width,
            height=profile.height,
            priority_class=priority_class,
            state=session.state.value,
        )
        request = SessionRequest(
            prompt=prompt,
            seed=config.seed,
            width=profile.width,
            height=profile.height,
            fps=profile.fps,
            kv_slab=slab_id,
        )
        try:
            handle = self.engine.spawn(
                served.loop(SESSION_LOOP),
                request,
                served,
                loop_id=session_id,
                priority=Priority.REALTIME if priority_class == "realtime" else Priority.BATCH,
                on_emit=session.on_emission,
                reservation_id=reservation_id,
            )
        except Exception:
            if reservation_id is not None:
                self.engine.admission.release(reservation_id)  # returns the slab too
            raise
        handle.pause()  # until a viewer pulls the track
        self._sessions[session_id] = _Live(session)
        session.attach(handle, on_finished=self._session_finished)
        log.info(
            "session %s admitted: %s %dx%d@%dfps (%s)",
            session_id,
            card.model_id,
            profile.width,
            profile.height,
            profile.fps,
            priority_class,
        )
        return session

    def admit(self, owner: str, served: ServedModel, profile: Profile) -> Any:
        """One session's reservation (``Admit``, with its slab) or ``Reject`` (counted)."""
        answer = self.engine.admission.admit(self._admission_request(owner, served, profile))
        return self._reject(answer) if isinstance(answer, Reject) else answer

    def adopt_session(self, session: Session, handle: Any) -> None:
        """Serve a session started outside ``create_session`` (a fork candidate) on ``handle``."""
        self._check_open()
        self._sessions[session.id] = _Live(session)
        session.attach(handle, on_finished=self._session_finished)

    def _admission_request(
        self, owner: str, served: ServedModel, profile: Profile
    ) -> AdmissionRequest:
        chunk_s = served.chunk_seconds(profile)
        chunk_cost_s = self.engine.cost.prior(served.chunk_flops(profile), 0.0)
        return AdmissionRequest(
            owner=owner,
            compute_gpu_s_per_s=chunk_cost_s / chunk_s if chunk_s > 0 else 0.0,
            kv_pool=self._slab_pool(served, profile),
            peak_bytes=served.peak_bytes(profile),
        )

    def _slab_pool(self, served: ServedModel, profile: Profile) -> str:
        """The admission key of the slab pool of ``profile``'s geometry; its first session
        makes the model preallocate the geometry's K/V buffer and registers the pool."""
        admission = self.engine.admission
        key = f"{served.card.model_id}:{served.slab_geometry(profile).key}"
        if admission.pool(key) is None:
            buffer = served.reserve_kv_slabs(profile, self.slabs_per_geometry)
            admission.add_pool(key, KVSlabPool(buffer.num_slabs, buffer.slab_bytes))
            log.info(
                "chunk-KV slabs for %s: %d x %.1f MiB preallocated",
                key,
                buffer.num_slabs,
                buffer.slab_bytes / 2**20,
            )
        return key

    def preallocate(self) -> None:
        """Preallocate the chunk-KV slabs of every served model's default profile now (server
        start), so the first session allocates nothing and metrics show the pool at once."""
        if self.engine.admission is None:
            return
        for served in self.models.values():
            if "session.realtime" in served.card.capabilities:  # job-only cards hold no KV
                self._slab_pool(served, served.card.default_profile)

    def slab_counts(self) -> tuple[int, int]:
        """(free, capacity) chunk-KV slabs over every pool (metrics)."""
        pools = self.engine.admission.pools().values() if self.engine.admission else ()
        return sum(p.free_count for p in pools), sum(p.capacity for p in pools)

    @staticmethod
    def _record_template(served: ServedModel, profile: Profile) -> dict[str, Any]:
        card = served.card
        spec = card.loops.get(SESSION_LOOP)
        schedule = spec.schedule if spec is not None else None
        return {
            # the content hash of the loaded weights; the card's version is its label
            "weights_version": getattr(served, "weights_digest", "") or card.weights_version,
            "weights_label": card.weights_version,
            "recipe_id": card.recipe.method,
            "fps": profile.fps,
            "width": profile.width,
            "height": profile.height,
            "loop_id": SESSION_LOOP,
            "sampler": spec.describe() if spec is not None else "",
            "steps": schedule.steps if schedule is not None else profile.steps,
            "timesteps": list(schedule.timesteps) if schedule is not None else [],
            "precision": str(getattr(served, "precision", card.recipe.assumes_precision)),
        }

    def _reject(self, reject: Reject) -> Reject:
        self.rejections[reject.reason] += 1
        log.info("admission refused a session: %s (%s)", reject.reason, reject.detail)
        return reject

    def _session_finished(self, session: Session) -> None:
        live = self._sessions.pop(session.id, None)
        if live is None:
            return
        self.finished_totals["frames_sent"] += session.frames_sent
        self.finished_totals["stalls"] += session.stalls
        self.finished_totals["media_dropped"] += session.media.dropped_overflow
        self.finished_states[session.state.value] += 1

    async def close_session(self, session_id: str, reason: str = "deleted") -> bool:
        """Ends a live session and waits until it is closed; False if it is not live here."""
        live = self._sessions.get(session_id)
        if live is None:
            return False
        await live.session.close(reason)
        return True

    # ---------------------------------------------------------------- jobs

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
    ) -> Job:
        """Queues a job (batch class; never refused). Raises ``KeyError``, ``ProfileError`` or
        ``UnsupportedTaskError`` for requests the model cannot serve."""
        self._check_open()
        served = self.model(model)
        card = served.card
        capability = _TASK_CAPABILITY.get(task)
        if capability is None or capability not in card.capabilities:
            raise UnsupportedTaskError(
                "task",
                f"model {card.model_id!r} cannot run task {task!r} (needs {capability!r}; "
                f"it has {sorted(card.capabilities)})",
            )
        profile = card.resolve_profile(width=width, height=height)
        spec = card.loop_for(capability)
        assumed_steps = (
            spec.schedule.steps if spec is not None and spec.schedule is not None else profile.steps
        )
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
        job_id = job_id or _new_id("job")
        seed = seed if seed is not None else secrets.randbelow(2**31)
        params = {
            "num_frames": num_frames,
            "width": profile.width,
            "height": profile.height,
            "steps": assumed_steps,
            "seed": seed,
        }
        config = JobConfig(
            job_id=job_id,
            task=task,
            model_id=card.model_id,
            prompt=prompt,
            fps=profile.fps,
            params=params,
        )
        job = Job(config, artifact_dir=self.artifact_dir, store=self.store)
        self.store.defer(self._upsert_job, job_id, task, card.model_id, prompt, params)
        request = JobRequest(
            task=task,
            prompt=prompt,
            num_frames=num_frames,
            width=profile.width,
            height=profile.height,
            steps=assumed_steps,
            seed=seed,
        )
        if spec is None:  # a validated card has a loop for every capability it declares
            raise HostError(f"model {card.model_id!r} names no loop for {capability!r}")
        handle = self.engine.spawn(
            served.loop(spec.loop_id),  # the card says which loop serves the task
            request,
            served,
            loop_id=job_id,
            priority=Priority.BATCH,
            on_emit=job.on_emission,
        )
        self._jobs[job_id] = job
        job.attach(handle, on_finished=self._job_finished)
        log.info(
            "job %s queued: %s %s %dx%d", job_id, task, card.model_id, profile.width, profile.height
        )
        return job

    def _job_finished(self, job: Job) -> None:
        """Keeps the newest ``max_finished_jobs`` finished jobs in memory; older ones are read
        back from the store (their rows hold state, progress, error and the artifact path)."""
        finished = [j for j in self._jobs.values() if j.terminal]
        for old in finished[: max(0, len(finished) - self._max_finished_jobs)]:
            del self._jobs[old.id]

    def _upsert_job(
        self, job_id: str, task: str, model_id: str, prompt: str, params: dict[str, Any]
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

    def resume_jobs(self, rows: list[dict[str, Any]]) -> list[Job]:
        """Queues again the jobs a previous process left unfinished (``Store.recover``)."""
        resumed = []
        for row in rows:
            params = row["params"]
            try:
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
                    )
                )
            except (KeyError, ValueError) as exc:
                log.warning("job %s cannot be resumed: %s", row["id"], exc)
                self.store.defer(
                    self.store.update_job,
                    row["id"],
                    state=JobState.FAILED.value,
                    error=f"not resumable after restart: {exc}",
                )
        return resumed

    async def cancel_job(self, job_id: str) -> bool:
        job = self._jobs.get(job_id)
        if job is None:
            return False
        await job.cancel()
        return True

    # ---------------------------------------------------------------- lifecycle and views

    def _check_open(self) -> None:
        if self._closed:
            raise HostError("the session host is closed")

    async def close_unwatched(self, max_unwatched_s: float) -> list[str]:
        """Closes the sessions nobody has watched for ``max_unwatched_s`` (a client that
        vanished without DELETE must not hold a KV slab forever); returns their ids."""
        stale = [
            s for s in self.sessions() if s.accepts_inputs and s.unwatched_for_s() > max_unwatched_s
        ]
        await asyncio.gather(*(s.close("unwatched timeout") for s in stale), return_exceptions=True)
        return [s.id for s in stale]

    def start_reaper(self, max_unwatched_s: float, *, interval_s: float = 5.0) -> None:
        """Runs ``close_unwatched`` every ``interval_s`` until ``close()``."""
        if self._reaper is not None:
            raise HostError("the unwatched-session reaper is already running")

        async def reap() -> None:
            try:
                while True:
                    await asyncio.sleep(interval_s)
                    closed = await self.close_unwatched(max_unwatched_s)
                    if closed:
                        log.info("closed %d unwatched sessions: %s", len(closed), closed)
            except asyncio.CancelledError:
                log.debug("unwatched-session reaper stopped")
                raise

        self._reaper = asyncio.get_running_loop().create_task(reap(), name="dreamrt-reaper")

    async def close(self) -> None:
        """Stops the reaper, closes every session and cancels every unfinished job. Idempotent."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        await asyncio.gather(
            *(live.session.close("server shutdown") for live in list(self._sessions.values())),
            *(job.cancel("server shutdown") for job in self._jobs.values() if not job.terminal),
            return_exceptions=True,
        )

    def counts(self) -> dict[str, Any]:
        """Aggregates for metrics: live states, and totals including ended sessions."""
        sessions = self.sessions()
        states = Counter(s.state.value for s in sessions)
        return {
            "sessions_by_state": dict(states),
            "jobs_by_state": dict(Counter(j.state.value for j in self._jobs.values())),
            "frames_sent": self.finished_totals["frames_sent"]
            + sum(s.frames_sent for s in sessions),
            "stalls": self.finished_totals["stalls"] + sum(s.stalls for s in sessions),
            "media_dropped": self.finished_totals["media_dropped"]
            + sum(s.media.dropped_overflow for s in sessions),
            "rejections": dict(self.rejections),
        }
