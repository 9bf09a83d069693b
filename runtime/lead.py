"""Lead limits: how far ahead of its playout a realtime plan may run (a policy object).

The engine computes each realtime plan's deadline from its stream's playout anchor
(``runtime.scheduler.PlayoutDeadlines``); the lead policy then says when the plan becomes
eligible and may rank it earlier (the deadline the scheduler orders by; deadline misses are
still counted against the playout deadline). Two policies:

- ``FixedLead`` (the plain limit, kept to measure against): eligible ``max_lead_s`` before
  the deadline, always.
- ``AdaptiveLead`` (the default, for time to steer):

  * a plan that reflects a **pending input** (``WorkPlan.inputs`` names one not yet
    acknowledged: a prompt, a changed key), or whose chunk such an input waits for
    (``WorkPlan.waiting_inputs``), is eligible at once and ranks as due as soon as its work
    allows (``now + cost + followups``): the input's frames are shown as soon as they exist
    (the sink drops the older queued media), so nothing is gained by waiting for the playout
    and the viewer who just typed is waiting;
  * a loop **being steered** (an input pushed within ``steer_hold_s``) runs just in time:
    ``steer_lead_s`` instead of ``max_lead_s``, so media generated under the old input is not
    a second ahead of the viewer (a repeated key's frames, which play in order, show sooner)
    and the next input's flush throws less generation away. The hold spans a steering
    viewer's rhythm (10 s: prompt switches every 3-4 s keep the short lead between them);
  * otherwise ``max_lead_s`` (a comfortable buffer against jitter while nobody steers).

Pure: no torch, no asyncio; times are seconds on the engine clock.
"""

from __future__ import annotations

from typing import Protocol

from runtime.scheduler import SchedulerError

__all__ = ["AdaptiveLead", "FixedLead", "LeadPolicy", "LeadState"]


class LeadState(Protocol):
    """What a lead policy knows of the plan's loop."""

    @property
    def pending_input(self) -> bool:
        """The plan reflects an input pushed and not yet acknowledged."""
        ...

    @property
    def last_input_s(self) -> float | None:
        """When the loop's last input was pushed (engine clock), None if never."""
        ...


class LeadPolicy(Protocol):
    name: str

    def window(
        self,
        deadline_s: float,
        *,
        now_s: float,
        cost_s: float,
        followups_s: float,
        loop: LeadState,
    ) -> tuple[float, float]:
        """``(rank_deadline_s, eligible_s)`` of a realtime plan whose playout deadline is
        ``deadline_s``, predicted cost ``cost_s`` and followups ``followups_s``."""
        ...


def _check(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise SchedulerError(f"{name}={value} must be >= 0")


class FixedLead:
    """Eligible ``max_lead_s`` before the deadline."""

    name = "fixed"

    def __init__(self, max_lead_s: float = 1.0) -> None:
        _check(max_lead_s=max_lead_s)
        self.max_lead_s = max_lead_s

    def window(
        self,
        deadline_s: float,
        *,
        now_s: float,
        cost_s: float,
        followups_s: float,
        loop: LeadState,
    ) -> tuple[float, float]:
        return deadline_s, deadline_s - self.max_lead_s


class AdaptiveLead:
    """See the module docstring."""

    name = "adaptive"

    def __init__(
        self, max_lead_s: float = 1.0, *, steer_lead_s: float = 0.5, steer_hold_s: float = 10.0
    ) -> None:
        _check(max_lead_s=max_lead_s, steer_lead_s=steer_lead_s, steer_hold_s=steer_hold_s)
        self.max_lead_s = max_lead_s
        self.steer_lead_s = min(steer_lead_s, max_lead_s)
        self.steer_hold_s = steer_hold_s

    def window(
        self,
        deadline_s: float,
        *,
        now_s: float,
        cost_s: float,
        followups_s: float,
        loop: LeadState,
    ) -> tuple[float, float]:
        if loop.pending_input:
            return min(deadline_s, now_s + cost_s + followups_s), now_s
        last = loop.last_input_s
        steered = last is not None and now_s - last <= self.steer_hold_s
        return deadline_s, deadline_s - (self.steer_lead_s if steered else self.max_lead_s)
