"""One spawned loop as the engine tracks it (``LoopRecord``), as the loop sees the runtime
(``EngineContext``) and as the server grips it (``LoopHandle``).

Loop status is a state machine: ``running -> succeeded | failed | cancelled`` (terminal); the
engine moves it through ``LoopRecord.transition``. Pausing is a flag, not a status: a paused
loop is still running, its plans just are not picked. A *hold* (``LoopHandle.hold``) is a second
flag of the same effect that only its owner lifts (a weight sync, a sleeping model): a session
resuming for its viewer does not undo it. Releasing a hold withdraws the plan it left queued, so
the loop describes it again from the model as it is now (new weights, a woken component).

Everything here runs on the event loop; the handle delegates every action to the engine
through the ``LoopControl`` protocol (the engine implements it).

**Boundary calls** (``LoopHandle.at_boundary``) run a function on the loop's state at a step
boundary, synchronously, so nothing of the loop moves while it runs: snapshots for replay clone
the state there, a fork builds its candidates there. ``after_chunk`` waits for a *chunk
boundary*: the first boundary after a plan that emitted a chunk's final media (a fresh loop
stands at one before its first plan). The state a call sees is also consistent while the loop's
next plan is queued but not started (``next`` runs no kernels), so a call runs at once then.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from runtime.driver import Driver, DriverPhase
from runtime.emissions import Emission, Stream
from runtime.input_trace import InputTrace
from runtime.live_inputs import InputEvent
from runtime.loop_failures import Cancelled, LoopFailed, PlanWithdrawn
from runtime.loop_protocol import Loop, LoopResult, LoopState
from runtime.plans import PendingOutput, Priority, StepResult, WorkPlan
from runtime.scheduler import ends_chunk
from runtime.snapshot import resolve_state_type

__all__ = [
    "BoundaryCall",
    "EngineContext",
    "LoopControl",
    "LoopHandle",
    "LoopRecord",
    "LoopStatus",
    "LoopStatusError",
]

T = TypeVar("T")

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
class BoundaryCall(Generic[T]):
    """``fn(state)`` to run at the next (chunk) boundary; its result resolves ``future``."""

    fn: Callable[[LoopState], T]
    future: asyncio.Future[T]
    after_chunk: bool

    def run(self, state: LoopState) -> None:
        if self.future.done():
            return
        try:
            self.future.set_result(self.fn(state))
        except Exception as exc:
            self.future.set_exception(exc)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


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
    held: bool = False  # stopped by its hold's owner, whatever ``paused`` says
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
    # each call's result type is its caller's (``LoopHandle.at_boundary``): unknown here
    boundary_calls: list[BoundaryCall[Any]] = field(default_factory=list)
    chunk_ended: bool = True  # no plan ran since a chunk's final media (or since the start)
    plan_follows_chunk: bool = False  # the plan now queued was described at a chunk boundary
    chunks_out: int = 0  # plans that ended a chunk (its final media) and ran
    # input log: called with (state.step, inputs) each time the loop is handed inputs
    on_inputs: Callable[[int, list[InputEvent]], None] | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @property
    def stopped(self) -> bool:
        """Its plans are not picked: paused or held."""
        return self.paused or self.held

    def on_boundary(self, driver: Driver[Any]) -> None:
        """The driver's step-boundary hook: cancellation lands here, pending snapshots are taken."""
        if self.cancel_reason is not None:
            raise Cancelled(self.loop_id, self.cancel_reason)
        if self.snapshot_waiters:
            self.serve_snapshots(driver.snapshot)
        if self.boundary_calls:
            due = [c for c in self.boundary_calls if self.chunk_ended or not c.after_chunk]
            self.boundary_calls = [c for c in self.boundary_calls if c not in due]
            for call in due:
                call.run(driver.state)

    def state_at_boundary(self, after_chunk: bool) -> LoopState | None:
        """The state if it stands at a (chunk) boundary now (or its next plan is still queued,
        so it is the state that plan was described from), else ``None``."""
        if self.done or self.driver is None:
            raise LoopStatusError(
                f"boundary call on loop {self.loop_id!r}, which is {self.status.value}"
            )
        phase = self.driver.phase
        at_boundary = phase is DriverPhase.BOUNDARY and (self.chunk_ended or not after_chunk)
        queued = self.queued_plan is not None and phase is DriverPhase.EXECUTING
        if at_boundary or (queued and (self.plan_follows_chunk or not after_chunk)):
            state: LoopState = self.driver.state
            return state
        return None

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
        for call in self.boundary_calls:
            call.fail(error)
        self.boundary_calls.clear()

    def release_state(self) -> None:
        """At the loop's end: its handle outlives it with the owner (a job stays listed long
        after it ended), so the record keeps the result and status and lets the loop's state
        go (the driver holds the latents, chunk-KV views, the rollout and its last plan; the
        traceback of the error it ended with holds the driver's frames)."""
        self.driver = None
        self.inputs.clear()
        self.on_inputs = None
        error, seen = self.error, set()
        while error is not None and id(error) not in seen:  # the error, its cause, its context
            seen.add(id(error))
            error.__traceback__ = None
            error = error.__cause__ or error.__context__

    def transition(self, new: LoopStatus) -> None:
        old = self.status
        if new not in _ALLOWED[old]:
            raise LoopStatusError(f"loop {self.loop_id!r} cannot go {old.value!r} -> {new.value!r}")
        self.status = new
        detail = "" if self.error is None else f" ({self.error})"
        logger.info("loop %s: %s -> %s%s", self.loop_id, old.value, new.value, detail)


class LoopControl(Protocol):
    """What the engine offers handles and contexts (implemented by ``runtime.engine.Engine``,
    in its mixin ``runtime.engine_plans.EnginePlans``)."""

    async def submit_plan(self, record: LoopRecord, plan: WorkPlan) -> StepResult: ...

    def cancel_loop(self, record: LoopRecord, reason: str) -> None: ...

    def set_loop_paused(self, record: LoopRecord, paused: bool, *, hold: bool = False) -> None: ...

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
        record = self._record
        record.plan_follows_chunk, record.chunk_ended = record.chunk_ended, False
        try:
            return await self._control.submit_plan(record, plan)
        except PlanWithdrawn:  # it never ran: the state stands where the plan was described
            record.chunk_ended = record.plan_follows_chunk
            raise

    def emit(self, emission: Emission) -> None:
        """Hand ``emission`` to the sink now, or - if its output is a ``PendingOutput`` or an
        earlier one is still pending - once that output is ready, keeping plan order."""
        record = self._record
        if record.emit_error is not None:
            raise record.emit_error
        if ends_chunk((emission.spec,)):
            record.chunk_ended = True
        tail = record.emit_tail
        if not isinstance(emission.output, PendingOutput) and (tail is None or tail.done()):
            _deliver(record, emission)
            return
        record.emit_tail = asyncio.get_running_loop().create_task(
            _emit_in_order(record, tail, emission), name=f"dreamrt-emit-{record.loop_id}"
        )

    def take_inputs(self) -> list[InputEvent]:
        record = self._record
        inputs = list(record.inputs)
        record.inputs.clear()
        if inputs and record.on_inputs is not None and record.driver is not None:
            try:
                record.on_inputs(record.driver.state.step, inputs)
            except Exception:  # a broken log never breaks the loop
                logger.exception("loop %s: input log failed", record.loop_id)
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

    @property
    def pending_inputs(self) -> int:
        """Inputs pushed that the loop has not taken yet (a paused loop takes none)."""
        return len(self._record.inputs)

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

    @property
    def held(self) -> bool:
        return self._record.held

    def hold(self) -> None:
        """Stop picking its plans until ``release``, whatever ``pause``/``resume`` do
        meanwhile. Call it at a boundary (``at_boundary``) for a loop that stops there."""
        self._control.set_loop_paused(self._record, True, hold=True)

    def release(self) -> None:
        """Lift the hold: a plan left queued is withdrawn (described again), and the loop
        runs unless it is paused. Idempotent."""
        self._control.set_loop_paused(self._record, False, hold=True)

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

    def at_boundary(
        self, fn: Callable[[LoopState], T], *, after_chunk: bool = False, advance: bool = False
    ) -> asyncio.Future[T]:
        """``fn(state)`` at the loop's next step boundary (``after_chunk``: chunk boundary), at
        once when the state stands at one; -> a future of its result (or its exception).
        Registered when called, so a call from an emission callback lands on the boundary
        right after that emission. ``fn`` runs on the event loop and must not keep ``state``'s
        tensors beyond copying them. ``advance``: a paused loop runs until that boundary and
        is paused again there (before ``fn``). The future fails with ``LoopStatusError`` if the
        loop has ended or ends first."""
        record = self._record
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            if (state := record.state_at_boundary(after_chunk)) is not None:
                future.set_result(fn(state))
                return future
        except Exception as exc:
            future.set_exception(exc)
            return future
        call_fn = fn
        if advance and record.paused:

            def call_fn(state: LoopState) -> T:
                self._control.set_loop_paused(record, True)
                return fn(state)

            self._control.set_loop_paused(record, False)
        record.boundary_calls.append(BoundaryCall(call_fn, future, after_chunk))
        return future

    def set_sink(self, on_emit: Callable[[Emission], None]) -> None:
        """Deliver the loop's emissions from now on to ``on_emit`` (a chosen fork candidate's
        loop continues its parent's stream). Call it at a chunk boundary."""
        self._record.on_emit = on_emit

    def set_input_log(self, on_inputs: Callable[[int, list[InputEvent]], None] | None) -> None:
        """``on_inputs(step, inputs)`` whenever the loop is handed inputs at a boundary whose
        state has completed ``step`` plans: with a snapshot, enough to replay the loop."""
        self._record.on_inputs = on_inputs


def build_driver(
    loop: Loop[Any],
    ctx: EngineContext,
    model: Any,
    request: object,
    on_boundary: Callable[[Driver[Any]], None],
    *,
    restore_from: bytes | None = None,
    state_type: type[LoopState] | None = None,
    fork_from: LoopState | None = None,
) -> Driver[Any]:
    """The driver of a spawned loop: fresh (``init`` runs when it starts), restored from a
    snapshot, or forked (``loop.fork(state, request, model)``: a continuation of another loop's
    live state as a new stream, made at once; the loop decides what a fork copies)."""
    if fork_from is not None:
        fork = getattr(loop, "fork", None)
        if fork is None:
            raise LoopStatusError(f"loop {loop.name!r} cannot fork (it has no fork method)")
        state = fork(fork_from, request, model)
        return Driver.from_state(loop, ctx, state, on_boundary=on_boundary)
    if restore_from is None:
        return Driver(loop, ctx, on_boundary=on_boundary)
    tp = resolve_state_type(loop, restore_from, state_type)
    return Driver.from_snapshot(
        loop,
        ctx,
        restore_from,
        tp,
        device=getattr(model, "device", None),
        on_boundary=on_boundary,
    )
