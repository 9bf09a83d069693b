"""The session host: admits, starts, finds and ends the realtime sessions of one server.

It owns the id -> Session map and the bookkeeping around the engine; the engine, the served
models (``sessions.served_models``) and the store are handed in by the composition root
(``server.app``), so this module imports no model code. Jobs have their own host beside it
(``sessions.job_host.JobHost``) on the same engine.

Admission of a session is one gate (capacity is a value: ``create_session`` returns
``Reject``): ``engine.admission.admit`` reserves the session's compute share (the cost of one
steady chunk over the chunk's media seconds: measured, or the cost model's prior), its peak
activation bytes and a chunk-KV slab from the slab pool of its geometry. When the model batches
sessions' denoising steps (``batched_plan_kinds``) and the chunk is priced from measurements,
the request carries a ``BatchPricing``: sessions of one shape are priced as the batches they
run in (``batch_pricing``), so a second session of a small profile costs less than the first.
Both prices are computed in ``sessions.session_pricing``; what a session's steering throws
away (the backlog an applied input flushes) is added by ``sessions.steering_cost``, and each
live session's reservation is repriced with its own before admission decides.
The first session of a geometry makes the served model preallocate that geometry's K/V buffer
(``slabs_per_geometry`` slabs) and registers its pool with admission; the slab index travels to
the loop in ``SessionRequest.kv_slab``.

Then the loop (``chunk_rollout``) is spawned **paused** (it runs once a viewer pulls the
video, see ``sessions.session``) and the session is attached to it. When the loop ends for any
reason the engine releases the reservation, which returns the slab to its pool.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from models.card import Profile
from models.loops.requests import SessionRequest
from runtime.admission import AdmissionController, AdmissionRequest, Admit, Reject
from runtime.contract import Priority
from runtime.pools import KVSlabPool
from sessions.handoff import forget_manifest
from sessions.recording import Recording
from sessions.served_models import (
    SESSION_LOOP,
    EngineLike,
    HostError,
    ServedModel,
    ServedModels,
    UnsupportedTaskError,
    new_id,
    record_template,
    session_decoder,
)
from sessions.session import Session, SessionConfig
from sessions.session_pricing import ADMISSION_COSTS, batch_pricing, chunk_gpu_seconds
from sessions.steering_cost import STEERING_COSTS, SteeringCost
from sessions.store import Store

# Reject: what create_session answers on no capacity; the pricing functions are
# sessions.session_pricing's, importable from here as before
__all__ = ["Reject", "SessionHost", "batch_pricing", "chunk_gpu_seconds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Live:
    session: Session
    reservation_id: str | None = None
    request: AdmissionRequest | None = None  # what it was admitted with (``SteeringCost``)


class SessionHost:
    """See the module docstring. Event-loop thread only."""

    def __init__(
        self,
        *,
        engine: EngineLike,
        models: ServedModels,
        store: Store,
        slabs_per_geometry: int = 4,
        action_validator: Callable[[list[str], tuple[float, float]], list[str]] | None = None,
        media_seconds: float = 4.0,
        recording: Recording | None = None,
        admission_cost: str = "auto",
        max_pending_inputs: int = 256,
        max_prompt_chars: int = 4000,
        handoff_dir: Path | None = None,
        max_batch: int = 1,
        steering_cost: str = "measured",
    ) -> None:
        if admission_cost not in ADMISSION_COSTS or steering_cost not in STEERING_COSTS:
            raise ValueError(
                f"admission_cost={admission_cost!r}, steering_cost={steering_cost!r}; expected "
                f"one of {ADMISSION_COSTS} and {STEERING_COSTS}"
            )
        self.steering = SteeringCost(steering_cost == "measured")
        # "auto": measured on an accelerator; on a CPU the prior, since a CPU's measured chunk
        # times follow whatever else runs on it (tests, other processes), not the sessions
        device = getattr(getattr(engine.cost, "device", None), "name", "cpu")
        self.measured_admission = admission_cost == "measured" or (
            admission_cost == "auto" and device != "cpu"
        )
        self.engine = engine
        # the engine's largest batch: sessions' batched steps are priced up to it (1: alone)
        self.max_batch = max_batch
        self.max_pending_inputs = max_pending_inputs
        self.max_prompt_chars = max_prompt_chars
        self.models = models
        self.store = store
        self.slabs_per_geometry = slabs_per_geometry
        self._action_validator = action_validator
        self._media_seconds = media_seconds
        self.recording = recording
        # a fleet's shared storage (sessions.handoff): a session that ends while the host is
        # open ended for good, so its manifest goes (one alive at shutdown may move elsewhere)
        self.handoff_dir = handoff_dir
        self._sessions: dict[str, _Live] = {}
        self._closed = False
        self._reaper: asyncio.Task[None] | None = None
        self.rejections: Counter[str] = Counter()
        # frames_sent / stalls / media_dropped / media_flushed of ended sessions
        self.finished_totals: Counter[str] = Counter()
        self.finished_states: Counter[str] = Counter()

    def session(self, session_id: str) -> Session | None:
        live = self._sessions.get(session_id)
        return None if live is None else live.session

    def sessions(self) -> list[Session]:
        return [live.session for live in self._sessions.values()]

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
        start: Literal["viewer", "now"] = "viewer",
        adapters: tuple[tuple[str, float], ...] = (),
        decoder: str | None = None,
        session_id: str | None = None,
        resume: Any = None,
        first_event_id: int = 1,
    ) -> Session | Reject:
        """Admits and starts a session, or returns ``Reject`` (capacity). Raises ``KeyError``
        (unknown model), ``models.card.ProfileError`` (bad geometry) or ``UnsupportedTaskError``.
        ``start="now"``: the prompt encode and the first chunk run at once (then the loop
        waits for the viewer), so the offer and ICE overlap them; else nothing runs before the
        first pull of the video. ``adapters``: (name, strength) of LoRA adapters registered at
        deploy scope (an unknown one: ``UnsupportedTaskError`` on field ``adapters``).
        ``decoder``: ``"full"`` | ``"tiny"``, one of the model's decoders (None: its default;
        one it does not serve: ``UnsupportedTaskError`` on field ``decoder``).
        ``resume``: a restored loop state (``sessions.resume`` after a restart of this engine,
        ``sessions.handoff`` when a fleet re-places a session from another) the loop is forked
        from, into this engine's slab, under the old ``session_id`` (its events go on from
        ``first_event_id``)."""
        self._check_open()
        served = self.models.resolve(model)
        card = served.card
        if (closed := self.models.closed.get(card.model_id)) is not None:
            return self._reject(closed)  # a weight sync or a sleeping component
        if "session.realtime" not in card.capabilities:
            raise UnsupportedTaskError(
                "model", f"model {card.model_id!r} cannot stream sessions (no 'session.realtime')"
            )
        profile = card.resolve_profile(fps=fps, width=width, height=height)
        if adapters:
            try:
                served.adapters.check(adapters)
            except (AttributeError, ValueError) as exc:
                raise UnsupportedTaskError("adapters", str(exc)) from None
        if resume is not None and decoder is None:  # a restored stream keeps its decoder
            decoder = getattr(resume, "codec", "") or None
        decoder = session_decoder(served, decoder)
        session_id = session_id or new_id("ses")
        if session_id in self._sessions:
            raise HostError(f"session {session_id!r} is already live here")
        reservation_id, slab_id, admitted = None, None, None
        if self.engine.admission is not None:
            self.refresh_steering()
            admitted = self._admission_request(session_id, served, profile, decoder)
            answer = self.engine.admission.admit(admitted)
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
            record_template={**record_template(served, profile), "decoder": decoder},
            action_validator=self._action_validator,
            max_pending_inputs=self.max_pending_inputs,
            max_prompt_chars=self.max_prompt_chars,
            decoder=decoder,
        )
        frames_per_chunk = max(1, round(served.chunk_seconds(profile) * profile.fps))
        capacity = max(3 * frames_per_chunk, round(self._media_seconds * profile.fps))
        session = Session(
            config,
            media_capacity_frames=capacity,
            store=self.store,
            recording=self.recording,
            first_event_id=first_event_id,
        )
        if resume is not None:
            session.chunks.continue_segment(resume.segment)
        self.store.defer(
            self.store.add_session if resume is None else self._resumed_row,
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
            adapters=tuple((str(n), float(s)) for n, s in adapters),
            decoder=decoder,
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
                fork_from=resume,  # the restored chunk-KV goes into this session's slab
            )
        except Exception:
            if reservation_id is not None:
                self._admission.release(reservation_id)  # returns the slab too
            raise
        if start == "now":
            session.hold_after_first_chunk = True  # pauses itself after chunk 0 if unwatched
        else:
            handle.pause()  # until a viewer pulls the track
        self._sessions[session_id] = _Live(session, reservation_id, admitted)
        session.attach(handle, on_finished=self._session_finished)
        log.info(
            "session %s %s: %s %dx%d@%dfps, %s decoder (%s)",
            session_id,
            "admitted" if resume is None else f"resumed from step {resume.step}",
            card.model_id,
            profile.width,
            profile.height,
            profile.fps,
            decoder,
            priority_class,
        )
        return session

    def _resumed_row(self, *, session_id: str, state: str, prompt: str, **row: Any) -> None:
        # this engine's own session after a restart: its row goes on; one a fleet re-placed
        # here from another engine has none in this store yet
        if self.store.get_session(session_id) is None:
            self.store.add_session(session_id=session_id, state=state, prompt=prompt, **row)
        else:
            self.store.update_session(session_id, state=state, prompt=prompt, error=None)

    def admit(
        self, owner: str, served: ServedModel, profile: Profile, decoder: str | None = None
    ) -> Admit | Reject:
        """One session's reservation (``Admit``, with its slab) or ``Reject`` (counted)."""
        if (closed := self.models.closed.get(served.card.model_id)) is not None:
            return self._reject(closed)
        self.refresh_steering()
        answer = self._admission.admit(self._admission_request(owner, served, profile, decoder))
        return self._reject(answer) if isinstance(answer, Reject) else answer

    def adopt_session(self, session: Session, handle: Any) -> None:
        """Serve a session started outside ``create_session`` (a fork candidate) on ``handle``."""
        self._check_open()
        self._sessions[session.id] = _Live(session)
        session.attach(handle, on_finished=self._session_finished)

    def compute_share(self, served: ServedModel, profile: Profile | None = None) -> float:
        """GPU-s per media second one more session of ``profile`` (default: the card's) would
        reserve, its steering's expected share included: what admission checks against the
        remaining compute capacity."""
        profile = profile or served.card.default_profile
        request = self._admission_request("share", served, profile)
        return request.compute_gpu_s_per_s + request.steering_gpu_s_per_s

    def _admission_request(
        self, owner: str, served: ServedModel, profile: Profile, decoder: str | None = None
    ) -> AdmissionRequest:
        chunk_s = served.chunk_seconds(profile)
        cost = self.engine.cost
        if decoder is not None and decoder == getattr(served, "default_decoder", None):
            decoder = None  # the default decoder's plans are the plain ones
        chunk_cost_s = chunk_gpu_seconds(
            cost, served, profile, measured=self.measured_admission, decoder=decoder
        )
        batching = (
            batch_pricing(cost, served, profile, max_batch=self.max_batch, decoder=decoder)
            if self.measured_admission
            else None
        )
        request = AdmissionRequest(
            owner=owner,
            compute_gpu_s_per_s=chunk_cost_s / chunk_s if chunk_s > 0 else 0.0,
            kv_pool=self._slab_pool(served, profile),
            peak_bytes=served.peak_bytes(profile),
            batching=batching,
        )
        # what its steering will throw away: as much as the server's sessions' has so far
        return self.steering.price(request, self.steering.fraction(self._media()))

    def _media(self) -> list[Any]:
        return [live.session.media for live in self._sessions.values()]

    def refresh_steering(self) -> None:
        """Reprice each live session's reservation with what its steering has thrown away
        (``sessions.steering_cost``): before admission decides, and for the fleet's card."""
        if self.engine.admission is not None:
            self.steering.refresh(
                self.engine.admission,
                (
                    (live.reservation_id, live.request, live.session.media)
                    for live in self._sessions.values()
                    if live.reservation_id is not None and live.request is not None
                ),
            )

    def _slab_pool(self, served: ServedModel, profile: Profile) -> str:
        """The admission key of the slab pool of ``profile``'s geometry; its first session
        makes the model preallocate the geometry's K/V buffer and registers the pool."""
        admission = self._admission
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

    @property
    def _admission(self) -> AdmissionController:
        """The engine's admission controller; a host admitting sessions needs one."""
        if (admission := self.engine.admission) is None:
            raise HostError("the engine has no admission controller")
        return admission

    def _reject(self, reject: Reject) -> Reject:
        self.rejections[reject.reason] += 1
        log.info("admission refused a session: %s (%s)", reject.reason, reject.detail)
        return reject

    def _session_finished(self, session: Session) -> None:
        live = self._sessions.pop(session.id, None)
        if live is None:
            return
        if self.handoff_dir is not None and not self._closed:
            forget_manifest(self.handoff_dir, session.id)
        self.finished_totals["frames_sent"] += session.frames_sent
        self.finished_totals["stalls"] += session.stalls
        self.finished_totals["media_dropped"] += session.media.dropped_overflow
        self.finished_totals["media_flushed"] += session.media.dropped_flush
        self.steering.ended(session.media)
        self.finished_states[session.state.value] += 1

    async def close_session(self, session_id: str, reason: str = "deleted") -> bool:
        """Ends a live session and waits until it is closed; False if it is not live here."""
        live = self._sessions.get(session_id)
        if live is None:
            return False
        await live.session.close(reason)
        return True

    # ---------------------------------------------------------------- lifecycle and views

    def _check_open(self) -> None:
        if self._closed:
            raise HostError("the session host is closed")

    async def close_unwatched(self, max_unwatched_s: float, max_idle_s: float = 0.0) -> list[str]:
        """Closes the sessions nobody has watched for ``max_unwatched_s`` (a client that
        vanished without DELETE must not hold a KV slab forever) and, with ``max_idle_s`` > 0,
        those that got no input for that long (reason ``idle timeout``); returns their ids."""
        live = [s for s in self.sessions() if s.accepts_inputs]
        unwatched = [
            s for s in live if max_unwatched_s > 0 and s.unwatched_for_s() > max_unwatched_s
        ]
        idle = [
            s
            for s in live
            if max_idle_s > 0 and s not in unwatched and s.ledger.idle_for_s() > max_idle_s
        ]
        closing = [s.close("unwatched timeout") for s in unwatched]
        closing += [s.close("idle timeout") for s in idle]
        await asyncio.gather(*closing, return_exceptions=True)
        return [s.id for s in unwatched + idle]

    def start_reaper(
        self, max_unwatched_s: float, *, interval_s: float = 5.0, max_idle_s: float = 0.0
    ) -> None:
        """Runs ``close_unwatched`` every ``interval_s`` until ``close()``."""
        if self._reaper is not None:
            raise HostError("the unwatched-session reaper is already running")

        async def reap() -> None:
            try:
                while True:
                    await asyncio.sleep(interval_s)
                    closed = await self.close_unwatched(max_unwatched_s, max_idle_s)
                    if closed:
                        log.info("closed %d unwatched sessions: %s", len(closed), closed)
            except asyncio.CancelledError:
                log.debug("unwatched-session reaper stopped")
                raise

        self._reaper = asyncio.get_running_loop().create_task(reap(), name="dreamrt-reaper")

    async def close(self) -> None:
        """Stops the reaper and closes every session. Idempotent."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        await asyncio.gather(
            *(live.session.close("server shutdown") for live in list(self._sessions.values())),
            return_exceptions=True,
        )

    def counts(self) -> dict[str, Any]:
        """Aggregates for metrics: live states, and totals including ended sessions."""
        sessions = self.sessions()
        states = Counter(s.state.value for s in sessions)
        return {
            "sessions_by_state": dict(states),
            "frames_sent": self.finished_totals["frames_sent"]
            + sum(s.frames_sent for s in sessions),
            "stalls": self.finished_totals["stalls"] + sum(s.stalls for s in sessions),
            "media_dropped": self.finished_totals["media_dropped"]
            + sum(s.media.dropped_overflow for s in sessions),
            "media_flushed": self.finished_totals["media_flushed"]
            + sum(s.media.dropped_flush for s in sessions),
            "rejections": dict(self.rejections),
        }
