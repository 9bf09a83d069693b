"""The executor seam: the ONE thread that runs tensor work (docs/architecture.md §6 "Threads").

The engine hands it ``ExecJob``s (one picked batch each); it runs the op, the observers and
failure isolation, and hands back a ``JobOutcome`` through the ``deliver`` callback, called on
the executor thread (the engine forwards it with ``loop.call_soon_threadsafe``; the executor
never touches asyncio objects).

Failure isolation: if the op raises (or returns the wrong number of outputs), or an observer
reports a fault for any plan, and the batch held more than one plan, every plan is re-run
alone (``BatchInfo.solo_retry``); a plan that still fails gets a failure ``(code, message)``
— ``"step_exception"``, ``"oom"`` for an out-of-memory error (``torch.cuda.OutOfMemoryError``
or any exception type named ``OutOfMemoryError``; the CUDA cache is emptied before the
re-runs, so a batch that did not fit may still run plan by plan), or the observer's code
(``"nan"``) — and the others their outputs.

Deterministic mode passes ``deterministic=True`` to the op: it must then return, for every
entry, the bits it returns for that entry alone (run entries one by one, or use
batch-invariant kernels). Without it, batched outputs agree with solo outputs only within the
op's numerical tolerance.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from runtime.observers import BatchInfo, Observer, PlanFault
from runtime.plans import StepOp, WorkPlan

__all__ = ["ExecJob", "Executor", "JobOutcome", "PlanOutcome"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExecJob:
    """One batch to run: ``args[i]`` belongs to ``info.plan_ids[i]``."""

    info: BatchInfo
    op: StepOp
    args: tuple[object, ...]
    plan_flops: tuple[float, ...]

    @classmethod
    def for_plans(
        cls,
        batch_id: int,
        plan_ids: Sequence[int],
        loop_ids: Sequence[str],
        plans: Sequence[WorkPlan],
        *,
        deterministic: bool,
    ) -> ExecJob:
        """One job for compatible plans (head first); the head's op runs them all."""
        head = plans[0]
        info = BatchInfo(
            batch_id=batch_id,
            kind=head.kind.value,
            shape_sig=head.shape_sig,
            instance_id=head.instance_id,
            op_name=head.op.name,
            plan_ids=tuple(plan_ids),
            loop_ids=tuple(loop_ids),
            flops=sum(p.flops for p in plans),
            deterministic=deterministic,
        )
        return cls(
            info=info,
            op=head.op,
            args=tuple(p.args for p in plans),
            plan_flops=tuple(p.flops for p in plans),
        )


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """One plan's result: ``output`` or ``failure = (code, message)``. ``wall_s``,
    ``device_s`` and ``batch_size`` describe the run that produced it."""

    output: Any = None
    failure: tuple[str, str] | None = None
    wall_s: float = 0.0
    device_s: float | None = None
    batch_size: int = 1


@dataclass(frozen=True, slots=True)
class JobOutcome:
    plans: tuple[PlanOutcome, ...]
    wall_s: float  # the whole job, solo re-runs included
    finished_s: float  # on the engine clock
    retried_solo: bool = False


@dataclass(slots=True)
class _Attempt:
    outputs: list[Any] | None
    error: tuple[str, str] | None
    faults: dict[int, PlanFault]
    wall_s: float
    device_s: float | None

    @property
    def clean(self) -> bool:
        return self.error is None and not self.faults

    def plan(self, index: int) -> PlanOutcome:
        if self.outputs is None:
            failure = self.error or ("internal", "op produced no outputs")
            return PlanOutcome(failure=failure, wall_s=self.wall_s)
        size = len(self.outputs)
        fault = self.faults.get(index)
        if fault is not None:
            return PlanOutcome(
                failure=(fault.code, fault.message), wall_s=self.wall_s, batch_size=size
            )
        return PlanOutcome(self.outputs[index], None, self.wall_s, self.device_s, size)


class Executor:
    """Runs jobs one at a time on one thread. ``start`` launches it, ``stop`` asks it to
    finish the current job and exit; ``join`` waits for that."""

    def __init__(
        self,
        *,
        observers: Sequence[Observer] = (),
        deterministic: bool = False,
        clock: Callable[[], float] = time.monotonic,
        name: str = "dreamrt-executor",
    ) -> None:
        self.observers = tuple(observers)
        self.deterministic = deterministic
        self._clock = clock
        self._name = name
        self._jobs: queue.SimpleQueue[ExecJob | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._deliver: Callable[[ExecJob, JobOutcome], None] | None = None
        self._on_exit: Callable[[], None] | None = None

    def start(
        self,
        deliver: Callable[[ExecJob, JobOutcome], None],
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """Launch the thread. ``deliver`` gets every job's outcome; ``on_exit`` is called on the
        executor thread as its last act, after the last ``deliver`` (however it exits)."""
        if self._thread is not None:
            raise RuntimeError(f"executor {self._name!r} already started")
        self._deliver = deliver
        self._on_exit = on_exit
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()

    def submit(self, job: ExecJob) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        self._jobs.put(None)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            self._serve()
        finally:
            if self._on_exit is not None:
                try:
                    self._on_exit()
                except Exception:  # e.g. the event loop is already closed
                    logger.exception("executor: exit signal failed")

    def _serve(self) -> None:
        deliver = self._deliver
        while (job := self._jobs.get()) is not None:
            try:
                outcome = self.run_job(job)
            except Exception as exc:  # an engine bug: fail the batch's loops, keep serving
                logger.exception("executor: job for batch %d crashed", job.info.batch_id)
                failure = ("internal", f"executor crashed: {type(exc).__name__}: {exc}")
                outcome = JobOutcome(
                    plans=tuple(PlanOutcome(failure=failure) for _ in job.args),
                    wall_s=0.0,
                    finished_s=self._clock(),
                )
            if deliver is not None:
                try:
                    deliver(job, outcome)
                except Exception:  # e.g. the event loop is already closed
                    logger.exception("executor: could not deliver batch %d", job.info.batch_id)

    def run_job(self, job: ExecJob) -> JobOutcome:
        """Run one job on the calling thread (the executor thread, or a test)."""
        start_s = time.perf_counter()
        attempt = self._attempt(job.info, job.op, job.args)
        size = len(job.args)
        if attempt.clean or size == 1:
            return JobOutcome(
                plans=tuple(attempt.plan(i) for i in range(size)),
                wall_s=time.perf_counter() - start_s,
                finished_s=self._clock(),
            )
        reason = attempt.error[0] if attempt.error else f"{len(attempt.faults)} faulted plans"
        logger.warning(
            "batch %d of %s (%d plans) failed (%s); re-running each plan alone",
            job.info.batch_id,
            job.info.op_name,
            size,
            reason,
        )
        plans = []
        for i in range(size):
            info = replace(
                job.info,
                plan_ids=(job.info.plan_ids[i],),
                loop_ids=(job.info.loop_ids[i],),
                flops=job.plan_flops[i],
                solo_retry=True,
            )
            plans.append(self._attempt(info, job.op, (job.args[i],)).plan(0))
        return JobOutcome(
            plans=tuple(plans),
            wall_s=time.perf_counter() - start_s,
            finished_s=self._clock(),
            retried_solo=True,
        )

    def _attempt(self, info: BatchInfo, op: StepOp, args: Sequence[object]) -> _Attempt:
        for observer in self.observers:
            self._guard(observer.before_batch, info)
        start_s = time.perf_counter()
        try:
            outputs = list(op(list(args), deterministic=self.deterministic))
        except Exception as exc:
            wall_s = time.perf_counter() - start_s
            if len(args) == 1:
                logger.warning(
                    "op %s failed for loop %s", info.op_name, info.loop_ids[0], exc_info=exc
                )
            message = f"{info.op_name} raised {type(exc).__name__}: {exc}"
            if _is_oom(exc):
                _release_cached_memory()
                return _Attempt(None, ("oom", message), {}, wall_s, None)
            return _Attempt(None, ("step_exception", message), {}, wall_s, None)
        wall_s = time.perf_counter() - start_s
        if len(outputs) != len(args):
            message = f"{info.op_name} returned {len(outputs)} outputs for {len(args)} plans"
            return _Attempt(None, ("step_exception", message), {}, wall_s, None)
        faults: dict[int, PlanFault] = {}
        device_s = None
        for observer in self.observers:
            observation = self._guard(observer.after_batch, info, outputs, wall_s)
            if observation is None:
                continue
            if observation.device_s is not None:
                device_s = observation.device_s
            for fault in observation.faults:
                faults.setdefault(fault.index, fault)
        return _Attempt(outputs, None, faults, wall_s, device_s)

    @staticmethod
    def _guard(hook: Callable[..., Any], *args: Any) -> Any:
        """Observers are read-only helpers: a broken one is logged, never fails a plan."""
        try:
            return hook(*args)
        except Exception:
            logger.exception("observer hook %r raised; ignored", hook)
            return None


def _is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (torch.OutOfMemoryError) without importing torch here."""
    return any(t.__name__ == "OutOfMemoryError" for t in type(exc).__mro__)


def _release_cached_memory() -> None:
    """Hands the failed batch's cached blocks back to the driver (CUDA only)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
