"""The engine: schedule -> execute -> update (ARCHITECTURE.md §4, vLLM v1's engine/scheduler split).

::

    loop driver (coroutine)          scheduling task (asyncio)          executor thread
    ctx.execute(plan) ─ Ticket ──►   scheduler.pick(now) ─ ExecJob ──►  op(args), observers,
         ▲                                                              failure isolation
         └── future resolved ◄── _on_batch_done ◄── call_soon_threadsafe ──┘

- One asyncio task picks batches; one executor thread runs them; one batch is in flight at a
  time, so plans are preempted only at step boundaries. The event loop never runs an op.
- **Deadlines** (realtime loops): ``deadline_s = media_t0_s + plan.due_media_s +
  playout_buffer_s - sum(predicted cost of plan.followups)``, eligible from ``deadline_s -
  max_lead_s`` (lead limit). ``media_t0_s`` is on the engine clock (``time.monotonic`` by
  default); it defaults to the clock at ``spawn`` and moves with ``LoopHandle.set_media_t0``.
  Batch loops and plans without ``due_media_s`` have no deadline. A late plan still runs and
  is counted (``EngineStats.deadline_misses``, ``AdmissionController.record_deadline``).
- **Batching key** is the plan's ``batch_key`` plus the op object's identity: only plans that
  name the same op object run as one call.
- **Cancellation** (``LoopHandle.cancel``) drops the loop's queued plans at once; a plan that is
  executing finishes and its result is discarded; the driver sees ``Cancelled`` at that step
  boundary. On every loop end (succeeded, failed, cancelled) the engine releases the loop's
  admission reservation (if ``spawn`` got one) and forgets its queued plans.
- **Failure isolation** is the executor's (see ``runtime.executor``): one failing plan fails
  only its own loop with ``LoopFailed(code, message)``; other loops continue.
- ``plan.loop_id`` is informational: the context a plan was executed through decides which
  loop it belongs to (a restored or forked state may carry its origin's id).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.admission import AdmissionController
from runtime.contract import (
    Cancelled,
    Emission,
    InputEvent,
    Loop,
    LoopFailed,
    LoopResult,
    LoopState,
    Priority,
    StepResult,
    WorkPlan,
)
from runtime.cost import CostModel
from runtime.driver import Driver, DriverPhase, snapshot_type_name
from runtime.executor import ExecJob, Executor, JobOutcome
from runtime.observers import BatchInfo, Observer
from runtime.scheduler import Batch, Scheduler, Ticket

__all__ = ["Engine", "EngineError", "EngineState", "EngineStats", "LoopHandle", "LoopStatus"]

logger = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """Engine misuse: spawning before start or after close, duplicate loop ids, snapshots of
    finished loops, an unresolvable snapshot state type."""


class EngineState(str, enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class LoopStatus(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ENGINE_ALLOWED = {
    EngineState.CREATED: frozenset({EngineState.RUNNING, EngineState.CLOSED}),
    EngineState.RUNNING: frozenset({EngineState.CLOSING}),
    EngineState.CLOSING: frozenset({EngineState.CLOSED}),
    EngineState.CLOSED: frozenset(),
}
_LOOP_TERMINAL = frozenset({LoopStatus.SUCCEEDED, LoopStatus.FAILED, LoopStatus.CANCELLED})
_LOOP_ALLOWED = {
    LoopStatus.RUNNING: _LOOP_TERMINAL,
    LoopStatus.SUCCEEDED: frozenset(),
    LoopStatus.FAILED: frozenset(),
    LoopStatus.CANCELLED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since start. ``latency_samples_s``: per plan kind, recent batch wall times."""

    queue_depth: int
    running_loops: int
    paused_loops: int
    executing: bool
    plans_executed: int
    batches_executed: int
    deadline_misses: int
    deadlines_met: int
    loops_succeeded: int
    loops_failed: int
    loops_cancelled: int
    latency_samples_s: Mapping[str, tuple[float, ...]]


@dataclass(slots=True)
class _LoopRecord:
    loop_id: str
    priority: Priority
    on_emit: Callable[[Emission], None]
    media_t0_s: float
    reservation_id: str | None
    driver: Driver[Any] | None = None
    task: asyncio.Task[None] | None = None
    status: LoopStatus = LoopStatus.RUNNING
    paused: bool = False
    cancel_reason: str | None = None
    queued_plan: int | None = None
    executing_plan: int | None = None
    inputs: deque[InputEvent] = field(default_factory=deque)
    snapshot_waiters: list[asyncio.Future[bytes]] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    result: LoopResult | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _PlanEntry:
    plan_id: int
    record: _LoopRecord
    plan: WorkPlan
    future: asyncio.Future[StepResult]
    deadline_s: float | None


class _EngineContext:
    """The ``LoopContext`` the engine hands each loop."""

    def __init__(self, engine: Engine, record: _LoopRecord) -> None:
        self._engine = engine
        self._record = record
        self.loop_id = record.loop_id
        self.priority = record.priority

    async def execute(self, plan: WorkPlan) -> StepResult:
        return await self._engine._submit(self._record, plan)

    def emit(self, emission: Emission) -> None:
        self._record.on_emit(emission)

    def take_inputs(self) -> list[InputEvent]:
        inputs = list(self._record.inputs)
        self._record.inputs.clear()
        return inputs


class LoopHandle:
    """The server's grip on one spawned loop. All methods must be called on the event loop."""

    def __init__(self, engine: Engine, record: _LoopRecord) -> None:
        self._engine = engine
        self._record = record

    @property
    def loop_id(self) -> str:
        return self._record.loop_id

    @property
    def done(self) -> bool:
        return self._record.status in _LOOP_TERMINAL

    @property
    def state_name(self) -> str:
        """``"running"``, ``"succeeded"``, ``"failed"`` or ``"cancelled"``."""
        return self._record.status.value

    @property
    def paused(self) -> bool:
        return self._record.paused

    def push_input(self, event: InputEvent) -> None:
        """Queue a live input; the loop gets it through ``ctx.take_inputs()`` at its next
        step boundary. Inputs for a finished loop are dropped."""
        if self.done:
            logger.debug("loop %s is %s; input %s/%d dropped", self.loop_id, self.state_name, event.kind, event.seq)
            return
        self._record.inputs.append(event)

    def cancel(self, reason: str = "cancelled") -> None:
        """Lands at the next step boundary; ``result()`` then raises ``Cancelled``. Idempotent."""
        self._engine._cancel(self._record, reason)

    def pause(self) -> None:
        """Its plans stay queued and are not picked until ``resume``."""
        self._engine._set_paused(self._record, True)

    def resume(self) -> None:
        self._engine._set_paused(self._record, False)

    def set_media_t0(self, t0_s: float) -> None:
        """Re-anchor realtime deadlines (viewer connected or resumed), engine clock seconds."""
        self._engine._set_media_t0(self._record, t0_s)

    async def result(self) -> LoopResult:
        """The loop's ``LoopResult``; raises ``Cancelled`` or ``LoopFailed``."""
        await self._record.finished.wait()
        if self._record.error is not None:
            raise self._record.error
        if self._record.result is None:
            raise EngineError(f"loop {self.loop_id!r} finished without a result")
        return self._record.result

    async def snapshot(self) -> bytes:
        """The loop state at a step boundary: at once if its next plan is still queued (it
        has not run, so the state is the one that plan was described from), else at the next
        boundary. Raises ``EngineError`` if the loop ends first."""
        return await self._engine._snapshot(self._record)


class Engine:
    """Runs loops: admits nothing itself (``admission`` is the server's gate), schedules their
    plans, executes them on one thread, feeds results back. See the module docstring."""

    def __init__(
        self,
        *,
        cost: CostModel,
        admission: AdmissionController | None = None,
        max_batch: int = 8,
        deterministic: bool = False,
        playout_buffer_s: float = 0.25,
        max_lead_s: float = 1.0,
        max_batch_wait_s: float = 2.0,
        observers: Sequence[Observer] = (),
        clock: Callable[[], float] = time.monotonic,
        latency_samples_per_kind: int = 512,
    ) -> None:
        if max_lead_s < 0 or playout_buffer_s < 0:
            raise EngineError(f"max_lead_s={max_lead_s} and playout_buffer_s={playout_buffer_s} must be >= 0")
        self.cost = cost
        self.admission = admission
        self.deterministic = deterministic
        self.playout_buffer_s = playout_buffer_s
        self.max_lead_s = max_lead_s
        self.scheduler = Scheduler(max_batch=max_batch, max_batch_wait_s=max_batch_wait_s)
        self.executor = Executor(observers=observers, deterministic=deterministic, clock=clock)
        self._clock = clock
        self._state = EngineState.CREATED
        self._loops: dict[str, _LoopRecord] = {}
        self._plans: dict[int, _PlanEntry] = {}
        self._next_plan_id = 0
        self._in_flight: Batch | None = None
        self._wake: asyncio.Event | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self._latency: dict[str, deque[float]] = {}
        self._latency_maxlen = latency_samples_per_kind
        self._counts = {
            "plans": 0, "batches": 0, "missed": 0, "met": 0,
            LoopStatus.SUCCEEDED: 0, LoopStatus.FAILED: 0, LoopStatus.CANCELLED: 0,
        }

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self._state

    async def start(self) -> None:
        """Start the scheduling task and the executor thread."""
        self._transition(EngineState.RUNNING)
        self._aloop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.executor.start(self._deliver)
        self._scheduler_task = asyncio.create_task(self._run_scheduler(), name="dreamrt-scheduler")

    async def close(self) -> None:
        """Cancel every loop, wait for them, stop the scheduler task and join the executor
        thread. Idempotent; nothing of the engine is left running afterwards."""
        if self._state is EngineState.CREATED:
            self._transition(EngineState.CLOSED)
            return
        if self._state is not EngineState.RUNNING:
            while self._state is not EngineState.CLOSED:
                await asyncio.sleep(0.005)
            return
        self._transition(EngineState.CLOSING)
        records = list(self._loops.values())
        for record in records:
            self._cancel(record, "engine_closed")
        tasks = [r.task for r in records if r.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._poke()
        if self._scheduler_task is not None:
            await asyncio.gather(self._scheduler_task, return_exceptions=True)
        self.executor.stop()
        while self.executor.is_alive():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)  # run a completion callback the executor posted last
        self._transition(EngineState.CLOSED)

    # -- loops ------------------------------------------------------------------------------

    def spawn(
        self,
        loop: Loop[Any],
        request: Any,
        model: Any,
        *,
        loop_id: str,
        priority: Priority,
        on_emit: Callable[[Emission], None],
        media_t0_s: float | None = None,
        reservation_id: str | None = None,
        restore_from: bytes | None = None,
        state_type: type[LoopState] | None = None,
    ) -> LoopHandle:
        """Start driving ``loop``. With ``restore_from`` the loop continues from that snapshot
        (``init`` is not called); its state type is ``state_type``, else ``loop.state_type``,
        else the type recorded in the snapshot if its module is already imported.
        If this returns, the engine owns ``reservation_id`` and releases it when the loop ends.
        """
        if self._state is not EngineState.RUNNING:
            raise EngineError(f"spawn of loop {loop_id!r} needs a running engine, engine is {self._state.value!r}")
        if loop_id in self._loops:
            raise EngineError(f"loop {loop_id!r} is already running")
        record = _LoopRecord(
            loop_id=loop_id,
            priority=Priority(priority),
            on_emit=on_emit,
            media_t0_s=self._clock() if media_t0_s is None else media_t0_s,
            reservation_id=reservation_id,
        )
        ctx = _EngineContext(self, record)
        hook = functools.partial(self._on_boundary, record)
        if restore_from is None:
            record.driver = Driver(loop, ctx, on_boundary=hook)
        else:
            tp = _resolve_state_type(loop, restore_from, state_type)
            device = getattr(model, "device", None)
            record.driver = Driver.from_snapshot(loop, ctx, restore_from, tp, device=device, on_boundary=hook)
        self._loops[loop_id] = record
        record.task = asyncio.create_task(self._drive(record, request, model), name=f"dreamrt-loop-{loop_id}")
        return LoopHandle(self, record)

    def handle(self, loop_id: str) -> LoopHandle | None:
        record = self._loops.get(loop_id)
        return None if record is None else LoopHandle(self, record)

    def stats(self) -> EngineStats:
        records = self._loops.values()
        counts = self._counts
        return EngineStats(
            queue_depth=self.scheduler.depth(),
            running_loops=sum(1 for r in records if r.status is LoopStatus.RUNNING),
            paused_loops=sum(1 for r in records if r.paused),
            executing=self._in_flight is not None,
            plans_executed=counts["plans"],
            batches_executed=counts["batches"],
            deadline_misses=counts["missed"],
            deadlines_met=counts["met"],
            loops_succeeded=counts[LoopStatus.SUCCEEDED],
            loops_failed=counts[LoopStatus.FAILED],
            loops_cancelled=counts[LoopStatus.CANCELLED],
            latency_samples_s={kind: tuple(s) for kind, s in sorted(self._latency.items())},
        )

    # -- driving ----------------------------------------------------------------------------

    async def _drive(self, record: _LoopRecord, request: Any, model: Any) -> None:
        status = LoopStatus.FAILED
        try:
            record.result = await record.driver.run(request, model)  # type: ignore[union-attr]
            status = LoopStatus.SUCCEEDED
        except Cancelled as exc:
            record.error, status = exc, LoopStatus.CANCELLED
        except LoopFailed as exc:
            record.error = exc
        except asyncio.CancelledError:
            record.error = Cancelled(record.loop_id, record.cancel_reason or "engine_closed")
            status = LoopStatus.CANCELLED
        except Exception as exc:
            logger.exception("loop %s: driver crashed", record.loop_id)
            record.error = LoopFailed(record.loop_id, "internal", f"{type(exc).__name__}: {exc}")
        finally:
            self._finish(record, status)

    def _finish(self, record: _LoopRecord, status: LoopStatus) -> None:
        self._drop_queued(record, Cancelled(record.loop_id, record.cancel_reason or "loop_ended"))
        if record.reservation_id is not None and self.admission is not None:
            self.admission.release(record.reservation_id)
        self._loop_transition(record, status)
        self._counts[status] += 1
        for waiter in record.snapshot_waiters:
            if not waiter.done():
                waiter.set_exception(EngineError(f"loop {record.loop_id!r} ended ({status.value}) before a step boundary"))
        record.snapshot_waiters.clear()
        if self._loops.get(record.loop_id) is record:
            del self._loops[record.loop_id]
        record.finished.set()

    def _on_boundary(self, record: _LoopRecord, driver: Driver[Any]) -> None:
        if record.cancel_reason is not None:
            raise Cancelled(record.loop_id, record.cancel_reason)
        if record.snapshot_waiters:
            self._serve_snapshots(record, driver.snapshot)

    async def _snapshot(self, record: _LoopRecord) -> bytes:
        if record.status in _LOOP_TERMINAL or record.driver is None:
            raise EngineError(f"snapshot of loop {record.loop_id!r}, which is {record.status.value}")
        driver = record.driver
        if driver.phase is DriverPhase.BOUNDARY:
            return driver.snapshot()
        if record.queued_plan is not None and driver.phase is DriverPhase.EXECUTING:
            return driver.snapshot_pending()
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        record.snapshot_waiters.append(waiter)
        return await waiter

    @staticmethod
    def _serve_snapshots(record: _LoopRecord, take: Callable[[], bytes]) -> None:
        try:
            blob: bytes | None = take()
            error: BaseException | None = None
        except Exception as exc:
            blob, error = None, exc
        for waiter in record.snapshot_waiters:
            if waiter.done():
                continue
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(blob)  # type: ignore[arg-type]
        record.snapshot_waiters.clear()

    # -- plans ------------------------------------------------------------------------------

    async def _submit(self, record: _LoopRecord, plan: WorkPlan) -> StepResult:
        if record.cancel_reason is not None:
            raise Cancelled(record.loop_id, record.cancel_reason)
        if self._state is not EngineState.RUNNING:
            raise Cancelled(record.loop_id, "engine_closed")
        now_s = self._clock()
        deadline_s, eligible_s = self._timing(record, plan, now_s)
        plan_id = self._next_plan_id
        self._next_plan_id += 1
        future: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()
        self._plans[plan_id] = _PlanEntry(plan_id, record, plan, future, deadline_s)
        self.scheduler.submit(
            Ticket(
                plan_id=plan_id,
                loop_id=record.loop_id,
                priority=record.priority,
                batch_key=(*plan.batch_key, f"op@{id(plan.op):x}"),
                batchable=bool(getattr(plan.op, "batchable", False)),
                deadline_s=deadline_s,
                cost_gpu_s=self.cost.predict(plan.kind, plan.shape_sig, plan.flops, plan.bytes_moved),
                enqueued_s=now_s,
                eligible_s=eligible_s,
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

    def _timing(self, record: _LoopRecord, plan: WorkPlan, now_s: float) -> tuple[float | None, float]:
        if record.priority is not Priority.REALTIME or plan.due_media_s is None:
            return None, now_s
        followups_s = sum(self.cost.predict(f.kind, f.shape_sig, f.flops) for f in plan.followups)
        deadline_s = record.media_t0_s + plan.due_media_s + self.playout_buffer_s - followups_s
        return deadline_s, deadline_s - self.max_lead_s

    def _drop_queued(self, record: _LoopRecord, error: BaseException | None) -> None:
        for plan_id in self.scheduler.drop_loop(record.loop_id):
            entry = self._plans.pop(plan_id)
            if error is not None and not entry.future.done():
                entry.future.set_exception(error)
        record.queued_plan = None

    def _cancel(self, record: _LoopRecord, reason: str) -> None:
        if record.status is not LoopStatus.RUNNING or record.cancel_reason is not None:
            return
        record.cancel_reason = reason
        logger.info("loop %s: cancel requested (%s)", record.loop_id, reason)
        self._drop_queued(record, Cancelled(record.loop_id, reason))
        self._poke()

    def _set_paused(self, record: _LoopRecord, paused: bool) -> None:
        if record.status is not LoopStatus.RUNNING or record.paused == paused:
            return
        record.paused = paused
        if paused:
            self.scheduler.pause_loop(record.loop_id)
        else:
            self.scheduler.resume_loop(record.loop_id)
            self._poke()

    def _set_media_t0(self, record: _LoopRecord, t0_s: float) -> None:
        record.media_t0_s = t0_s
        if record.queued_plan is not None:
            entry = self._plans[record.queued_plan]
            entry.deadline_s, eligible_s = self._timing(record, entry.plan, self._clock())
            self.scheduler.update(entry.plan_id, deadline_s=entry.deadline_s, eligible_s=eligible_s)
            self._poke()

    # -- schedule -> execute -> update ------------------------------------------------------

    async def _run_scheduler(self) -> None:
        wake = self._wake
        try:
            while self._state is EngineState.RUNNING:
                wake.clear()  # type: ignore[union-attr]
                timeout_s = None
                if self._in_flight is None:
                    now_s = self._clock()
                    batch = self.scheduler.pick(now_s)
                    if batch is not None:
                        self._dispatch(batch)
                        continue
                    next_s = self.scheduler.next_event_s(now_s)
                    if next_s is not None:
                        timeout_s = max(0.0, next_s - now_s)
                await _wait(wake, timeout_s)  # type: ignore[arg-type]
        except Exception as exc:
            logger.exception("scheduler task crashed; failing every loop")
            for record in list(self._loops.values()):
                for plan_id in self.scheduler.drop_loop(record.loop_id):
                    entry = self._plans.pop(plan_id)
                    if not entry.future.done():
                        entry.future.set_exception(LoopFailed(record.loop_id, "internal", f"scheduler crashed: {exc}"))
        finally:
            logger.debug("scheduler task exits")

    def _dispatch(self, batch: Batch) -> None:
        entries = [self._plans[plan_id] for plan_id in batch.plan_ids]
        for entry in entries:
            entry.record.queued_plan = None
            entry.record.executing_plan = entry.plan_id
        head = entries[0].plan
        info = BatchInfo(
            batch_id=batch.batch_id,
            kind=head.kind.value,
            shape_sig=head.shape_sig,
            instance_id=head.instance_id,
            op_name=getattr(head.op, "name", type(head.op).__name__),
            plan_ids=batch.plan_ids,
            loop_ids=batch.loop_ids,
            flops=sum(e.plan.flops for e in entries),
            bytes_moved=sum(e.plan.bytes_moved for e in entries),
            deterministic=self.deterministic,
        )
        self._in_flight = batch
        self.executor.submit(
            ExecJob(
                info=info,
                op=head.op,
                args=tuple(e.plan.args for e in entries),
                plan_flops=tuple(e.plan.flops for e in entries),
                plan_bytes=tuple(e.plan.bytes_moved for e in entries),
            )
        )

    def _deliver(self, job: ExecJob, outcome: JobOutcome) -> None:
        """Executor thread -> event loop."""
        aloop = self._aloop
        if aloop is not None and not aloop.is_closed():
            aloop.call_soon_threadsafe(self._on_batch_done, job, outcome)

    def _on_batch_done(self, job: ExecJob, outcome: JobOutcome) -> None:
        info = job.info
        self.scheduler.complete(info.batch_id)
        self._in_flight = None
        self._counts["batches"] += 1
        samples = self._latency.get(info.kind)
        if samples is None:
            samples = self._latency[info.kind] = deque(maxlen=self._latency_maxlen)
        samples.append(outcome.wall_s)
        for plan_id, result in zip(info.plan_ids, outcome.plans, strict=True):
            entry = self._plans.pop(plan_id, None)
            if entry is None:
                continue
            record = entry.record
            if record.executing_plan == plan_id:
                record.executing_plan = None
            if result.failure is None:
                self._counts["plans"] += 1
                if entry.deadline_s is not None:
                    self._record_deadline(missed=outcome.finished_s > entry.deadline_s)
            if entry.future.done():
                continue
            if record.cancel_reason is not None:
                entry.future.set_exception(Cancelled(record.loop_id, record.cancel_reason))
            elif result.failure is not None:
                code, message = result.failure
                entry.future.set_exception(LoopFailed(record.loop_id, code, message))
            else:
                entry.future.set_result(
                    StepResult(result.output, result.wall_s, result.device_s, result.batch_size)
                )
        self._poke()

    def _record_deadline(self, *, missed: bool) -> None:
        self._counts["missed" if missed else "met"] += 1
        if self.admission is not None:
            self.admission.record_deadline(missed=missed)

    # -- internals --------------------------------------------------------------------------

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _transition(self, new: EngineState) -> None:
        old = self._state
        if new not in _ENGINE_ALLOWED[old]:
            raise EngineError(f"engine cannot go {old.value!r} -> {new.value!r}")
        self._state = new
        logger.info("engine: %s -> %s", old.value, new.value)

    def _loop_transition(self, record: _LoopRecord, new: LoopStatus) -> None:
        old = record.status
        if new not in _LOOP_ALLOWED[old]:
            raise EngineError(f"loop {record.loop_id!r} cannot go {old.value!r} -> {new.value!r}")
        record.status = new
        detail = "" if record.error is None else f" ({record.error})"
        logger.info("loop %s: %s -> %s%s", record.loop_id, old.value, new.value, detail)


async def _wait(event: asyncio.Event, timeout_s: float | None) -> None:
    if timeout_s is None:
        await event.wait()
        return
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass


def _resolve_state_type(loop: Any, blob: bytes, explicit: type[LoopState] | None) -> type[LoopState]:
    if explicit is not None:
        return explicit
    declared = getattr(loop, "state_type", None)
    if isinstance(declared, type) and issubclass(declared, LoopState):
        return declared
    name = snapshot_type_name(blob)
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type) and issubclass(obj, LoopState):
            return obj
    raise EngineError(
        f"cannot resolve snapshot state type {name!r}: pass state_type= to spawn or set loop.state_type"
    )
