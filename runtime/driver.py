"""The generic driver: the only place loop iteration lives (docs/architecture.md §2).

``Driver.run`` is exactly the loop in ``runtime.contract``'s docstring::

    state = loop.init(request, model, ctx)             # or restored from a snapshot
    while True:
        on_boundary(driver)                            # engine hook: cancel, snapshot requests
        if inputs := ctx.take_inputs():
            state = loop.absorb(state, inputs)
        if isinstance(plan := loop.next(state), Done):
            break
        result = await ctx.execute(plan)
        state = loop.advance(state, result)
        for spec in plan.emits: ctx.emit(Emission(spec, result.output))
    return loop.finalize(state)

A *step boundary* is the point before ``take_inputs``: nothing is in flight and the state holds
every result so far. ``Driver.snapshot()`` is allowed only there (else ``DriverPhaseError``
naming the current phase); inputs not yet absorbed are not part of a snapshot. A driver built
with ``Driver.from_snapshot`` continues exactly where the snapshotted one stood.

Failures (all ``LoopFailed`` with ``ctx.loop_id``): an exception inside a loop method is
``"loop_exception"``; inputs for a loop without ``absorb`` (or ``absorb`` raising
``ValueError``) are ``"bad_input"``; a method returning something other than a ``LoopState`` /
``WorkPlan | Done`` / ``LoopResult`` is ``"bad_state"`` / ``"bad_plan"`` / ``"bad_result"``;
an ``emit`` sink raising is ``"emit_failed"``. ``Cancelled`` and ``LoopFailed`` from
``ctx.execute`` pass through unchanged; ``PlanWithdrawn`` (the runtime took a queued plan back
before it ran) returns the driver to the step boundary, where the loop absorbs the inputs that
caused it and describes its next plan again.

Snapshots are encoded by ``runtime.snapshot`` (msgspec structure + safetensors tensors);
``snapshot_state`` / ``restore_state`` / ``SnapshotError`` are re-exported here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from runtime.emissions import Emission
from runtime.live_inputs import InputEvent
from runtime.loop_failures import Cancelled, LoopFailed, PlanWithdrawn
from runtime.loop_protocol import Done, Loop, LoopContext, LoopResult, LoopState
from runtime.plans import PendingOutput, Priority, StepResult, WorkPlan
from runtime.snapshot import (
    Device,
    SnapshotError,
    restore_state,
    snapshot_state,
    snapshot_type_name,
)

__all__ = [
    "Driver",
    "DriverPhase",
    "DriverPhaseError",
    "InlineContext",
    "SnapshotError",
    "restore_state",
    "run_inline",
    "snapshot_state",
    "snapshot_type_name",
]

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=LoopState)


class DriverPhaseError(RuntimeError):
    """An action was attempted in a phase that does not allow it."""

    def __init__(
        self, loop_id: str, action: str, phase: DriverPhase, allowed: Iterable[DriverPhase]
    ):
        names = ", ".join(repr(p.value) for p in allowed)
        super().__init__(
            f"driver of loop {loop_id!r}: {action} needs phase {names}, "
            f"current phase is {phase.value!r}"
        )
        self.loop_id = loop_id
        self.action = action
        self.phase = phase


# --------------------------------------------------------------------------------------------
# Driver


class DriverPhase(str, enum.Enum):
    CREATED = "created"
    BOUNDARY = "boundary"
    ABSORBING = "absorbing"
    PLANNING = "planning"
    EXECUTING = "executing"
    ADVANCING = "advancing"
    EMITTING = "emitting"
    COMPLETE = "complete"  # next() returned Done; finalize is due
    FINALIZING = "finalizing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_P = DriverPhase
_END = frozenset({_P.FAILED, _P.CANCELLED})
TERMINAL_PHASES = frozenset({_P.DONE, _P.FAILED, _P.CANCELLED})
_ALLOWED: dict[DriverPhase, frozenset[DriverPhase]] = {
    _P.CREATED: frozenset({_P.BOUNDARY}) | _END,
    _P.BOUNDARY: frozenset({_P.ABSORBING, _P.PLANNING}) | _END,
    _P.ABSORBING: frozenset({_P.PLANNING}) | _END,
    _P.PLANNING: frozenset({_P.EXECUTING, _P.COMPLETE}) | _END,
    _P.EXECUTING: frozenset({_P.ADVANCING, _P.BOUNDARY}) | _END,  # boundary: plan withdrawn
    _P.ADVANCING: frozenset({_P.EMITTING}) | _END,
    _P.EMITTING: frozenset({_P.BOUNDARY}) | _END,
    _P.COMPLETE: frozenset({_P.FINALIZING}) | _END,
    _P.FINALIZING: frozenset({_P.DONE}) | _END,
    _P.DONE: frozenset(),
    _P.FAILED: frozenset(),
    _P.CANCELLED: frozenset(),
}


class Driver(Generic[S]):
    """Drives one loop through one context. Not reentrant: one ``step`` at a time.

    ``on_boundary(driver)`` (optional) is called by ``run`` at every step boundary; it may
    call ``driver.snapshot()`` or raise ``Cancelled`` to stop the loop there.
    """

    def __init__(
        self,
        loop: Loop[S],
        ctx: LoopContext,
        *,
        on_boundary: Callable[[Driver[S]], None] | None = None,
    ) -> None:
        self.loop = loop
        self.ctx = ctx
        self.steps_run = 0
        self.done_reason: str | None = None
        self._on_boundary = on_boundary
        self._phase = DriverPhase.CREATED
        self._state: S | None = None

    @classmethod
    def from_snapshot(
        cls,
        loop: Loop[S],
        ctx: LoopContext,
        blob: bytes,
        state_type: type[S],
        *,
        device: Device = None,
        on_boundary: Callable[[Driver[S]], None] | None = None,
    ) -> Driver[S]:
        """A driver standing at the boundary where ``blob`` was taken."""
        return cls.from_state(
            loop, ctx, restore_state(blob, state_type, device=device), on_boundary=on_boundary
        )

    @classmethod
    def from_state(
        cls,
        loop: Loop[S],
        ctx: LoopContext,
        state: S,
        *,
        on_boundary: Callable[[Driver[S]], None] | None = None,
    ) -> Driver[S]:
        """A driver standing at a boundary with ``state`` (e.g. a restored or forked state)."""
        driver = cls(loop, ctx, on_boundary=on_boundary)
        driver._state = driver._checked_state(state, "restore")
        driver._transition(DriverPhase.BOUNDARY)
        return driver

    @property
    def phase(self) -> DriverPhase:
        return self._phase

    @property
    def state(self) -> S:
        if self._state is None:
            raise DriverPhaseError(
                self.ctx.loop_id,
                "state",
                self._phase,
                [p for p in DriverPhase if p is not _P.CREATED],
            )
        return self._state

    # -- iteration --------------------------------------------------------------------------

    def init(self, request: object, model: Any) -> S:
        self._require("init", _P.CREATED)
        try:
            state = self._call("init", self.loop.init, request, model, self.ctx)
            self._state = self._checked_state(state, "init")
        except BaseException as exc:
            self._fail(exc)
            raise
        self._transition(_P.BOUNDARY)
        return self._state

    async def step(self) -> bool:
        """One iteration from a boundary; ``True`` at the next boundary, ``False`` if the
        loop is complete (``finalize`` is due)."""
        self._require("step", _P.BOUNDARY)
        try:
            inputs = self.ctx.take_inputs()
            if inputs:
                self._transition(_P.ABSORBING)
                self._state = self._absorb(inputs)
            self._transition(_P.PLANNING)
            plan = self._call("next", self.loop.next, self._state)
            if isinstance(plan, Done):
                self.done_reason = plan.reason
                self._transition(_P.COMPLETE)
                return False
            if not isinstance(plan, WorkPlan):
                raise LoopFailed(
                    self.ctx.loop_id,
                    "bad_plan",
                    f"{self.loop.name}.next returned {type(plan).__qualname__}, "
                    "not WorkPlan | Done",
                )
            self._transition(_P.EXECUTING)
            try:
                result = await self.ctx.execute(plan)
            except PlanWithdrawn:  # it never ran: back to the boundary, absorb, describe again
                self._transition(_P.BOUNDARY)
                return True
            if result.kind is not plan.kind:  # advance learns what ran from the result
                result = dataclasses.replace(result, kind=plan.kind)
            self._transition(_P.ADVANCING)
            state = self._call("advance", self.loop.advance, self._state, result)
            self._state = self._checked_state(state, "advance")
            self._transition(_P.EMITTING)
            for spec in plan.emits:
                self._emit(Emission(spec, result.output))
            self.steps_run += 1
            self._transition(_P.BOUNDARY)
            return True
        except BaseException as exc:
            self._fail(exc)
            raise

    def finalize(self) -> LoopResult:
        self._require("finalize", _P.COMPLETE)
        self._transition(_P.FINALIZING)
        try:
            result = self._call("finalize", self.loop.finalize, self._state)
            if not isinstance(result, LoopResult):
                raise LoopFailed(
                    self.ctx.loop_id,
                    "bad_result",
                    f"{self.loop.name}.finalize returned {type(result).__qualname__}, "
                    "not LoopResult",
                )
        except BaseException as exc:
            self._fail(exc)
            raise
        self._transition(_P.DONE)
        return result

    async def run(self, request: object = None, model: Any = None) -> LoopResult:
        """init (unless restored) → steps → finalize. Raises ``Cancelled`` / ``LoopFailed``."""
        self._require("run", _P.CREATED, _P.BOUNDARY)
        if self._phase is _P.CREATED:
            self.init(request, model)
        while True:
            if self._on_boundary is not None:
                try:
                    self._on_boundary(self)
                except BaseException as exc:
                    self._fail(exc)
                    raise
            if not await self.step():
                return self.finalize()

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The state at this step boundary as bytes (see ``snapshot_state``)."""
        self._require("snapshot", _P.BOUNDARY)
        return snapshot_state(self.state)

    def snapshot_pending(self) -> bytes:
        """Snapshot while a plan is submitted but has NOT started executing.

        The caller (the engine) guarantees the plan has not run. ``next`` runs no kernels and
        only reads the state, so the state is exactly the one from which that plan was
        described; a driver restored from it re-describes the same plan.
        """
        self._require("snapshot_pending", _P.EXECUTING)
        return snapshot_state(self.state)

    # -- internals --------------------------------------------------------------------------

    def _absorb(self, inputs: Sequence[InputEvent]) -> S:
        absorb = getattr(self.loop, "absorb", None)
        if absorb is None or getattr(type(self.loop), "absorb", None) is Loop.absorb:
            kinds = sorted({event.kind for event in inputs})
            raise LoopFailed(
                self.ctx.loop_id,
                "bad_input",
                f"loop {self.loop.name!r} takes no live inputs, got {kinds}",
            )
        try:
            state = absorb(self._state, inputs)
        except ValueError as exc:
            raise LoopFailed(
                self.ctx.loop_id, "bad_input", f"{self.loop.name}.absorb: {exc}"
            ) from exc
        except (Cancelled, LoopFailed):
            raise
        except Exception as exc:
            raise self._wrapped("absorb", exc) from exc
        return self._checked_state(state, "absorb")

    def _call(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (Cancelled, LoopFailed):
            raise
        except Exception as exc:
            raise self._wrapped(method, exc) from exc

    def _wrapped(self, method: str, exc: Exception) -> LoopFailed:
        return LoopFailed(
            self.ctx.loop_id,
            "loop_exception",
            f"{self.loop.name}.{method} raised {type(exc).__name__}: {exc}",
        )

    def _emit(self, emission: Emission) -> None:
        try:
            self.ctx.emit(emission)
        except Exception as exc:
            raise LoopFailed(
                self.ctx.loop_id,
                "emit_failed",
                f"sink for stream {emission.spec.stream!r} raised {type(exc).__name__}: {exc}",
            ) from exc

    def _checked_state(self, state: object, where: str) -> S:
        if not isinstance(state, LoopState):
            raise LoopFailed(
                self.ctx.loop_id,
                "bad_state",
                f"{self.loop.name}.{where} produced {type(state).__qualname__}, not a LoopState",
            )
        return state  # type: ignore[return-value]  # a LoopState: what the loop's S is

    def _fail(self, exc: BaseException) -> None:
        if self._phase in TERMINAL_PHASES:
            return
        cancelled = isinstance(exc, (Cancelled, asyncio.CancelledError))
        self._transition(_P.CANCELLED if cancelled else _P.FAILED)

    def _require(self, action: str, *phases: DriverPhase) -> None:
        if self._phase not in phases:
            raise DriverPhaseError(self.ctx.loop_id, action, self._phase, phases)

    def _transition(self, new: DriverPhase) -> None:
        old = self._phase
        if new not in _ALLOWED[old]:
            raise DriverPhaseError(
                self.ctx.loop_id, f"transition to {new.value!r}", old, _ALLOWED[old]
            )
        self._phase = new
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("driver %s: %s -> %s", self.ctx.loop_id, old.value, new.value)


# --------------------------------------------------------------------------------------------
# Inline context (tools, tests, reference runs)


class InlineContext:
    """A ``LoopContext`` that runs every plan immediately and alone on the calling thread.

    For tools, parity tests and the "run alone" reference; never for serving (it runs ops on
    the event loop). Emissions are collected in ``emissions``, executed plans in ``executed``
    (and each one's wall seconds in ``wall_s``).
    An op that raises fails the loop with ``LoopFailed("step_exception")``. A ``PendingOutput``
    is resolved (waited for) before its emission is collected.
    """

    def __init__(
        self,
        loop_id: str = "inline",
        priority: Priority = Priority.BATCH,
        *,
        deterministic: bool = False,
        on_emit: Callable[[Emission], None] | None = None,
    ) -> None:
        self.loop_id = loop_id
        self.priority = priority
        self.deterministic = deterministic
        self.emissions: list[Emission] = []
        self.executed: list[WorkPlan] = []
        self.wall_s: list[float] = []
        self._on_emit = on_emit
        self._inputs: deque[InputEvent] = deque()

    def push_input(self, event: InputEvent) -> None:
        self._inputs.append(event)

    async def execute(self, plan: WorkPlan) -> StepResult:
        start_s = time.perf_counter()
        try:
            outputs = plan.op([plan.args], deterministic=self.deterministic)
        except Exception as exc:
            raise LoopFailed(
                self.loop_id, "step_exception", f"{plan.op.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        wall_s = time.perf_counter() - start_s
        if len(outputs) != 1:
            raise LoopFailed(
                self.loop_id,
                "bad_output",
                f"{plan.op.name} returned {len(outputs)} outputs for 1 plan",
            )
        self.executed.append(plan)
        self.wall_s.append(wall_s)
        return StepResult(output=outputs[0], wall_s=wall_s, batch_size=1)

    def emit(self, emission: Emission) -> None:
        if isinstance(emission.output, PendingOutput):
            emission = Emission(emission.spec, emission.output.result())
        self.emissions.append(emission)
        if self._on_emit is not None:
            self._on_emit(emission)

    def take_inputs(self) -> list[InputEvent]:
        inputs = list(self._inputs)
        self._inputs.clear()
        return inputs


async def run_inline(
    loop: Loop[S],
    request: object,
    model: Any,
    *,
    loop_id: str = "inline",
    deterministic: bool = False,
) -> tuple[LoopResult, list[Emission]]:
    """Run a loop to completion alone through an ``InlineContext``; returns (result, emissions)."""
    ctx = InlineContext(loop_id, deterministic=deterministic)
    result = await Driver(loop, ctx).run(request, model)
    return result, ctx.emissions
