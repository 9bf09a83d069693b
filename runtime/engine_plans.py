"""The engine's queued plans: what a loop's context and handle ask of the engine
(``runtime.loop_handle.LoopControl``) - submit a plan and await its result, take a queued plan
back (an input arrived, a hold lifted), drop a loop's plans (cancelled, ended), pause it and
move its deadlines (``set_loop_media_t0``).

A mixin of ``runtime.engine.Engine`` (docs/architecture.md §3): it reads the engine's
scheduler, plan timing, clock and state, and keeps the table of queued and executing plans
(``PlanEntry`` by plan id) that the engine's dispatch and batch completion read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from runtime.engine_state import EngineState
from runtime.loop_failures import Cancelled, LoopFailed, PlanWithdrawn
from runtime.loop_handle import LoopRecord, LoopStatus
from runtime.plan_timing import PlanTiming, PlanWindow
from runtime.plans import StepResult, WorkPlan
from runtime.scheduler import Scheduler, Ticket, ends_chunk

__all__ = ["EnginePlans", "PlanEntry"]

logger = logging.getLogger("runtime.engine")  # its messages are the engine's


@dataclass(slots=True)
class PlanEntry:
    plan_id: int
    record: LoopRecord
    plan: WorkPlan
    future: asyncio.Future[StepResult]
    deadline_s: float | None  # the playout deadline (misses are counted against it)


class EnginePlans:
    """The loops' plans in the engine (see the module docstring)."""

    # what it reads of the engine
    scheduler: Scheduler
    timing: PlanTiming
    withdraw_on_input: bool
    _clock: Callable[[], float]
    _state: EngineState
    _broken: BaseException | None
    _poke: Callable[[], None]
    # what it keeps (made by the engine's constructor)
    _plans: dict[int, PlanEntry]
    _next_plan_id: int

    async def submit_plan(self, record: LoopRecord, plan: WorkPlan) -> StepResult:
        if record.cancel_reason is not None:
            raise Cancelled(record.loop_id, record.cancel_reason)
        if self._state is not EngineState.RUNNING:
            raise Cancelled(record.loop_id, "engine_closed")
        if self._broken is not None:
            raise LoopFailed(
                record.loop_id, "internal", f"engine scheduler crashed: {self._broken}"
            )
        now_s = self._clock()
        record.trace.planned(plan.inputs)
        window = self._window(record, plan, now_s)
        plan_id = self._next_plan_id
        self._next_plan_id += 1
        future: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()
        self._plans[plan_id] = PlanEntry(plan_id, record, plan, future, window.deadline_s)
        self.scheduler.submit(
            Ticket(
                plan_id=plan_id,
                loop_id=record.loop_id,
                priority=record.priority,
                batch_key=(*plan.batch_key, f"op@{id(plan.op):x}"),
                batchable=plan.op.batchable,
                deadline_s=window.rank_s,
                cost_gpu_s=window.cost_s,
                enqueued_s=now_s,
                eligible_s=window.eligible_s,
                ends_chunk=ends_chunk(plan.emits),
            )
        )
        record.queued_plan = plan_id
        self._poke()
        try:
            return await future
        except asyncio.CancelledError:
            if record.queued_plan == plan_id:
                self._drop_queued(record, None)
            raise

    def _window(self, record: LoopRecord, plan: WorkPlan, now_s: float) -> PlanWindow:
        return self.timing.window(
            plan,
            priority=record.priority,
            media_t0_s=record.media_t0_s,
            trace=record.trace,
            now_s=now_s,
        )

    def _drop_queued(self, record: LoopRecord, error: BaseException | None) -> None:
        for plan_id in self.scheduler.drop_loop(record.loop_id):
            entry = self._plans.pop(plan_id)
            if error is not None and not entry.future.done():
                entry.future.set_exception(error)
        record.queued_plan = None

    def cancel_loop(self, record: LoopRecord, reason: str) -> None:
        if record.status is not LoopStatus.RUNNING or record.cancel_reason is not None:
            return
        record.cancel_reason = reason
        logger.info("loop %s: cancel requested (%s)", record.loop_id, reason)
        self._drop_queued(record, Cancelled(record.loop_id, reason))
        self._poke()

    def set_loop_paused(self, record: LoopRecord, paused: bool, *, hold: bool = False) -> None:
        if record.status is not LoopStatus.RUNNING:
            return
        stopped = record.stopped
        if hold and record.held and not paused:  # a released loop re-describes its plan
            self._drop_queued(record, PlanWithdrawn(record.loop_id))
        setattr(record, "held" if hold else "paused", paused)
        if record.stopped != stopped:
            pause = self.scheduler.pause_loop if record.stopped else self.scheduler.resume_loop
            pause(record.loop_id)
        self._poke()

    def set_loop_media_t0(self, record: LoopRecord, t0_s: float) -> None:
        record.media_t0_s = t0_s
        if record.queued_plan is not None:
            entry = self._plans[record.queued_plan]
            window = self._window(record, entry.plan, self._clock())
            entry.deadline_s = window.deadline_s
            self.scheduler.update(
                entry.plan_id, deadline_s=window.rank_s, eligible_s=window.eligible_s
            )
            self._poke()

    def inputs_arrived(self, record: LoopRecord) -> None:
        """Live inputs were queued for ``record``: with ``withdraw_on_input``, its plan still
        waiting in the queue (not executing) is taken back so the loop absorbs them now."""
        if not self.withdraw_on_input or record.queued_plan is None or record.done:
            return
        self._drop_queued(record, PlanWithdrawn(record.loop_id))
        self._poke()
