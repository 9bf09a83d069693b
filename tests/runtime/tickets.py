"""Scheduler test factories: ``ticket(...)``, a ``FakeClock`` and a ``FakeExecutor`` (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.contract import Priority
from runtime.scheduler import Batch, Ticket

KEY = ("inst", "diffusion_step", "8x16", "fp32")


def ticket(
    plan_id: int,
    loop_id: str,
    priority: Priority = Priority.REALTIME,
    *,
    deadline_s: float | None = None,
    cost_gpu_s: float = 0.1,
    enqueued_s: float = 0.0,
    eligible_s: float | None = None,
    batch_key: tuple[str, ...] = KEY,
    batchable: bool = True,
    ends_chunk: bool = False,
) -> Ticket:
    return Ticket(
        plan_id=plan_id,
        loop_id=loop_id,
        priority=priority,
        batch_key=batch_key,
        batchable=batchable,
        deadline_s=deadline_s,
        cost_gpu_s=cost_gpu_s,
        enqueued_s=enqueued_s,
        eligible_s=enqueued_s if eligible_s is None else eligible_s,
        ends_chunk=ends_chunk,
    )


@dataclass
class FakeClock:
    now_s: float = 0.0

    def advance(self, dt_s: float) -> None:
        self.now_s += dt_s


@dataclass
class FakeExecutor:
    """Runs a picked batch for its predicted cost on the fake clock, records intervals."""

    clock: FakeClock
    runs: list[tuple[Batch, float, float]] = field(default_factory=list)

    def run(self, batch: Batch) -> None:
        start = self.clock.now_s
        self.clock.advance(batch.cost_gpu_s)
        self.runs.append((batch, start, self.clock.now_s))
