"""Forks: N candidate continuations of a session, generated, watched, and one chosen.

``ForkRegistry.fork(parent, n, prompt, seeds)``:

1. **Admission, all or nothing**: each candidate is admitted like any session (compute share,
   peak bytes, a chunk-KV slab); if one does not fit, the ones already reserved are released
   and the answer is the ``Reject`` (the API's 503 + ``Retry-After``): nothing half-created.
2. **At the parent's next chunk boundary** (``LoopHandle.at_boundary(after_chunk=True,
   advance=True)``: a paused parent runs to the end of the chunk in flight) the parent's loop
   is paused and each candidate's loop is spawned from the parent's *live* state
   (``Engine.spawn(fork_from=...)`` -> the loop's ``fork``: device copies of every tensor, the
   chunk-KV slab-to-slab, the candidate's seed). No serialisation: this is the engine's fork
   primitive, cheaper than a snapshot (which round-trips through host memory) and exact.
3. The candidates are real sessions (own id and token, ``/offer``, ``GET``), admitted paused
   like any; they inherit the parent's prompt memory and pending inputs; a ``prompt`` is sent
   to each as a switch. The parent is ``paused`` and **held** (no resume, no new viewer) while
   its candidates exist; if they all end without a choice it is released.

``choose(parent, candidate)``: at the candidate's next chunk boundary its loop is paused and
its emissions redirected to the parent; the parent adopts that loop (its ``LoopWatch`` watches
it instead: the parent's id, viewers, events and records go on, PTS continuing from the
candidate's), the
parent's old loop is cancelled (its slab returns), the chosen candidate session closes without
its loop, the others close, and one preference pair per rejected candidate is committed
(``synchronous=FULL``) before the answer. Event-loop thread only.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from models.loops.requests import SessionRequest
from runtime.admission import Reject
from runtime.contract import Priority, pts_of_frame
from runtime.errors import DreamrtError
from sessions.session import Session, SessionClosedError, SessionConfig, SessionStateError

__all__ = ["Fork", "ForkError", "ForkRegistry", "Forks"]

log = logging.getLogger(__name__)


class ForkError(DreamrtError, ValueError):
    """A fork or choice the request cannot have (``field`` names the request field: a 422)."""

    code = "invalid_field"
    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(slots=True)
class Fork:
    """One fork in progress: its parent, candidates (id -> session) and store row."""

    fork_id: int
    parent: Session
    candidates: dict[str, Session]
    seeds: list[int]
    context_ref: str  # ``<parent>@<last chunk before the fork>``
    at_chunk: int  # the first chunk the candidates generate
    chosen: str | None = None
    ended: set[str] = field(default_factory=set)


def candidate_seed(parent_seed: int, fork_index: int, i: int) -> int:
    digest = hashlib.blake2b(repr((parent_seed, fork_index, i)).encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFF_FFFF


class Forks(Protocol):
    """What the server asks of forks: a ``ForkRegistry``, or a stand-in that refuses them
    (a ``ForkError``) where they cannot run."""

    def of(self, parent_id: str) -> Fork | None: ...

    async def fork(
        self, parent: Session, n: int, prompt: str | None = None, seeds: list[int] | None = None
    ) -> Fork | Reject: ...

    async def choose(self, parent: Session, candidate_id: str) -> tuple[str, int]: ...


class ForkRegistry:
    """The forks of one session host (see the module docstring)."""

    def __init__(self, host: Any) -> None:
        self._host = host
        self._forks: dict[str, Fork] = {}  # parent id -> its fork in progress
        self._count = 0

    def of(self, parent_id: str) -> Fork | None:
        return self._forks.get(parent_id)

    async def fork(
        self, parent: Session, n: int, prompt: str | None = None, seeds: list[int] | None = None
    ) -> Fork | Reject:
        host = self._host
        if parent.id in self._forks:
            raise SessionStateError(f"session {parent.id} already has fork candidates; choose one")
        if not parent.accepts_inputs or parent.handle is None:
            raise SessionClosedError(f"session {parent.id} is {parent.state.value}")
        if seeds is not None and len(seeds) != n:
            raise ForkError("seeds", f"{len(seeds)} seeds for {n} candidates")
        self._count += 1
        seeds = seeds or [candidate_seed(parent.config.seed, self._count, i) for i in range(n)]
        served = host.models.resolve(parent.config.model_id)
        cfg = parent.config
        profile = served.card.resolve_profile(fps=cfg.fps, width=cfg.width, height=cfg.height)
        ids = [f"ses_{secrets.token_hex(8)}" for _ in range(n)]
        admits: list[Any] = []
        for cid in ids:
            answer = host.admit(cid, served, profile, cfg.decoder)
            if isinstance(answer, Reject):
                for admit in admits:
                    host.engine.admission.release(admit.reservation_id)
                return answer
            admits.append(answer)
        candidates = [self._candidate(parent, cid, seed) for cid, seed in zip(ids, seeds)]
        loop = served.loop("chunk_rollout")
        parent_handle = parent.handle
        priority = Priority.REALTIME if cfg.priority_class == "realtime" else Priority.BATCH

        def spawn_at_boundary(state: Any) -> tuple[list[Any], int, int]:
            # The candidates' ledgers are copied here, with the state: an input the parent's
            # loop took between the request and this boundary is in both, so a candidate
            # acknowledges it (copied at the request, it would be unknown to the ledger).
            for session in candidates:
                self._inherit(session, parent)
            handles: list[Any] = []
            try:
                for session, admit in zip(candidates, admits):
                    handles.append(spawn_one(state, session, admit))
            except BaseException:  # nothing half-created: the spawned ones end at once
                for handle in handles:
                    handle.cancel("fork failed")
                raise
            parent_handle.pause()  # the parent waits for the choice
            chunk, frames = getattr(state, "chunk", 0), getattr(state, "frames_emitted", 0)
            return handles, int(chunk), int(frames)

        def spawn_one(state: Any, session: Session, admit: Any) -> Any:
            request = SessionRequest(
                prompt=session.config.prompt,
                seed=session.config.seed,
                width=cfg.width,
                height=cfg.height,
                fps=cfg.fps,
                kv_slab=admit.slab.slab_id if admit.slab is not None else None,
                decoder=cfg.decoder,
            )
            handle = host.engine.spawn(
                loop,
                request,
                served,
                loop_id=session.id,
                priority=priority,
                on_emit=session.on_emission,
                reservation_id=admit.reservation_id,
                fork_from=state,
            )
            handle.pause()  # until a viewer pulls its track, like any session
            return handle

        try:
            handles, at_chunk, frames_before = await parent_handle.at_boundary(
                spawn_at_boundary, after_chunk=True, advance=True
            )
        except BaseException:
            for admit in admits:
                host.engine.admission.release(admit.reservation_id)
            raise
        context_ref = f"{parent.id}@{parent.last_chunk}"
        if parent.state.value == "live":
            parent.pause("forked")
        parent.held = "its fork candidates exist: choose one (POST .../choose)"
        for session, handle in zip(candidates, handles):
            if frames_before > 0:
                # Its stream goes on after the parent's last frame: its viewer's first pull
                # anchors the playout there, so its first chunk is due at once (anchored at
                # PTS 0, that chunk would wait for its PTS under the lead window: seconds).
                session.media.skip_to(pts_of_frame(frames_before - 1, cfg.fps))
            self._persist(session, parent)
            host.adopt_session(session, handle)
            session.loop_watch.on_finished(functools.partial(self._candidate_ended, session))
        fork_id = await host.store.run(
            host.store.add_fork,
            session_id=parent.id,
            n=n,
            prompt=prompt,
            candidates=ids,
            seeds=seeds,
            context_ref=context_ref,
        )
        # at_chunk: the state's chunk counter; a fork taken before the KV update of the last
        # chunk has not counted it yet
        first = max(at_chunk, parent.last_chunk + 1)
        fork = Fork(fork_id, parent, {s.id: s for s in candidates}, seeds, context_ref, first)
        self._forks[parent.id] = fork
        parent.loop_watch.on_finished(lambda: self._parent_ended(parent))
        if prompt:
            for session in candidates:
                session.push_prompt(prompt)
        log.info("session %s forked into %s at chunk %d", parent.id, ids, first)
        return fork

    def _candidate(self, parent: Session, cid: str, seed: int) -> Session:
        host, cfg = self._host, parent.config
        config = SessionConfig(
            session_id=cid,
            model_id=cfg.model_id,
            prompt=parent.prompts.active_text,
            seed=seed,
            fps=cfg.fps,
            width=cfg.width,
            height=cfg.height,
            priority_class=cfg.priority_class,
            capabilities=cfg.capabilities,
            record_template=cfg.record_template,
            action_validator=cfg.action_validator,
            max_pending_inputs=cfg.max_pending_inputs,
            max_prompt_chars=cfg.max_prompt_chars,
            decoder=cfg.decoder,
        )
        session = Session(
            config,
            media_capacity_frames=parent.media.capacity_frames,
            store=host.store,
            recording=host.recording,
        )
        return session

    @staticmethod
    def _inherit(session: Session, parent: Session) -> None:
        """At the parent's chunk boundary: the candidate goes on with the parent's prompts,
        unapplied inputs and sequence numbers, and times them from the parent's receipt."""
        session.ledger.inherit(parent.ledger)
        session.latency.inherit(parent.latency)

    def _persist(self, session: Session, parent: Session) -> None:
        store, cfg = self._host.store, session.config
        store.defer(
            store.add_session,
            session_id=session.id,
            model_id=cfg.model_id,
            prompt=cfg.prompt,
            seed=cfg.seed,
            fps=cfg.fps,
            width=cfg.width,
            height=cfg.height,
            priority_class=cfg.priority_class,
            state=session.state.value,
            fork_of=parent.id,
        )

    async def choose(self, parent: Session, candidate_id: str) -> tuple[str, int]:
        """-> (chosen id, preference pairs written). See the module docstring."""
        fork = self._forks.get(parent.id)
        if fork is None or candidate_id not in fork.candidates:
            known = sorted(fork.candidates) if fork else []
            raise ForkError(
                "candidate",
                f"{candidate_id!r} is not a live fork candidate of session {parent.id!r} "
                f"(candidates: {known})",
            )
        chosen = fork.candidates[candidate_id]
        if chosen.terminal or chosen.handle is None:
            raise SessionClosedError(f"candidate {candidate_id} is {chosen.state.value}")
        handle = chosen.handle

        def take_over(state: Any) -> None:  # at the candidate's chunk boundary
            handle.pause()
            handle.set_sink(parent.on_emission)

        await handle.at_boundary(take_over, after_chunk=True, advance=True)
        fork.chosen = candidate_id
        del self._forks[parent.id]
        rejected = [cid for cid in fork.candidates if cid != candidate_id]
        record = parent.config.record_template
        await self._host.store.run(
            self._host.store.choose_fork,
            fork.fork_id,
            candidate_id,
            fork.context_ref,
            rejected,
            session_id=parent.id,
            model_id=parent.config.model_id,
            weights_version=record.get("weights_version"),
        )
        parent.records.adopt(chosen.records)
        if chosen.media.last_pts is not None:  # the playout anchors at the candidate's next frame
            parent.media.skip_to(chosen.media.last_pts)
        old = parent.loop_watch.replace(handle, parent, settle=parent.settle)
        if old is not None:
            old.cancel("replaced by its chosen fork candidate")
        chosen.loop_watch.release()  # closes without its loop, which carries the parent on
        await chosen.close(f"chosen: continues session {parent.id}")
        for cid in rejected:
            await self._host.close_session(cid, "fork: not chosen")
        parent.held = None
        if parent.state.value == "paused" and parent.has_viewer:
            parent.resume()
        log.info("session %s continues from candidate %s", parent.id, candidate_id)
        return candidate_id, len(rejected)

    def _candidate_ended(self, session: Session) -> None:
        for fork in list(self._forks.values()):
            if session.id in fork.candidates and fork.chosen is None:
                fork.ended.add(session.id)
                if fork.ended == set(fork.candidates):  # all gone without a choice
                    del self._forks[fork.parent.id]
                    fork.parent.held = None

    def _parent_ended(self, parent: Session) -> None:
        fork = self._forks.pop(parent.id, None)
        if fork is None:
            return
        for session in fork.candidates.values():
            if not session.terminal and session.handle is not None:
                session.handle.cancel("fork parent ended")
