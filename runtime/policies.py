"""The scheduling policies by name, for the CLI (``dreamrt serve --scheduler``) and benches.

``step-edf`` is the default (``runtime.step_edf``); ``chunk-rr`` and ``fifo`` are the
request-level baselines (``runtime.baseline_schedulers``). Pure: no torch, no asyncio.
"""

from __future__ import annotations

from runtime.baseline_schedulers import ChunkRoundRobinScheduler, FifoScheduler
from runtime.scheduler import Scheduler, SchedulerError
from runtime.step_edf import StepEdfScheduler

__all__ = ["DEFAULT_POLICY", "SCHEDULER_POLICIES", "make_scheduler"]

DEFAULT_POLICY = StepEdfScheduler.name
SCHEDULER_POLICIES: tuple[str, ...] = (
    StepEdfScheduler.name,
    ChunkRoundRobinScheduler.name,
    FifoScheduler.name,
)


def make_scheduler(
    name: str = DEFAULT_POLICY, *, max_batch: int = 8, max_batch_wait_s: float = 2.0
) -> Scheduler:
    """A new scheduler of policy ``name``. ``max_batch``/``max_batch_wait_s`` configure
    step-edf; the baselines neither batch nor age (one plan per batch, by design)."""
    if name == StepEdfScheduler.name:
        return StepEdfScheduler(max_batch=max_batch, max_batch_wait_s=max_batch_wait_s)
    if name == ChunkRoundRobinScheduler.name:
        return ChunkRoundRobinScheduler()
    if name == FifoScheduler.name:
        return FifoScheduler()
    raise SchedulerError(
        f"unknown scheduling policy {name!r}; expected one of {', '.join(SCHEDULER_POLICIES)}"
    )
