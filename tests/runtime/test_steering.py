"""Time to steer in the runtime: input stages (InputTrace), lead policies, plan withdrawal."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from runtime.contract import (
    AppliedMeta,
    Done,
    Emission,
    EmitSpec,
    InputEvent,
    InputKind,
    LoopResult,
    LoopState,
    PlanKind,
    Priority,
    PromptInput,
    StepResult,
    Stream,
    WorkPlan,
)
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.input_trace import InputTrace, applied_seqs
from runtime.lead import AdaptiveLead, FixedLead
from runtime.scheduler import SchedulerError


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------ InputTrace


def test_trace_times_every_stage_from_the_push() -> None:
    clock = FakeClock()
    trace = InputTrace(clock)
    trace.pushed(3)
    assert trace.pending([3]) and not trace.pending([4])
    clock.t += 0.10
    trace.planned([3])  # the chunk that reflects it is described
    clock.t += 0.05
    trace.planned([3])  # a later plan of that chunk: latched stays the first
    trace.started([3], ())
    clock.t += 0.20
    trace.finished([3])  # last denoising step
    clock.t += 0.01
    trace.started([3], (3,))  # the decode that acknowledges it starts
    clock.t += 0.04
    trace.finished([3])
    clock.t += 0.02
    timing = trace.timing(3)
    assert timing is not None and timing.seq == 3
    assert timing.latched_s == pytest.approx(0.10)
    assert timing.started_s == pytest.approx(0.15)
    assert timing.generated_s == pytest.approx(0.35)
    assert timing.decoded_s == pytest.approx(0.42)
    assert trace.timing(3) is None and not trace.pending([3])  # forgotten once acknowledged


def test_trace_of_an_input_no_plan_named_has_only_decoded() -> None:
    clock = FakeClock()
    trace = InputTrace(clock)
    trace.pushed(1)
    clock.t += 0.3
    timing = trace.timing(1)
    assert (timing.latched_s, timing.started_s, timing.generated_s) == (None, None, None)
    assert timing.decoded_s == pytest.approx(0.3)


def test_trace_is_bounded_oldest_first() -> None:
    trace = InputTrace(FakeClock(), max_inputs=3)
    for seq in range(5):
        trace.pushed(seq)
    assert [trace.pending([s]) for s in range(5)] == [False, False, True, True, True]


def test_applied_seqs_reads_the_acknowledgements_of_a_plan() -> None:
    emits = (
        EmitSpec(Stream.MEDIA, None),
        EmitSpec(Stream.APPLIED, AppliedMeta(kind=InputKind.PROMPT, seq=4, chunk=1, pts_90k=0)),
        EmitSpec(Stream.APPLIED, AppliedMeta(kind=InputKind.ACTION, seq=6, chunk=1, pts_90k=0)),
    )
    assert applied_seqs(emits) == (4, 6)


# ------------------------------------------------------------------ lead policies


class _Loop:
    def __init__(self, pending: bool = False, last: float | None = None) -> None:
        self.pending_input = pending
        self.last_input_s = last


def test_fixed_lead_is_the_same_window_whatever_the_inputs() -> None:
    lead = FixedLead(1.0)
    for loop in (_Loop(), _Loop(True, 9.9)):
        assert lead.window(20.0, now_s=10.0, cost_s=0.1, followups_s=0.5, loop=loop) == (
            20.0,
            19.0,
        )


def test_adaptive_lead_runs_pending_input_at_once_and_steered_loops_just_in_time() -> None:
    lead = AdaptiveLead(1.0, steer_lead_s=0.3, steer_hold_s=2.0)
    window = lead.window
    # idle: the full lead
    assert window(20.0, now_s=10.0, cost_s=0.1, followups_s=0.5, loop=_Loop()) == (20.0, 19.0)
    # pending input: eligible now, ranked as due when its own work and its followups are done
    rank, eligible = window(20.0, now_s=10.0, cost_s=0.1, followups_s=0.5, loop=_Loop(True, 9.0))
    assert eligible == 10.0 and rank == pytest.approx(10.6)
    # ... but never ranked later than its playout deadline
    assert window(10.2, now_s=10.0, cost_s=0.1, followups_s=0.5, loop=_Loop(True))[0] == 10.2
    # steered within the hold: the short lead; after it, the full lead again
    assert window(20.0, now_s=10.0, cost_s=0.1, followups_s=0.5, loop=_Loop(False, 8.5)) == (
        20.0,
        19.7,
    )
    assert window(20.0, now_s=10.0, cost_s=0.1, followups_s=0.5, loop=_Loop(False, 7.0)) == (
        20.0,
        19.0,
    )
    with pytest.raises(SchedulerError, match="steer_hold_s=-1"):
        AdaptiveLead(1.0, steer_hold_s=-1)


# ------------------------------------------------------------------ the engine


class HostOp:
    name = "host"
    batchable = False

    def __init__(self) -> None:
        self.ran: list[Any] = []

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        self.ran.extend(args)
        return [None] * len(args)


class Steer(LoopState, kw_only=True):
    chunk: int = 0
    decoding: bool = False
    acks: list[int] = []
    absorbed_at: list[tuple[int, int]] = []  # (plans run so far, seq)


class SteerLoop:
    """Chunks of two plans (a step, then a decode acknowledging the chunk's inputs); inputs
    latch for the chunk about to start. Media of chunk k is due at k seconds."""

    name = "steer"

    def __init__(self, op: HostOp) -> None:
        self.op = op

    def init(self, request: Any, model: Any, ctx: Any) -> Steer:
        return Steer()

    def absorb(self, state: Steer, inputs: Sequence[InputEvent]) -> Steer:
        for event in inputs:
            state.absorbed_at.append((state.step, event.seq))
            if not state.decoding:
                state.acks.append(event.seq)
        return state

    def next(self, state: Steer) -> WorkPlan | Done:
        if state.chunk >= 3:
            return Done()
        emits: tuple[EmitSpec, ...] = ()
        if state.decoding:
            emits = tuple(
                EmitSpec(
                    Stream.APPLIED,
                    AppliedMeta(kind=InputKind.PROMPT, seq=s, chunk=state.chunk, pts_90k=0),
                )
                for s in state.acks
            )
        return WorkPlan(
            loop_id="steer",
            kind=PlanKind.VAE_DECODE if state.decoding else PlanKind.CHUNK_STEP,
            op=self.op,
            args=(state.chunk, state.decoding, tuple(state.acks)),
            shape_sig="s",
            due_media_s=float(state.chunk),
            emits=emits,
            inputs=tuple(state.acks),
        )

    def advance(self, state: Steer, result: StepResult) -> Steer:
        state.step += 1
        if state.decoding:
            state.chunk, state.acks = state.chunk + 1, []
        state.decoding = not state.decoding
        return state

    def finalize(self, state: Steer) -> LoopResult:
        return LoopResult({"chunks": state.chunk})


async def _steer_once(
    wait_s: float = 0.5, **engine_options: Any
) -> tuple[list[Emission], Steer | None, HostOp]:
    """A loop whose media is due 50 s from now (nothing is eligible under a 1 s lead); a
    prompt is pushed; returns what was emitted by the first emission or ``wait_s``."""
    engine = Engine(cost=CostModel(), max_lead_s=1.0, **engine_options)
    await engine.start()
    op, emitted = HostOp(), []
    try:
        handle = _spawn_steer(engine, op, emitted.append)
        await asyncio.sleep(0.05)
        assert op.ran == []  # the first step waits for its lead window
        handle.push_input(InputEvent(InputKind.PROMPT, 1, PromptInput(text="now")))
        for _ in range(round(wait_s / 0.01)):
            if emitted:
                break
            await asyncio.sleep(0.01)
        record = engine._loops["steer"]
        state = msgspec.structs.replace(record.driver.state) if record.driver else None
        handle.cancel()
    finally:
        await engine.close()
    return emitted, state, op


def test_a_pushed_input_withdraws_the_queued_plan_and_runs_at_once() -> None:
    # anything emitted within 20 s ran long before its lead window (its media is due in 50 s)
    emitted, state, op = asyncio.run(_steer_once(wait_s=20.0))
    # absorbed before any plan ran, so the very first chunk reflects it ...
    assert state is not None and state.absorbed_at == [(0, 1)]
    assert op.ran[:2] == [(0, False, (1,)), (0, True, (1,))]
    # ... and its runtime stages arrive with the acknowledgement, in order
    (applied,) = emitted
    assert applied.spec.meta.seq == 1
    t = applied.timing
    assert t is not None and t.seq == 1
    assert 0 <= t.latched_s <= t.started_s <= t.generated_s <= t.decoded_s


def test_without_withdrawal_the_input_waits_behind_the_queued_plan() -> None:
    emitted, state, op = asyncio.run(_steer_once(withdraw_on_input=False))
    assert emitted == [] and op.ran == []
    assert state is not None and state.absorbed_at == []  # still waiting for that plan


def test_with_a_fixed_lead_the_input_is_absorbed_but_waits_for_the_playout() -> None:
    emitted, state, op = asyncio.run(_steer_once(lead=FixedLead(1.0)))
    assert state is not None and state.absorbed_at == [(0, 1)]
    assert emitted == [] and op.ran == []


def _spawn_steer(engine: Engine, op: HostOp, on_emit: Any) -> Any:
    """A realtime ``SteerLoop`` whose media is due 50 s from now (no plan is eligible under a
    1 s lead unless an input lifts it)."""
    return engine.spawn(
        SteerLoop(op),
        None,
        None,
        loop_id="steer",
        priority=Priority.REALTIME,
        on_emit=on_emit,
        media_t0_s=engine._clock() + 50.0,
    )


async def test_a_withdrawn_plan_leaves_the_loop_at_its_chunk_boundary() -> None:
    """An input withdraws the plan queued at a chunk boundary (nothing ran): the loop is still
    at that boundary, so a call for the next chunk boundary (a fork, a replay snapshot) runs
    on it at once instead of a chunk later."""
    engine = Engine(cost=CostModel(), max_lead_s=1.0, lead=FixedLead(1.0))
    await engine.start()
    op = HostOp()
    try:
        handle = _spawn_steer(engine, op, lambda emission: None)
        await asyncio.sleep(0.05)
        handle.push_input(InputEvent(InputKind.PROMPT, 1, PromptInput(text="now")))
        await asyncio.sleep(0.05)
        state = engine._loops["steer"].driver.state
        assert state.absorbed_at == [(0, 1)] and op.ran == []  # withdrawn, described again
        call = handle.at_boundary(lambda s: (s.step, list(s.acks)), after_chunk=True)
        assert await asyncio.wait_for(call, 2.0) == (0, [1])
        handle.cancel()
    finally:
        await engine.close()
