"""The scheduler seam: what the engine asks of a scheduling policy, and the data it passes.

Data in, data out: a scheduler sees plain ``Ticket``s (no tensors, no futures, no ops) and
answers ``pick(now_s) -> Batch | None``. The engine turns plans into tickets (deadline, cost,
eligibility, chunk end), runs the picked batch and calls ``complete(batch_id)``. Pure: imports
neither torch nor asyncio, so policies are tested with a fake clock and a fake executor.

The engine is *given* its scheduler (policies are objects); the policies are

- ``runtime.step_edf.StepEdfScheduler`` (``step-edf``, the default): step-level earliest
  deadline first with batching, slack-filling batch work and aging;
- ``runtime.baseline_schedulers`` (``chunk-rr``, ``fifo``): request-level baselines that exist
  to be measured against step-edf (``dreamrt bench multisession``);

and ``runtime.policies.make_scheduler(name)`` builds one by name. ``TicketQueue`` is the
bookkeeping they share (queue, paused loops, the one batch in flight); a policy adds ``pick``
and ``next_event_s``. A scheduler object serves one engine.

Every policy obeys **step boundaries only**: ``pick`` refuses while a picked batch has not been
``complete``d, so a running plan is never preempted. Paused loops keep their tickets queued;
they are never picked and never cause a wake-up.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from runtime.emissions import EmitSpec
from runtime.plans import Priority

__all__ = [
    "Batch",
    "PickReason",
    "PlayoutDeadlines",
    "Scheduler",
    "SchedulerError",
    "Ticket",
    "TicketQueue",
    "ends_chunk",
]

BatchKey = tuple[str, ...]


class SchedulerError(RuntimeError):
    """Protocol misuse: duplicate plan ids, picking while a batch runs, unknown batch ids."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """One queued plan as the scheduler sees it. Times are seconds on the engine's clock.

    ``deadline_s`` is when the plan must have finished (``None``: no deadline),
    ``eligible_s`` the earliest time it may start (lead limit; batch work uses its enqueue
    time), ``cost_gpu_s`` its predicted cost. ``ends_chunk``: the plan emits the final media
    of a chunk (``ends_chunk(plan.emits)``); chunk-rr ends a loop's turn after it.
    """

    plan_id: int
    loop_id: str
    priority: Priority
    batch_key: BatchKey
    batchable: bool
    deadline_s: float | None
    cost_gpu_s: float
    enqueued_s: float
    eligible_s: float
    ends_chunk: bool = False


class PickReason(str, enum.Enum):
    """Why a batch was picked."""

    DEADLINE = "deadline"  # step-edf: realtime, earliest deadline first
    AGED = "aged"  # step-edf: a batch ticket promoted by aging
    SLACK = "slack"  # step-edf: batch work in realtime slack
    TURN = "turn"  # chunk-rr: the loop whose turn it is
    ARRIVAL = "arrival"  # fifo: the earliest-arrived loop with a plan ready


@dataclass(frozen=True, slots=True)
class Batch:
    """Plans that run together as one op call, head first. ``cost_gpu_s`` is the sum of the
    members' predicted costs (a conservative bound for the batched run)."""

    batch_id: int
    plan_ids: tuple[int, ...]
    loop_ids: tuple[str, ...]
    batch_key: BatchKey
    priority: Priority
    reason: PickReason
    cost_gpu_s: float
    picked_s: float


class Scheduler(Protocol):
    """What the engine calls (all on its event loop). ``pick`` returning ``None`` means
    "nothing may run now"; ``next_event_s`` says when that can change without a new
    submission, a drop, a pause/resume or a ``complete`` (``None``: only through those)."""

    name: str

    def submit(self, ticket: Ticket) -> None: ...

    def update(self, plan_id: int, *, deadline_s: float | None, eligible_s: float) -> None: ...

    def drop_loop(self, loop_id: str) -> list[int]: ...

    def pause_loop(self, loop_id: str) -> None: ...

    def resume_loop(self, loop_id: str) -> None: ...

    def depth(self) -> int: ...

    def pick(self, now_s: float) -> Batch | None: ...

    def complete(self, batch_id: int) -> None: ...

    def next_event_s(self, now_s: float) -> float | None: ...


def ends_chunk(emits: Iterable[EmitSpec]) -> bool:
    """True if ``emits`` hold the final media of a chunk: a ``"media"`` spec whose meta says
    ``final`` (a Mapping key or a typed meta's attribute). A media spec without that mark is a
    whole chunk: ``final=False`` is how a loop says a part leaves frames of its chunk to come."""
    return any(spec.stream == "media" and _final(spec.meta) for spec in emits)


def _final(meta: object) -> bool:
    if isinstance(meta, Mapping):
        return bool(meta.get("final", True))
    return bool(getattr(meta, "final", True))


class TicketQueue:
    """The bookkeeping every policy shares: queued tickets by plan and by loop, paused loops,
    loops that have run (``started``), and the one batch in flight. Subclasses implement
    ``pick`` (building the batch with ``_commit``) and ``next_event_s``."""

    name = "queue"

    def __init__(self) -> None:
        self._tickets: dict[int, Ticket] = {}
        self._by_loop: dict[str, set[int]] = {}
        self._paused: set[str] = set()
        self._started: set[str] = set()
        self._in_flight: Batch | None = None
        self._next_batch_id = 0

    # -- queue ------------------------------------------------------------------------------

    def submit(self, ticket: Ticket) -> None:
        if ticket.plan_id in self._tickets:
            raise SchedulerError(
                f"plan {ticket.plan_id} of loop {ticket.loop_id!r} is already queued"
            )
        if not (math.isfinite(ticket.cost_gpu_s) and ticket.cost_gpu_s >= 0):
            raise SchedulerError(
                f"plan {ticket.plan_id}: cost_gpu_s={ticket.cost_gpu_s} must be finite, >= 0"
            )
        self._tickets[ticket.plan_id] = ticket
        self._by_loop.setdefault(ticket.loop_id, set()).add(ticket.plan_id)

    def update(self, plan_id: int, *, deadline_s: float | None, eligible_s: float) -> None:
        """Re-time a queued ticket (its session's media anchor moved)."""
        ticket = self._tickets.get(plan_id)
        if ticket is None:
            raise SchedulerError(f"plan {plan_id} is not queued")
        self._tickets[plan_id] = replace(ticket, deadline_s=deadline_s, eligible_s=eligible_s)

    def drop_loop(self, loop_id: str) -> list[int]:
        """Remove the loop's queued tickets and forget it; returns their plan ids, ascending.

        A plan of this loop that is in flight is not affected (it finishes; the caller
        discards its result).
        """
        plan_ids = sorted(self._by_loop.pop(loop_id, ()))
        for plan_id in plan_ids:
            del self._tickets[plan_id]
        self._paused.discard(loop_id)
        self._started.discard(loop_id)
        return plan_ids

    def pause_loop(self, loop_id: str) -> None:
        self._paused.add(loop_id)

    def resume_loop(self, loop_id: str) -> None:
        self._paused.discard(loop_id)

    def is_paused(self, loop_id: str) -> bool:
        return loop_id in self._paused

    def depth(self) -> int:
        """Number of queued tickets (paused ones included)."""
        return len(self._tickets)

    def queued(self, loop_id: str) -> tuple[int, ...]:
        return tuple(sorted(self._by_loop.get(loop_id, ())))

    def ticket(self, plan_id: int) -> Ticket | None:
        return self._tickets.get(plan_id)

    def tickets(self) -> tuple[Ticket, ...]:
        """Every queued ticket, by plan id."""
        return tuple(sorted(self._tickets.values(), key=_plan_id))

    @property
    def in_flight(self) -> Batch | None:
        return self._in_flight

    # -- decisions --------------------------------------------------------------------------

    def complete(self, batch_id: int) -> None:
        """The picked batch finished (successfully or not); the next pick may happen."""
        if self._in_flight is None or self._in_flight.batch_id != batch_id:
            current = None if self._in_flight is None else self._in_flight.batch_id
            raise SchedulerError(f"complete({batch_id}) but the batch in flight is {current}")
        self._in_flight = None

    def _check_boundary(self) -> None:
        if self._in_flight is not None:
            raise SchedulerError(
                f"pick while batch {self._in_flight.batch_id} is in flight: "
                "plans are picked only at step boundaries; call complete() first"
            )

    def _first_queued(self, loop_id: str) -> Ticket | None:
        """The loop's oldest queued ticket (a driver queues one plan at a time)."""
        plan_ids = self._by_loop.get(loop_id)
        return self._tickets[min(plan_ids)] if plan_ids else None

    def _commit(self, members: list[Ticket], reason: PickReason, now_s: float) -> Batch:
        head = members[0]
        for ticket in members:
            del self._tickets[ticket.plan_id]
            loop_plans = self._by_loop[ticket.loop_id]
            loop_plans.discard(ticket.plan_id)
            if not loop_plans:
                del self._by_loop[ticket.loop_id]
            self._started.add(ticket.loop_id)
        batch = Batch(
            batch_id=self._next_batch_id,
            plan_ids=tuple(t.plan_id for t in members),
            loop_ids=tuple(t.loop_id for t in members),
            batch_key=head.batch_key,
            priority=head.priority,
            reason=reason,
            cost_gpu_s=sum(t.cost_gpu_s for t in members),
            picked_s=now_s,
        )
        self._next_batch_id += 1
        self._in_flight = batch
        return batch


class PlayoutDeadlines:
    """Deadline and lead limit of a realtime plan (docs/architecture.md §3, "Classes and
    deadlines").

    The media a plan contributes to must be on the wire at ``media_t0_s + due_media_s +
    playout_buffer_s``; the plan must finish ``followups_s`` (predicted cost of the plans still
    needed after it) before that, so EDF on this deadline is least-laxity-first inside a chunk.
    It becomes eligible ``max_lead_s`` before its deadline: a session never runs further ahead
    of its playout than its drop-oldest media queue can hold.
    """

    def __init__(self, *, playout_buffer_s: float = 0.25, max_lead_s: float = 1.0) -> None:
        if not (playout_buffer_s >= 0 and max_lead_s >= 0):
            raise SchedulerError(
                f"playout_buffer_s={playout_buffer_s} and max_lead_s={max_lead_s} must be >= 0"
            )
        self.playout_buffer_s = playout_buffer_s
        self.max_lead_s = max_lead_s

    def timing(
        self, media_t0_s: float, due_media_s: float, followups_s: float
    ) -> tuple[float, float]:
        """``(deadline_s, eligible_s)`` on the clock ``media_t0_s`` is expressed in."""
        deadline_s = media_t0_s + due_media_s + self.playout_buffer_s - followups_s
        return deadline_s, deadline_s - self.max_lead_s


def _plan_id(ticket: Ticket) -> int:
    return ticket.plan_id
