"""The scheduler: which queued plans run next, as one batch (ARCHITECTURE.md §4).

Data in, data out: the scheduler sees plain ``Ticket``s (no tensors, no futures, no ops) and
answers ``pick(now_s) -> Batch | None``. The engine turns plans into tickets (deadline, cost,
eligibility), runs the picked batch and calls ``complete(batch_id)``. Pure: imports neither
torch nor asyncio, so it can be tested with a fake clock and a fake executor.

Picking, in order (each rule is a policy object, STYLE rule 3):

1. **Step boundaries only.** ``pick`` refuses while a picked batch has not been
   ``complete``d: a running plan is never preempted, the next decision waits for its end.
2. **Urgent group, earliest deadline first** (``EdfOrder``): realtime tickets that are
   eligible (``eligible_s <= now``: the lead limit, so a session never runs more than
   ``max_lead_s`` ahead of its playout) plus *aged* batch tickets (``BatchAging``: older than
   ``max_batch_wait_s``; they compete with the virtual deadline ``enqueued_s +
   max_batch_wait_s``, which is already past, so they are never starved). The engine already
   subtracted the cost of a plan's followups from its deadline, so EDF here is also
   least-laxity-first inside a chunk. Realtime tickets without a deadline rank last within
   the group.
3. **Slack group** (only if the urgent group is empty): batch tickets, ordered running-first
   then FIFO (``RunningFirstFifo``). One runs only if the queued realtime work keeps more
   slack than its cost (``EdfSlack``); the first ticket in that order that fits is taken
   (backfilling), so a cheap batch step may go before an expensive one that does not fit.
4. **Batching** (``CompatibleBatching``): the head ticket is joined by tickets of the same
   group with the same ``batch_key`` that are ``batchable``, in policy order, up to
   ``max_batch`` (and, in the slack group, only while the batch still fits the slack).

Running loops first (decision): a loop that has already executed a plan beats one that has
not. For realtime work this is a tie-break at equal deadline (urgency decides first). For
batch work it comes before FIFO order: finishing started jobs minimises mean completion time
and the time their reservations stay held, and aging bounds how long a new job waits.

Paused loops keep their tickets queued; they are never picked and count neither for slack
nor for the next wake-up time.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from runtime.contract import Priority

__all__ = [
    "Batch",
    "BatchAging",
    "CompatibleBatching",
    "EdfOrder",
    "EdfSlack",
    "PickReason",
    "PlayoutDeadlines",
    "RunningFirstFifo",
    "Scheduler",
    "SchedulerError",
    "Ticket",
]

BatchKey = tuple[str, ...]


class SchedulerError(RuntimeError):
    """Protocol misuse: duplicate plan ids, picking while a batch runs, unknown batch ids."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """One queued plan as the scheduler sees it. Times are seconds on the engine's clock.

    ``deadline_s`` is when the plan must have finished (``None``: no deadline),
    ``eligible_s`` the earliest time it may start (lead limit; batch work uses its enqueue
    time), ``cost_gpu_s`` its predicted cost.
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


class PickReason(str, enum.Enum):
    """Why a batch was picked."""

    DEADLINE = "deadline"  # realtime, earliest deadline first
    AGED = "aged"  # a batch ticket promoted by aging
    SLACK = "slack"  # batch work in realtime slack


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


# --------------------------------------------------------------------------------------------
# Policies


class EdfOrder:
    """Urgent-group order: deadline, then running loops first, then FIFO, then plan id."""

    def key(
        self, deadline_s: float, ticket: Ticket, running: bool
    ) -> tuple[float, bool, float, int]:
        return (deadline_s, not running, ticket.enqueued_s, ticket.plan_id)


class RunningFirstFifo:
    """Slack-group order: loops that already ran first, then FIFO, then plan id."""

    def key(self, ticket: Ticket, running: bool) -> tuple[bool, float, int]:
        return (not running, ticket.enqueued_s, ticket.plan_id)


class BatchAging:
    """A batch ticket waiting ``max_batch_wait_s`` or longer is promoted to the urgent group
    with the virtual deadline ``enqueued_s + max_batch_wait_s``."""

    def __init__(self, max_batch_wait_s: float) -> None:
        if not max_batch_wait_s >= 0:
            raise SchedulerError(f"max_batch_wait_s={max_batch_wait_s} must be >= 0")
        self.max_batch_wait_s = max_batch_wait_s

    def promotion_s(self, ticket: Ticket) -> float:
        return ticket.enqueued_s + self.max_batch_wait_s

    def promoted(self, ticket: Ticket, now_s: float) -> bool:
        return now_s >= self.promotion_s(ticket)


class EdfSlack:
    """Slack left by queued realtime work if it ran EDF from now.

    ``slack_s = min_k (d_k - now - sum_{j<=k} c_j)`` over realtime tickets with deadlines
    sorted by deadline (for one ticket this is its deadline minus now minus its cost);
    ``inf`` without such tickets. Batch work of cost ``c`` may run iff ``slack_s > c``.
    """

    def slack_s(self, realtime: Iterable[Ticket], now_s: float) -> float:
        timed = sorted((t.deadline_s, t.cost_gpu_s) for t in realtime if t.deadline_s is not None)
        slack = math.inf
        spent = 0.0
        for deadline_s, cost_s in timed:
            spent += cost_s
            slack = min(slack, deadline_s - now_s - spent)
        return slack

    def allows(self, cost_s: float, slack_s: float) -> bool:
        return slack_s > cost_s


class CompatibleBatching:
    """Groups the head with compatible tickets: equal ``batch_key``, both ``batchable``."""

    def __init__(self, max_batch: int) -> None:
        if max_batch < 1:
            raise SchedulerError(f"max_batch={max_batch} must be >= 1")
        self.max_batch = max_batch

    def compatible(self, head: Ticket, other: Ticket) -> bool:
        return head.batchable and other.batchable and head.batch_key == other.batch_key

    def form(
        self,
        head: Ticket,
        ordered: Sequence[Ticket],
        fits: Callable[[float], bool] = lambda _cost_s: True,
    ) -> list[Ticket]:
        """Head first, then compatible tickets of ``ordered`` in order while ``fits(total)``."""
        members = [head]
        total_s = head.cost_gpu_s
        if not head.batchable:
            return members
        for ticket in ordered:
            if len(members) >= self.max_batch:
                break
            if ticket is head or not self.compatible(head, ticket):
                continue
            if fits(total_s + ticket.cost_gpu_s):
                members.append(ticket)
                total_s += ticket.cost_gpu_s
        return members


class PlayoutDeadlines:
    """Deadline and lead limit of a realtime plan (ARCHITECTURE.md §4 "Deadlines").

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


# --------------------------------------------------------------------------------------------
# Scheduler


class Scheduler:
    """Queue of tickets plus the policies above; one batch in flight at a time.

    Capacity is not the scheduler's concern (admission decided it before the loop ran);
    ``pick`` returning ``None`` means "nothing may run now" and ``next_event_s`` says when
    that can change without a new submission.
    """

    def __init__(
        self,
        *,
        max_batch: int = 8,
        max_batch_wait_s: float = 2.0,
        order: EdfOrder | None = None,
        batch_order: RunningFirstFifo | None = None,
        aging: BatchAging | None = None,
        slack: EdfSlack | None = None,
        batching: CompatibleBatching | None = None,
    ) -> None:
        self.order = order or EdfOrder()
        self.batch_order = batch_order or RunningFirstFifo()
        self.aging = aging or BatchAging(max_batch_wait_s)
        self.slack = slack or EdfSlack()
        self.batching = batching or CompatibleBatching(max_batch)
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

    def pick(self, now_s: float) -> Batch | None:
        """The next batch to run, or ``None``. Only at a step boundary (nothing in flight)."""
        if self._in_flight is not None:
            raise SchedulerError(
                f"pick while batch {self._in_flight.batch_id} is in flight: "
                "plans are picked only at step boundaries; call complete() first"
            )
        urgent: list[tuple[tuple[float, bool, float, int], Ticket]] = []
        relaxed: list[tuple[tuple[bool, float, int], Ticket]] = []
        realtime_waiting: list[Ticket] = []
        for ticket in self._tickets.values():
            if ticket.loop_id in self._paused:
                continue
            running = ticket.loop_id in self._started
            if ticket.priority is Priority.REALTIME:
                if ticket.eligible_s <= now_s:
                    deadline_s = math.inf if ticket.deadline_s is None else ticket.deadline_s
                    urgent.append((self.order.key(deadline_s, ticket, running), ticket))
                else:
                    realtime_waiting.append(ticket)
            elif self.aging.promoted(ticket, now_s):
                deadline_s = self.aging.promotion_s(ticket)
                urgent.append((self.order.key(deadline_s, ticket, running), ticket))
            else:
                relaxed.append((self.batch_order.key(ticket, running), ticket))

        if urgent:
            urgent.sort(key=_first)
            ordered = [ticket for _, ticket in urgent]
            head = ordered[0]
            members = self.batching.form(head, ordered)
            reason = PickReason.DEADLINE if head.priority is Priority.REALTIME else PickReason.AGED
        elif relaxed:
            slack_s = self.slack.slack_s(realtime_waiting, now_s)
            relaxed.sort(key=_first)
            ordered = [ticket for _, ticket in relaxed]
            fitting = (t for t in ordered if self.slack.allows(t.cost_gpu_s, slack_s))
            head = next(fitting, None)
            if head is None:
                return None
            members = self.batching.form(
                head, ordered, fits=lambda total_s: self.slack.allows(total_s, slack_s)
            )
            reason = PickReason.SLACK
        else:
            return None
        return self._commit(members, reason, now_s)

    def complete(self, batch_id: int) -> None:
        """The picked batch finished (successfully or not); the next pick may happen."""
        if self._in_flight is None or self._in_flight.batch_id != batch_id:
            current = None if self._in_flight is None else self._in_flight.batch_id
            raise SchedulerError(f"complete({batch_id}) but the batch in flight is {current}")
        self._in_flight = None

    def next_event_s(self, now_s: float) -> float | None:
        """When a queued ticket can become pickable without a new submission, or ``None``.

        That is the earliest future ``eligible_s`` of a realtime ticket or the earliest
        promotion time of a batch ticket (not paused).
        """
        soonest = math.inf
        for ticket in self._tickets.values():
            if ticket.loop_id in self._paused:
                continue
            if ticket.priority is Priority.REALTIME:
                at_s = ticket.eligible_s
            else:
                at_s = self.aging.promotion_s(ticket)
            if now_s < at_s < soonest:
                soonest = at_s
        return None if soonest == math.inf else soonest

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


def _plan_id(ticket: Ticket) -> int:
    return ticket.plan_id


def _first(item: tuple[tuple[object, ...], Ticket]) -> tuple[object, ...]:
    return item[0]
