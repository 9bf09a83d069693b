"""The engine: schedule -> execute -> update (docs/architecture.md §3; the split of vLLM v1's
engine and scheduler).

::

    loop driver (coroutine)          scheduling task (asyncio)          executor thread
    ctx.execute(plan) ─ Ticket ──►   scheduler.pick(now) ─ ExecJob ──►  op(args), observers,
         ▲                                                              failure isolation
         └── future resolved ◄── _on_batch_done ◄── call_soon_threadsafe ──┘

- One asyncio task picks batches; one executor thread runs them; one batch is in flight at a
  time, so plans are preempted only at step boundaries. The event loop never runs an op.
- **The scheduler is a policy object** (``runtime.scheduler.Scheduler``) given to the engine:
  step-level EDF (``runtime.step_edf.StepEdfScheduler``) by default, or a request-level
  baseline (``runtime.baseline_schedulers``); the engine loop does not change with it.
- **Deadlines** (``runtime.plan_timing``): a realtime plan's playout deadline is
  ``media_t0_s + plan.due_media_s + playout_buffer_s - sum(predicted cost of followups)``,
  eligible when the lead policy (``runtime.lead``) says; ``media_t0_s`` (engine clock) starts
  at ``spawn`` and moves with ``LoopHandle.set_media_t0``. A late plan still runs and is
  counted (``EngineStats.deadline_misses``). Admission (``AdmissionController.record_deadline``)
  learns only from the plans after a loop's first chunk: the first is due as its viewer
  connects and misses by construction (a session's first-frame latency is measured apart), so
  counting it would tighten admission right after a session starts.
- **Inputs** (``LoopHandle.push_input``) are timed by the loop's ``InputTrace`` (the
  ``applied`` emission carries its ``InputTiming``); with ``withdraw_on_input`` a queued plan
  is taken back (``PlanWithdrawn``): an input waits only for the plan actually executing.
- **Batching key**: the plan's ``batch_key`` plus the op object's identity (same op object).
- **Cancellation** (``LoopHandle.cancel``) drops the loop's queued plans at once; a plan that is
  executing finishes and its result is discarded; the driver sees ``Cancelled`` at that step
  boundary. On every loop end (succeeded, failed, cancelled) the engine releases the loop's
  admission reservation (if ``spawn`` got one) and forgets its queued plans.
- **Failure isolation** is the executor's (see ``runtime.executor``): one failing plan fails
  only its own loop with ``LoopFailed(code, message)``; other loops continue.
- **Deterministic mode** calls every op with ``deterministic=True``: the op must then return,
  for each entry of a batch, the bits it returns for that entry alone (run entries one by one
  or use batch-invariant kernels). Otherwise batched results match solo runs only within the
  op's numerical tolerance (the interleave gate states the one it checks).
- ``plan.loop_id`` is informational: the context a plan was executed through decides which
  loop it belongs to (a restored or forked state may carry its origin's id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from runtime.admission import AdmissionController
from runtime.cost import CostModel
from runtime.emissions import Emission
from runtime.engine_plans import EnginePlans, PlanEntry
from runtime.engine_state import EngineError, EngineState, check_engine_transition
from runtime.engine_stats import EngineCounters, EngineStats
from runtime.executor import ExecJob, Executor, JobOutcome
from runtime.input_trace import InputTrace, applied_seqs
from runtime.lead import AdaptiveLead, LeadPolicy
from runtime.loop_failures import Cancelled, LoopFailed
from runtime.loop_handle import (
    EngineContext,
    LoopHandle,
    LoopRecord,
    LoopStatus,
    LoopStatusError,
    build_driver,
)
from runtime.loop_protocol import Loop, LoopState
from runtime.observers import BatchListener, BatchReport, Observer
from runtime.plan_timing import PlanTiming
from runtime.plans import Priority, StepResult
from runtime.scheduler import Batch, PlayoutDeadlines, Scheduler, ends_chunk
from runtime.step_edf import StepEdfScheduler

__all__ = ["Engine", "EngineError", "EngineState", "EngineStats", "LoopHandle", "LoopStatus"]

logger = logging.getLogger(__name__)


class Engine(EnginePlans):
    """Runs loops: admits nothing itself (``admission`` is the server's gate), schedules their
    plans with ``scheduler`` (default: a new ``StepEdfScheduler()``; a scheduler serves one
    engine), executes them on one thread, feeds results back. ``observers`` run around each
    batch on the executor thread; ``listeners`` hear each finished batch on the event loop.
    The loops' plans (submit, withdraw, drop, retime: ``LoopControl``) are ``EnginePlans``
    (``runtime.engine_plans``). See the module docstring."""

    def __init__(
        self,
        *,
        cost: CostModel,
        scheduler: Scheduler | None = None,
        admission: AdmissionController | None = None,
        deterministic: bool = False,
        playout_buffer_s: float = 0.25,
        max_lead_s: float = 1.0,
        lead: LeadPolicy | None = None,
        withdraw_on_input: bool = True,
        observers: Sequence[Observer] = (),
        listeners: Sequence[BatchListener] = (),
        clock: Callable[[], float] = time.monotonic,
        latency_samples_per_kind: int = 512,
    ) -> None:
        self.cost = cost
        self.admission = admission
        self.deterministic = deterministic
        deadlines = PlayoutDeadlines(playout_buffer_s=playout_buffer_s, max_lead_s=max_lead_s)
        self.timing = PlanTiming(cost, deadlines, lead or AdaptiveLead(max_lead_s))
        self.withdraw_on_input = withdraw_on_input
        self.scheduler: Scheduler = StepEdfScheduler() if scheduler is None else scheduler
        self.executor = Executor(observers=observers, deterministic=deterministic, clock=clock)
        self._counters = EngineCounters(latency_samples_per_kind)
        self.listeners = (self._counters, *listeners)  # the engine's own counters hear first
        self._clock = clock
        self._state = EngineState.CREATED
        self._loops: dict[str, LoopRecord] = {}
        self._plans: dict[int, PlanEntry] = {}
        self._next_plan_id = 0
        self._in_flight: Batch | None = None
        self._wake: asyncio.Event | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self._closed: asyncio.Event | None = None  # set on CLOSED (a second close waits on it)
        self._executor_exited: asyncio.Event | None = None
        self._broken: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._state

    async def start(self) -> None:
        """Start the scheduling task and the executor thread."""
        self._transition(EngineState.RUNNING)
        self._aloop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._closed = asyncio.Event()
        self._executor_exited = asyncio.Event()
        self.executor.start(self._deliver, on_exit=self._signal_executor_exit)
        self._scheduler_task = asyncio.create_task(self._run_scheduler(), name="dreamrt-scheduler")

    async def close(self, *, timeout_s: float = 30.0) -> None:
        """Cancel every loop, wait for them, stop the scheduler task and join the executor
        thread. Idempotent. An op still running after ``timeout_s`` is abandoned (logged; its
        daemon thread cannot be interrupted); otherwise nothing of the engine is left running."""
        if self._state is EngineState.CREATED:
            self._transition(EngineState.CLOSED)
        if self._state is not EngineState.RUNNING:
            if self._closed is not None:  # started: the first close sets it when done
                await self._closed.wait()
            return
        self._transition(EngineState.CLOSING)
        records = list(self._loops.values())
        for record in records:
            self.cancel_loop(record, "engine_closed")
            self._drop_queued(record, Cancelled(record.loop_id, "engine_closed"))
        tasks = [r.task for r in records if r.task is not None]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout_s)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._poke()
        if self._scheduler_task is not None:
            await asyncio.gather(self._scheduler_task, return_exceptions=True)
        self.executor.stop()
        # The exit signal is posted after the executor's last delivery, so once it is seen
        # every completion callback has run.
        exited, closed = self._executor_exited, self._closed
        assert exited is not None and closed is not None  # made by start (the engine ran)
        try:
            await asyncio.wait_for(exited.wait(), timeout_s)
        except TimeoutError:
            logger.error("engine close: an op is still running after %.1f s; abandoned", timeout_s)
        self._transition(EngineState.CLOSED)
        closed.set()

    # -- loops ------------------------------------------------------------------------------
    def spawn(
        self,
        loop: Loop[Any],
        request: object,
        model: Any,
        *,
        loop_id: str,
        priority: Priority,
        on_emit: Callable[[Emission], None],
        media_t0_s: float | None = None,
        reservation_id: str | None = None,
        restore_from: bytes | None = None,
        state_type: type[LoopState] | None = None,
        fork_from: LoopState | None = None,
    ) -> LoopHandle:
        """Start driving ``loop``: fresh, from the snapshot ``restore_from`` (no ``init``; state
        type ``state_type``, else ``loop.state_type``, else the snapshot's if its module is
        imported), or from ``loop.fork(fork_from, request, model)`` (another loop's live state at
        a chunk boundary). If this returns, the engine owns ``reservation_id`` (released when the
        loop ends)."""
        if self._state is not EngineState.RUNNING:
            raise EngineError(
                f"spawn of loop {loop_id!r} needs a running engine, engine is {self._state.value!r}"
            )
        if loop_id in self._loops:
            raise EngineError(f"loop {loop_id!r} is already running")
        record = LoopRecord(
            loop_id=loop_id,
            priority=Priority(priority),
            on_emit=on_emit,
            media_t0_s=self._clock() if media_t0_s is None else media_t0_s,
            reservation_id=reservation_id,
            trace=InputTrace(self._clock),
        )
        ctx = EngineContext(self, record)
        record.driver = build_driver(
            loop,
            ctx,
            model,
            request,
            record.on_boundary,
            restore_from=restore_from,
            state_type=state_type,
            fork_from=fork_from,
        )
        record.chunk_ended = restore_from is None  # a snapshot may stand inside a chunk
        self._loops[loop_id] = record
        record.task = asyncio.create_task(
            self._drive(record, request, model), name=f"dreamrt-loop-{loop_id}"
        )
        return LoopHandle(self, record)

    def handle(self, loop_id: str) -> LoopHandle | None:
        record = self._loops.get(loop_id)
        return None if record is None else LoopHandle(self, record)

    def stats(self) -> EngineStats:
        records = self._loops.values()
        return self._counters.snapshot(
            queue_depth=self.scheduler.depth(),
            running_loops=sum(1 for r in records if r.status is LoopStatus.RUNNING),
            paused_loops=sum(1 for r in records if r.paused),
            executing=self._in_flight is not None,
        )

    # -- driving ----------------------------------------------------------------------------

    async def _drive(self, record: LoopRecord, request: object, model: Any) -> None:
        status = LoopStatus.FAILED
        driver = record.driver
        assert driver is not None  # built by spawn, before this task
        try:
            record.result = await driver.run(request, model)
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
            if record.emit_tail is not None:  # deferred emissions land before the loop ends
                await asyncio.wait({record.emit_tail})
            if record.emit_error is not None and status is LoopStatus.SUCCEEDED:
                failed = record.emit_error
                record.error = LoopFailed(
                    record.loop_id, "emit_failed", f"{type(failed).__name__}: {failed}"
                )
                status = LoopStatus.FAILED
            self._finish(record, status)

    def _finish(self, record: LoopRecord, status: LoopStatus) -> None:
        self._drop_queued(record, Cancelled(record.loop_id, record.cancel_reason or "loop_ended"))
        if record.reservation_id is not None and self.admission is not None:
            self.admission.release(record.reservation_id)
        record.transition(status)
        self._counters.loop_ended(status.value)
        record.fail_snapshots(
            LoopStatusError(
                f"loop {record.loop_id!r} ended ({status.value}) before a step boundary"
            )
        )
        if self._loops.get(record.loop_id) is record:
            del self._loops[record.loop_id]
        record.release_state()
        record.finished.set()
        self._poke()  # a policy that reserved the executor for this loop may now pick another

    # -- schedule -> execute -> update ------------------------------------------------------

    async def _run_scheduler(self) -> None:
        wake = self._wake
        assert wake is not None  # made by start, before this task
        try:
            while self._state is EngineState.RUNNING:
                wake.clear()
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
                await _wait(wake, timeout_s)
        except Exception as exc:
            logger.exception("scheduler task crashed; failing every loop")
            self._broken = exc
            for record in list(self._loops.values()):
                error = LoopFailed(record.loop_id, "internal", f"scheduler crashed: {exc}")
                self._drop_queued(record, error)
        finally:
            logger.debug("scheduler task exits")

    def _dispatch(self, batch: Batch) -> None:
        entries = [self._plans[plan_id] for plan_id in batch.plan_ids]
        for entry in entries:
            entry.record.queued_plan = None
            plan = entry.plan
            entry.record.trace.started(plan.inputs, applied_seqs(plan.emits))
        self._in_flight = batch
        plans = [e.plan for e in entries]
        job = ExecJob.for_plans(
            batch.batch_id, batch.plan_ids, batch.loop_ids, plans, deterministic=self.deterministic
        )
        self.executor.submit(job)

    def _deliver(self, job: ExecJob, outcome: JobOutcome) -> None:
        """Executor thread -> event loop."""
        aloop = self._aloop
        if aloop is not None and not aloop.is_closed():
            aloop.call_soon_threadsafe(self._on_batch_done, job, outcome)

    def _on_batch_done(self, job: ExecJob, outcome: JobOutcome) -> None:
        info = job.info
        self.scheduler.complete(info.batch_id)
        self._in_flight = None
        step_wall_s: list[float] = []
        missed = met = 0
        for plan_id, result in zip(info.plan_ids, outcome.plans, strict=True):
            entry = self._plans.pop(plan_id, None)
            if entry is None:
                continue
            record = entry.record
            if result.failure is None:
                record.trace.finished(entry.plan.inputs)
                step_wall_s.append(result.wall_s)
                if entry.deadline_s is not None:
                    late = outcome.finished_s > entry.deadline_s
                    missed, met = missed + late, met + (not late)
                    if self.admission is not None and record.chunks_out > 0:
                        self.admission.record_deadline(missed=late)
                if ends_chunk(entry.plan.emits):
                    record.chunks_out += 1
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
        failed = sum(1 for result in outcome.plans if result.failure is not None)
        self._tell_listeners(
            BatchReport(
                info.batch_id, info.kind, outcome.wall_s, tuple(step_wall_s), failed, met, missed
            )
        )
        self._poke()

    def _tell_listeners(self, report: BatchReport) -> None:
        for listener in self.listeners:
            try:
                listener.batch_done(report)
            except Exception:  # metrics and the like never break scheduling
                logger.exception("batch listener %r raised; ignored", listener)

    def _signal_executor_exit(self) -> None:
        """Executor thread: its last act, after its last delivery."""
        aloop, exited = self._aloop, self._executor_exited
        if aloop is not None and exited is not None and not aloop.is_closed():
            aloop.call_soon_threadsafe(exited.set)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _transition(self, new: EngineState) -> None:
        old = self._state
        check_engine_transition(old, new)
        self._state = new
        logger.info("engine: %s -> %s", old.value, new.value)


async def _wait(event: asyncio.Event, timeout_s: float | None) -> None:
    """Until ``event`` is set or ``timeout_s`` passed (``None``: no timeout)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
