"""``PlanTiming``: the cost, deadline and eligibility of one plan as the engine submits it.

It joins three policies the engine is given: the cost model (predicted GPU-seconds of the plan
and of its followups), ``PlayoutDeadlines`` (the playout deadline of a realtime plan: its media
must be on the wire at ``media_t0 + due_media_s + playout_buffer``, minus the followups) and the
lead policy (``runtime.lead``: when the plan becomes eligible, and the deadline the scheduler
ranks it by). Batch loops and plans without ``due_media_s`` have no deadline and are eligible
at once. Pure: no torch, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.cost import CostModel
from runtime.input_trace import InputTrace
from runtime.lead import LeadPolicy
from runtime.plans import Priority, WorkPlan
from runtime.scheduler import PlayoutDeadlines

__all__ = ["PlanTiming", "PlanWindow"]


@dataclass(frozen=True, slots=True)
class PlanWindow:
    """``deadline_s``: the playout deadline (misses are counted against it); ``rank_s``: the
    deadline the scheduler orders by; ``eligible_s``: earliest start; ``cost_s``: predicted."""

    deadline_s: float | None
    rank_s: float | None
    eligible_s: float
    cost_s: float


@dataclass(frozen=True, slots=True)
class _LeadState:
    pending_input: bool
    last_input_s: float | None


class PlanTiming:
    """See the module docstring."""

    def __init__(self, cost: CostModel, deadlines: PlayoutDeadlines, lead: LeadPolicy) -> None:
        self.cost = cost
        self.deadlines = deadlines
        self.lead = lead

    def window(
        self,
        plan: WorkPlan,
        *,
        priority: Priority,
        media_t0_s: float,
        trace: InputTrace,
        now_s: float,
    ) -> PlanWindow:
        cost_s = self.cost.predict(plan.kind, plan.shape_sig, plan.flops)
        if priority is not Priority.REALTIME or plan.due_media_s is None:
            return PlanWindow(None, None, now_s, cost_s)
        followups_s = sum(self.cost.predict(f.kind, f.shape_sig, f.flops) for f in plan.followups)
        deadline_s, _ = self.deadlines.timing(media_t0_s, plan.due_media_s, followups_s)
        pending = trace.pending(plan.inputs) or trace.pending(plan.waiting_inputs)
        state = _LeadState(pending, trace.last_pushed_s)
        rank_s, eligible_s = self.lead.window(
            deadline_s, now_s=now_s, cost_s=cost_s, followups_s=followups_s, loop=state
        )
        return PlanWindow(deadline_s, rank_s, eligible_s, cost_s)
