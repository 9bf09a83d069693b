"""``step-edf``: step-level earliest deadline first, the engine's default scheduling policy
(docs/architecture.md §3).

Picking, in order (each rule is a policy object):

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

import math
from collections.abc import Callable, Iterable, Sequence

from runtime.plans import Priority
from runtime.scheduler import Batch, PickReason, SchedulerError, Ticket, TicketQueue

__all__ = [
    "BatchAging",
    "CompatibleBatching",
    "EdfOrder",
    "EdfSlack",
    "RunningFirstFifo",
    "StepEdfScheduler",
]


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


class StepEdfScheduler(TicketQueue):
    """``step-edf``: the queue plus the policies above; one batch in flight at a time.

    Capacity is not the scheduler's concern (admission decided it before the loop ran);
    ``pick`` returning ``None`` means "nothing may run now" and ``next_event_s`` says when
    that can change without a new submission.
    """

    name = "step-edf"

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
        super().__init__()
        self.order = order or EdfOrder()
        self.batch_order = batch_order or RunningFirstFifo()
        self.aging = aging or BatchAging(max_batch_wait_s)
        self.slack = slack or EdfSlack()
        self.batching = batching or CompatibleBatching(max_batch)

    def pick(self, now_s: float) -> Batch | None:
        """The next batch to run, or ``None``. Only at a step boundary (nothing in flight)."""
        self._check_boundary()
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
            first_fit = next(fitting, None)
            if first_fit is None:
                return None
            members = self.batching.form(
                first_fit, ordered, fits=lambda total_s: self.slack.allows(total_s, slack_s)
            )
            reason = PickReason.SLACK
        else:
            return None
        return self._commit(members, reason, now_s)

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


def _first(item: tuple[tuple[object, ...], Ticket]) -> tuple[object, ...]:
    return item[0]
