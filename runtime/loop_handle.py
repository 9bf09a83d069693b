"""One spawned loop as the engine tracks it (``LoopRecord``), as the loop sees the runtime
(``EngineContext``) and as the server grips it (``LoopHandle``).

Loop status is a state machine: ``running -> succeeded | failed | cancelled`` (terminal); the
engine moves it through ``LoopRecord.transition``. Pausing is a flag, not a status: a paused
loop is still running, its plans just are not picked.

Everything here runs on the event loop; the handle delegates every action to the engine
through the ``LoopControl`` protocol (the engine implements it).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.contract import (
    Cancelled,
    Emission,
    InputEvent,
    LoopFailed,
    LoopResult,
    PendingOutput,
    Priority,
    StepResult,
    Stream,
    WorkPlan,
)
from runtime.driver import Driver, DriverPhase
from runtime.input_trace import InputTrace

__all__ = [
    "EngineContext",
    "LoopControl",
    "LoopHandle",
    "LoopRecord",
    "LoopStatus",
    "LoopStatusError",
]

logger = logging.getLogger(__name__)


class LoopStatus(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({LoopStatus.SUCCEEDED, LoopStatus.FAILED, LoopStatus.CANCELLED})
_ALLOWED = {
    LoopStatus.RUNNING: TERMINAL,
    LoopStatus.SUCCEEDED: frozenset(),
    LoopStatus.FAILED: frozenset(),
    LoopStatus.CANCELLED: frozenset(),
}


class LoopStatusError(RuntimeError):
    """An action the loop's status does not allow (e.g. a snapshot of a finished loop)."""


@dataclass(slots=True)
class LoopRecord:
    """The engine's bookkeeping for one loop. ``queued_plan`` is the id of its plan waiting in
    the scheduler, if any (a driver awaits one plan at a time)."""

    loop_id: str
    priority: Priority
    on_emit: Callable[[Emission], None]
    media_t0_s: float
    reservation_id: str | None
    trace: InputTrace
    driver: Driver[Any] | None = None
    task: asyncio.Task[None] | None = None
    status: LoopStatus = LoopStatus.RUNNING
    paused: bool = False
    cancel_reason: str | None = None
    queued_plan: int | None = None
    inputs: deque[InputEvent] = field(default_factory=deque)
    snapshot_waiters: list[asyncio.Future[bytes]] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    result: LoopResult | None = None
    error: BaseException | None = None
    # emissions wait here, in plan order, while one of them has a PendingOutput
    emit_tail: asyncio.Task[None] | None = None
    emit_error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def on_boundary(self, driver: Driver[Any]) -> None:
        """The driver's step-boundary hook: cancellation lands here, pending snapshots are taken."""
        if self.cancel_reason is not None:
            raise Cancelled(self.loop_id, self.cancel_reason)
        if self.snapshot_waiters:
            self.serve_snapshots(driver.snapshot)

    async def snapshot(self) -> bytes:
        """At once if the driver stands at a boundary or its plan is still queued (not run,
        so the state is the one that plan was described from); else at the next boundary."""
        if self.done or self.driver is None:
            raise LoopStatusError(
                f"snapshot of loop {self.loop_id!r}, which is {self.status.value}"
            )
        if self.driver.phase is DriverPhase.BOUNDARY:
            return self.driver.snapshot()
        if self.queued_plan is not None and self.driver.phase is DriverPhase.EXECUTING:
            return self.driver.snapshot_pending()
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.snapshot_waiters.append(waiter)
        return await waiter

    def serve_snapshots(self, take: Callable[[], bytes]) -> None:
        """Resolve every pending ``snapshot()`` with ``take()`` (or the error it raised)."""
        try:
            blob = take()
        except Exception as exc:
            self.fail_snapshots(exc)
            return
        for waiter in self.snapshot_waiters:
            if not waiter.done():
                waiter.set_result(blob)
        self.snapshot_waiters.clear()

    def fail_snapshots(self, error: BaseException) -> None:
        for waiter in self.snapshot_waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self.snapshot_waiters.clear()

    def transition(self, new: LoopStatus) -> None:
        old = self.status
        if new not in _ALLOWED[old]:
            raise LoopStatusError(f"loop {self.loop_id!r} cannot go {old.value!r} -> {new.value!r}")
        self.status = new
        detail = "" if self.error is None else f" ({self.error})"
        logger.info("loop %s: %s -> %s%s", self.loop_id, old.value, new.value, detail)


class LoopControl(Protocol):
    """What the engine offers handles and contexts (implemented by ``runtime.engine.Engine``)."""

    async def submit_plan(self, record: LoopRecord, plan: WorkPlan) -> StepResult: ...

    def cancel_loop(self, record: LoopRecord, reason: str) -> None: ...

    def set_loop_paused(self, record: LoopRecord, paused: bool) -> None: ...

    def set_loop_media_t0(self, record: LoopRecord, t0_s: float) -> None: ...

    def inputs_arrived(self, record: LoopRecord) -> None: ...


def _deliver(record: LoopRecord, emission: Emission) -> None:
    """To the sink; an ``applied`` emission carries its input's runtime stages."""
    if emission.spec.stream == Stream.APPLIED:
        seq = getattr(emission.spec.meta, "seq", None)
        timing = record.trace.timing(seq) if isinstance(seq, int) else None
        if timing is not None:
            emission = Emission(emission.spec, emission.output, timing)
    record.on_emit(emission)


class EngineContext:
    """The ``LoopContext`` the engine hands each loop."""

    def __init__(self, control: LoopControl, record: LoopRecord) -> None:
        self._control = control
        self._record = record
        self.loop_id = record.loop_id
        self.priority = record.priority

    async def execute(self, plan: WorkPlan) -> StepResult:
        return await self._control.submit_plan(self._record, plan)

    def emit(self, emission: Emission) -> None:
        """Hand ``emission`` to the sink now, or - if its output is a ``PendingOutput`` or an
        earlier one is still pending - once that output is ready, keeping plan order."""
        record = self._record
        if record.emit_error is not None:
            raise record.emit_error
        tail = record.emit_tail
        if not isinstance(emission.output, PendingOutput) and (tail is None or tail.done()):
            _deliver(record, emission)
            return
        record.emit_tail = asyncio.get_running_loop().create_task(
            _emit_in_order(record, tail, emission), name=f"dreamrt-emit-{record.loop_id}"
        )

    def take_inputs(self) -> list[InputEvent]:
        inputs = list(self._record.inputs)
        self._record.inputs.clear()
        return inputs


async def _emit_in_order(
    record: LoopRecord, before: asyncio.Task[None] | None, emission: Emission
) -> None:
    """After ``before`` (the loop's previous deferred emission), resolve and deliver."""
    if before is not None:
        await asyncio.wait({before})
    if record.emit_error is not None:
        return
    try:
        if isinstance(emission.output, PendingOutput):
            output = await asyncio.to_thread(emission.output.result)
            emission = Emission(emission.spec, output)
        _deliver(record, emission)
    except Exception as exc:  # the loop fails with "emit_failed" at its next emission or end
        logger.exception(
            "loop %s: deferred emission on %r failed", record.loop_id, emission.spec.stream
        )
        record.emit_error = exc


class LoopHandle:
    """The server's grip on one spawned loop. All methods must be called on the event loop."""

    def __init__(self, control: LoopControl, record: LoopRecord) -> None:
        self._control = control
        self._record = record

    @property
    def loop_id(self) -> str:
        return self._record.loop_id

    @property
    def done(self) -> bool:
        return self._record.done

    @property
    def state_name(self) -> str:
        """``"running"``, ``"succeeded"``, ``"failed"`` or ``"cancelled"``."""
        return self._record.status.value

    @property
    def paused(self) -> bool:
        return self._record.paused

    def push_input(self, event: InputEvent) -> None:
        """Queue a live input; the loop gets it through ``ctx.take_inputs()`` at its next
        step boundary (at once if its plan was still queued and the engine withdraws it).
        Inputs for a finished loop are dropped."""
        if self.done:
            logger.debug(
                "loop %s is %s; input %s/%d dropped",
                self.loop_id,
                self.state_name,
                event.kind,
                event.seq,
            )
            return
        self._record.inputs.append(event)
        self._record.trace.pushed(event.seq)
        self._control.inputs_arrived(self._record)

    def cancel(self, reason: str = "cancelled") -> None:
        """Lands at the next step boundary; ``result()`` then raises ``Cancelled``. Idempotent."""
        self._control.cancel_loop(self._record, reason)

    def pause(self) -> None:
        """Its plans stay queued and are not picked until ``resume``."""
        self._control.set_loop_paused(self._record, True)

    def resume(self) -> None:
        self._control.set_loop_paused(self._record, False)

    def set_media_t0(self, t0_s: float) -> None:
        """Re-anchor realtime deadlines (viewer connected or resumed), engine clock seconds."""
        self._control.set_loop_media_t0(self._record, t0_s)

    async def result(self) -> LoopResult:
        """The loop's ``LoopResult``; raises ``Cancelled`` or ``LoopFailed``."""
        await self._record.finished.wait()
        if self._record.error is not None:
            raise self._record.error
        if self._record.result is None:
            raise LoopFailed(self.loop_id, "internal", "loop finished without a result")
        return self._record.result

    async def snapshot(self) -> bytes:
        """The loop state at a step boundary: at once if its next plan is still queued (it
        has not run, so the state is the one that plan was described from), else at the next
        boundary. Raises ``LoopStatusError`` if the loop has ended or ends first."""
        return await self._record.snapshot()
