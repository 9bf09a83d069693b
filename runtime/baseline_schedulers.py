"""Request-level baseline scheduling policies, ``chunk-rr`` and ``fifo`` (docs/architecture.md
§3, "Policies are objects").

They exist to be measured against ``step-edf`` (``runtime.step_edf``): same engine, same
loops, only the policy object differs. Both ignore deadlines, priorities and batching (every
batch is one plan, as in a server that runs one request's forward at a time); both keep the
lead limit (a ticket starts a turn only once ``eligible_s <= now``), because it protects the
session's drop-oldest media queue rather than ordering work, and without it a baseline would
be measured on dropped frames instead of on its order.

``chunk-rr`` (``ChunkRoundRobinScheduler``)
    A loop that gets the executor keeps it for a whole chunk: every plan it submits runs
    until a plan marked ``Ticket.ends_chunk`` (final media of the chunk) has completed; then
    the turn passes round robin, in arrival order, to the next loop with an eligible plan.
    With decode-before-KV-update loops the turn that follows a chunk's decode starts with
    its KV update. A loop that never emits final media (a batch job) holds the executor
    until it ends. Inside a turn the holder's plans run without waiting for ``eligible_s``
    (the chunk is one unit of work); while the holder is between two plans (its driver
    folds a result and describes the next plan) nothing else runs.

``fifo`` (``FifoScheduler``)
    Loops in arrival order (first ticket seen), each to completion: the earliest-arrived loop
    with a plan ready runs, so a batch job that arrived first blocks everyone until it ends.
    An unbounded session never completes, so "to completion" means: it keeps the executor
    while it has plans ready. It lets later loops run while it has none - it is paused, or
    its next plan is ahead of its playout (lead limit) - and takes the executor back at the
    next step boundary once it is ready again. Between two plans of the loop that ran last,
    nothing else runs (that gap is not "no plan ready").

A turn ends early when its loop is dropped (ended, cancelled) or paused.
"""

from __future__ import annotations

import math

from runtime.scheduler import Batch, PickReason, Ticket, TicketQueue

__all__ = ["ChunkRoundRobinScheduler", "FifoScheduler"]


class _ArrivalQueue(TicketQueue):
    """A ticket queue that remembers the order in which loops arrived and which loop the
    executor is reserved for (``_holder``: its next plan runs before anything else)."""

    def __init__(self) -> None:
        super().__init__()
        self._arrival: dict[str, int] = {}
        self._arrivals = 0
        self._holder: str | None = None

    def submit(self, ticket: Ticket) -> None:
        super().submit(ticket)
        if ticket.loop_id not in self._arrival:
            self._arrival[ticket.loop_id] = self._arrivals
            self._arrivals += 1

    def drop_loop(self, loop_id: str) -> list[int]:
        self._arrival.pop(loop_id, None)
        if self._holder == loop_id:
            self._holder = None
        return super().drop_loop(loop_id)

    def pause_loop(self, loop_id: str) -> None:
        super().pause_loop(loop_id)
        if self._holder == loop_id:
            self._holder = None

    @property
    def holder(self) -> str | None:
        """The loop the executor is reserved for, if any."""
        return self._holder

    def _ready(self, now_s: float) -> list[Ticket]:
        """Each unpaused loop's oldest queued ticket, if eligible, in arrival order."""
        heads = []
        for loop_id in self._by_loop:
            if loop_id in self._paused:
                continue
            head = self._first_queued(loop_id)
            if head is not None and head.eligible_s <= now_s:
                heads.append(head)
        return sorted(heads, key=lambda t: self._arrival[t.loop_id])

    def _holder_waits(self) -> bool:
        """The holder is between two plans: nothing may run until it submits its next."""
        return self._holder is not None and self._first_queued(self._holder) is None

    def _soonest_eligible(self, now_s: float) -> float | None:
        soonest = math.inf
        for ticket in self._tickets.values():
            if ticket.loop_id not in self._paused and now_s < ticket.eligible_s < soonest:
                soonest = ticket.eligible_s
        return None if soonest == math.inf else soonest


class ChunkRoundRobinScheduler(_ArrivalQueue):
    """``chunk-rr``: whole chunks, loops taking turns round robin (see the module docstring)."""

    name = "chunk-rr"

    def __init__(self) -> None:
        super().__init__()
        self._last_turn = -1  # arrival number of the loop whose turn came last
        self._turn_ends = False  # the plan in flight ends its loop's turn

    def pick(self, now_s: float) -> Batch | None:
        self._check_boundary()
        if self._holder is not None:
            head = self._first_queued(self._holder)
            if head is None:
                return None
        else:
            ready = self._ready(now_s)
            if not ready:
                return None
            # round robin: the first ready loop that arrived after the last turn's, else wrap
            later = [t for t in ready if self._arrival[t.loop_id] > self._last_turn]
            head = (later or ready)[0]
            self._holder = head.loop_id
            self._last_turn = self._arrival[head.loop_id]
        self._turn_ends = head.ends_chunk
        return self._commit([head], PickReason.TURN, now_s)

    def complete(self, batch_id: int) -> None:
        super().complete(batch_id)
        if self._turn_ends:
            self._holder = None
            self._turn_ends = False

    def next_event_s(self, now_s: float) -> float | None:
        if self._holder is not None:
            return None  # only the holder's next submission (or its end) changes anything
        return self._soonest_eligible(now_s)


class FifoScheduler(_ArrivalQueue):
    """``fifo``: loops in arrival order, each while it has plans ready (module docstring)."""

    name = "fifo"

    def pick(self, now_s: float) -> Batch | None:
        self._check_boundary()
        if self._holder_waits():
            return None
        ready = self._ready(now_s)
        if not ready:
            return None
        head = ready[0]
        self._holder = head.loop_id
        return self._commit([head], PickReason.ARRIVAL, now_s)

    def next_event_s(self, now_s: float) -> float | None:
        if self._holder_waits():
            return None
        return self._soonest_eligible(now_s)
