"""Engine: schedule -> execute -> update with real loops, one executor thread, real asyncio."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import torch

from runtime.admission import AdmissionConfig, AdmissionController, AdmissionRequest, Admit
from runtime.baseline_schedulers import ChunkRoundRobinScheduler, FifoScheduler
from runtime.contract import (
    Cancelled,
    Done,
    Emission,
    EmitSpec,
    InputEvent,
    LoopFailed,
    LoopResult,
    LoopState,
    PlanKind,
    Priority,
    StepResult,
    WorkPlan,
)
from runtime.cost import CostModel
from runtime.driver import restore_state, run_inline
from runtime.engine import Engine, EngineError
from runtime.observers import BatchInfo, BatchReport, NaNWatch, Observation
from runtime.policies import SCHEDULER_POLICIES, make_scheduler
from runtime.step_edf import StepEdfScheduler
from tests.runtime.toy_loops import ToyDenoiseLoop, ToyDenoiser, ToyModel, ToyRequest, ToyState

RT = Priority.REALTIME
BATCH = Priority.BATCH


@pytest.fixture(scope="module")
def model() -> ToyModel:
    return ToyModel(ToyDenoiser(seed=9))


async def within(awaitable: Any, timeout_s: float = 20.0) -> Any:
    """Await with a bound, so a runtime bug fails the test instead of hanging the suite."""
    return await asyncio.wait_for(awaitable, timeout_s)


def make_engine(**overrides: Any) -> Engine:
    params: dict[str, Any] = {"cost": CostModel(), "max_lead_s": 10.0}
    params.update(overrides)
    return Engine(**params)


async def until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


class GateOp:
    """Blocks the executor thread inside the op until ``gate`` is set."""

    name = "gate"
    batchable = False

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[Any] = []
        self.threads: set[str] = set()

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(10.0)
        self.calls.extend(args)
        return list(args)


class Count(LoopState, kw_only=True):
    limit: int


class CountLoop:
    """``limit`` host steps through ``op``; emits each step's output."""

    name = "count"

    def __init__(self, op: Any) -> None:
        self.op = op

    def init(self, request: int, model: Any, ctx: Any) -> Count:
        return Count(limit=request)

    def next(self, state: Count) -> WorkPlan | Done:
        if state.step >= state.limit:
            return Done()
        return WorkPlan(
            loop_id="c",
            kind=PlanKind.HOST,
            op=self.op,
            args=state.step,
            shape_sig="1",
            emits=(EmitSpec("progress"),),
        )

    def advance(self, state: Count, result: StepResult) -> Count:
        return msgspec.structs.replace(state, step=state.step + 1)

    def finalize(self, state: Count) -> LoopResult:
        return LoopResult({"steps": state.step})


class AttemptSpy:
    """Records every op attempt: (loop ids, solo_retry)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[tuple[str, ...], bool]] = []

    def before_batch(self, info: BatchInfo) -> None:
        self.attempts.append((info.loop_ids, info.solo_retry))

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[Any], wall_s: float
    ) -> Observation | None:
        return None


def no_emit(emission: Emission) -> None:
    return None


async def test_one_loop_runs_to_completion_with_stats_and_emissions(model: ToyModel) -> None:
    want, want_emissions = await run_inline(ToyDenoiseLoop(model), ToyRequest(seed=2), model)
    engine = make_engine()
    await engine.start()
    emitted: list[Emission] = []
    try:
        handle = engine.spawn(
            ToyDenoiseLoop(model),
            ToyRequest(seed=2),
            model,
            loop_id="a",
            priority=BATCH,
            on_emit=emitted.append,
        )
        result = await within(handle.result())
        stats = engine.stats()
    finally:
        await engine.close()
    assert torch.equal(result.outputs["x"], want.outputs["x"])
    assert (
        [e.spec.meta["step"] for e in emitted]
        == list(range(6))
        == [e.spec.meta["step"] for e in want_emissions]
    )
    assert handle.done and handle.state_name == "succeeded"
    assert (
        stats.plans_executed,
        stats.batches_executed,
        stats.queue_depth,
        stats.running_loops,
    ) == (6, 6, 0, 0)
    assert stats.loops_succeeded == 1 and len(stats.latency_samples_s["diffusion_step"]) == 6
    assert stats.deadline_misses == 0 and stats.deadlines_met == 0  # batch class: no deadlines


async def test_cancellation_frees_every_reservation_and_queued_plan() -> None:
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=100))
    engine = make_engine(admission=admission)
    await engine.start()
    op = GateOp()
    emitted: dict[str, list[Any]] = {}
    handles = []
    try:
        for name in ("a", "b", "c"):
            verdict = admission.admit(AdmissionRequest(name, compute_gpu_s_per_s=0.2, peak_bytes=5))
            assert isinstance(verdict, Admit)
            emitted[name] = []
            handles.append(
                engine.spawn(
                    CountLoop(op),
                    5,
                    None,
                    loop_id=name,
                    priority=BATCH,
                    on_emit=emitted[name].append,
                    reservation_id=verdict.reservation_id,
                )
            )
        await until(op.entered.is_set)  # a's first plan is executing; b and c are queued
        await until(lambda: engine.stats().queue_depth == 2)
        assert admission.usage().reservations == 3
        for handle in handles:
            handle.cancel("user_left")
        assert engine.stats().queue_depth == 0  # queued plans dropped at once
        for handle in handles[1:]:
            with pytest.raises(Cancelled, match="user_left"):
                await within(handle.result())
        assert not handles[0].done  # a's plan is still executing: cancel lands when it ends
        op.gate.set()
        with pytest.raises(Cancelled):
            await within(handles[0].result())
        stats = engine.stats()
    finally:
        op.gate.set()
        await engine.close()
    assert [h.state_name for h in handles] == ["cancelled"] * 3
    assert (stats.queue_depth, stats.running_loops, stats.executing, stats.loops_cancelled) == (
        0,
        0,
        False,
        3,
    )
    assert admission.usage().reservations == 0 and admission.usage().compute_gpu_s_per_s == 0
    assert op.calls == [0]  # only a's first plan ever ran...
    assert emitted == {"a": [], "b": [], "c": []}  # ...and its result was discarded


@pytest.mark.parametrize(("poison", "code"), [("raise", "step_exception"), ("nan", "nan")])
async def test_failure_isolation_one_loop_fails_the_others_finish(
    model: ToyModel, poison: str, code: str
) -> None:
    requests = {
        "ok1": ToyRequest(seed=1),
        "bad": ToyRequest(seed=2, poison_step=2, poison=poison),
        "ok2": ToyRequest(seed=3),
    }
    want = {
        k: (await run_inline(ToyDenoiseLoop(model), r, model))[0]
        for k, r in requests.items()
        if k != "bad"
    }
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=100))
    spy = AttemptSpy()
    engine = make_engine(
        scheduler=StepEdfScheduler(max_batch=3),
        deterministic=True,
        observers=[spy, NaNWatch()],
        admission=admission,
    )
    await engine.start()
    emitted: dict[str, list[int]] = {k: [] for k in requests}
    try:
        handles = {}
        for k, r in requests.items():
            verdict = admission.admit(AdmissionRequest(k, compute_gpu_s_per_s=0.1))
            assert isinstance(verdict, Admit)
            handles[k] = engine.spawn(
                ToyDenoiseLoop(model),
                r,
                model,
                loop_id=k,
                priority=BATCH,
                on_emit=lambda e, k=k: emitted[k].append(e.spec.meta["step"]),
                reservation_id=verdict.reservation_id,
            )
        with pytest.raises(LoopFailed) as info:
            await within(handles["bad"].result())
        results = {k: await within(handles[k].result()) for k in want}
        stats = engine.stats()
    finally:
        await engine.close()
    assert info.value.code == code and info.value.loop_id == "bad"
    assert handles["bad"].state_name == "failed" and emitted["bad"] == [0, 1]
    for k in want:
        assert torch.equal(results[k].outputs["x"], want[k].outputs["x"])
        assert emitted[k] == list(range(6))
    # Steps 0-1 ran as batches of 3; step 2's batch failed and each plan was re-run alone;
    # steps 3-5 ran without the failed loop.
    trio, pair = ("ok1", "bad", "ok2"), ("ok1", "ok2")
    solos = [(("ok1",), True), (("bad",), True), (("ok2",), True)]
    assert spy.attempts == [(trio, False)] * 3 + solos + [(pair, False)] * 3
    assert stats.loops_failed == 1 and stats.loops_succeeded == 2
    assert admission.usage().reservations == 0


async def test_paused_loop_waits_while_others_run(model: ToyModel) -> None:
    engine = make_engine()
    await engine.start()
    op = GateOp()
    op.gate.set()
    try:
        paused = engine.spawn(CountLoop(op), 3, None, loop_id="p", priority=BATCH, on_emit=no_emit)
        paused.pause()
        other = engine.spawn(CountLoop(op), 4, None, loop_id="o", priority=BATCH, on_emit=no_emit)
        assert (await within(other.result())).outputs == {"steps": 4}
        stats = engine.stats()
        assert (stats.paused_loops, stats.queue_depth, stats.running_loops) == (1, 1, 1)
        assert not paused.done and paused.paused
        paused.resume()
        assert (await within(paused.result())).outputs == {"steps": 3}
    finally:
        await engine.close()
    assert op.calls == [0, 1, 2, 3, 0, 1, 2]
    # Ops ran on the one executor thread, never on the event loop's thread.
    assert op.threads == {"dreamrt-executor"} != {threading.current_thread().name}


async def test_cancelling_a_paused_loop_ends_it_at_once(model: ToyModel) -> None:
    # A paused loop's next plan sits queued and is never picked: cancel must still end it
    # (a viewer that left pauses its session; DELETE and shutdown then cancel it).
    engine = make_engine()
    await engine.start()
    op = GateOp()
    op.gate.set()
    try:
        handle = engine.spawn(CountLoop(op), 5, None, loop_id="p", priority=BATCH, on_emit=no_emit)
        handle.pause()
        await until(lambda: engine.stats().queue_depth == 1)
        handle.cancel("viewer left")
        with pytest.raises(Cancelled, match="viewer left"):
            await within(handle.result(), timeout_s=5.0)
        assert handle.state_name == "cancelled"
        stats = engine.stats()
        assert (stats.queue_depth, stats.running_loops, stats.paused_loops) == (0, 0, 0)
    finally:
        await within(engine.close(), timeout_s=10.0)


async def test_inputs_reach_the_loop_at_a_step_boundary(model: ToyModel) -> None:
    engine = make_engine()
    await engine.start()
    try:
        handle = engine.spawn(
            ToyDenoiseLoop(model),
            ToyRequest(seed=4),
            model,
            loop_id="i",
            priority=BATCH,
            on_emit=no_emit,
        )
        handle.push_input(InputEvent("scale", seq=7, payload=0.5))
        result = await within(handle.result())
        handle.push_input(InputEvent("scale", seq=8, payload=0.1))  # after the end: dropped
    finally:
        await engine.close()
    assert result.outputs["applied_seqs"] == [7]


@pytest.mark.parametrize("where", ["queued", "boundary"])
async def test_handle_snapshot_and_restore_continue_bit_identically(
    model: ToyModel, where: str
) -> None:
    request = ToyRequest(seed=6, num_steps=6)
    want, _ = await run_inline(ToyDenoiseLoop(model), request, model)
    engine = make_engine()
    await engine.start()
    first: list[int] = []
    second: list[int] = []
    try:
        handle = engine.spawn(
            ToyDenoiseLoop(model),
            request,
            model,
            loop_id="orig",
            priority=BATCH,
            on_emit=lambda e: first.append(e.spec.meta["step"]),
        )
        if where == "queued":  # paused with its next plan queued: the snapshot is immediate
            handle.pause()
            await until(lambda: engine.stats().queue_depth == 1)
        else:  # running: the snapshot is taken at its next step boundary
            await until(lambda: len(first) >= 2)
        blob = await handle.snapshot()
        handle.cancel("migrated")
        with pytest.raises(Cancelled, match="migrated"):
            await within(handle.result())
        restored = engine.spawn(
            ToyDenoiseLoop(model),
            None,
            model,
            loop_id="moved",
            priority=BATCH,
            on_emit=lambda e: second.append(e.spec.meta["step"]),
            restore_from=blob,
        )
        result = await within(restored.result())
    finally:
        await engine.close()
    at_step = restore_state(blob, ToyState).step
    assert torch.equal(result.outputs["x"], want.outputs["x"]) and result.outputs["steps"] == 6
    assert second == list(range(at_step, 6))
    assert first == list(range(len(first))) and len(first) >= at_step
    if where == "queued":
        assert at_step == 0 and first == []
    else:
        assert at_step >= 2


async def test_lead_limit_keeps_a_realtime_loop_behind_its_playout(model: ToyModel) -> None:
    starts: list[float] = []

    class StartSpy:
        def before_batch(self, info: BatchInfo) -> None:
            starts.append(time.monotonic())

        def after_batch(
            self, info: BatchInfo, outputs: Sequence[Any], wall_s: float
        ) -> Observation | None:
            return None

    engine = make_engine(max_lead_s=0.05, playout_buffer_s=0.0, observers=[StartSpy()])
    await engine.start()
    t0_s = time.monotonic()
    try:
        handle = engine.spawn(
            ToyDenoiseLoop(model),
            ToyRequest(seed=1, dt_media_s=0.05),
            model,
            loop_id="rt",
            priority=RT,
            on_emit=no_emit,
            media_t0_s=t0_s,
        )
        await within(handle.result())
    finally:
        await engine.close()
    # Step k is due at t0 + 0.05 k; it may start at most max_lead_s = 0.05 s before that.
    assert len(starts) == 6
    for k, start in enumerate(starts):
        assert start >= t0_s + 0.05 * k - 0.05 - 1e-3, (k, start - t0_s)


async def test_deadline_misses_are_counted_and_reported_to_admission(model: ToyModel) -> None:
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1, min_outcomes=3))
    engine = make_engine(admission=admission, max_lead_s=1000.0)
    await engine.start()
    try:
        late = engine.spawn(  # 3 chunks of 2 steps, all late
            ChunkedToyLoop(model),
            ToyRequest(seed=1),
            model,
            loop_id="late",
            priority=RT,
            on_emit=no_emit,
            media_t0_s=time.monotonic() - 100.0,
        )
        await within(late.result())
        ontime = engine.spawn(  # 2 chunks, on time
            ChunkedToyLoop(model),
            ToyRequest(seed=1, num_steps=4),
            model,
            loop_id="ok",
            priority=RT,
            on_emit=no_emit,
            media_t0_s=time.monotonic() + 100.0,
        )
        await within(ontime.result())
        stats = engine.stats()
    finally:
        await engine.close()
    assert (stats.deadline_misses, stats.deadlines_met) == (6, 4)
    # admission hears the plans after each loop's first chunk: 4 late, 2 on time
    assert admission.miss_ratio() == pytest.approx(4 / 6) and admission.tightened()


async def test_a_first_chunk_that_misses_does_not_tighten_admission(model: ToyModel) -> None:
    """A session's first chunk is due as its viewer connects: late by construction, and no
    sign of load; a burst of arrivals must not see a lowered capacity because of it."""
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1, min_outcomes=1))
    engine = make_engine(admission=admission, max_lead_s=1000.0)
    await engine.start()
    try:
        for k in range(3):
            first = engine.spawn(
                ChunkedToyLoop(model),
                ToyRequest(seed=k, num_steps=2),  # one chunk
                model,
                loop_id=f"s{k}",
                priority=RT,
                on_emit=no_emit,
                media_t0_s=time.monotonic() - 100.0,
            )
            await within(first.result())
        stats = engine.stats()
    finally:
        await engine.close()
    assert stats.deadline_misses == 6  # still counted as misses
    assert admission.miss_ratio() == 0.0 and not admission.tightened()


async def test_close_leaves_nothing_running_and_is_idempotent() -> None:
    engine = make_engine()
    await engine.start()
    op = GateOp()
    handle = engine.spawn(CountLoop(op), 100, None, loop_id="long", priority=BATCH, on_emit=no_emit)
    queued = engine.spawn(
        CountLoop(op), 100, None, loop_id="queued", priority=BATCH, on_emit=no_emit
    )
    await until(op.entered.is_set)
    closing = asyncio.create_task(engine.close())
    await asyncio.sleep(0.01)
    second = asyncio.create_task(engine.close())  # waits for the first close to finish
    await asyncio.sleep(0.01)
    assert not second.done() and engine.state.value == "closing"
    op.gate.set()
    await within(closing)
    await within(second)
    await engine.close()
    with pytest.raises(Cancelled, match="engine_closed"):
        await within(handle.result())
    with pytest.raises(Cancelled, match="engine_closed"):
        await within(queued.result())
    assert not engine.executor.is_alive()
    assert engine.state.value == "closed"
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == []
    with pytest.raises(EngineError, match="running engine"):
        engine.spawn(CountLoop(op), 1, None, loop_id="late", priority=BATCH, on_emit=no_emit)


async def test_spawn_rejects_duplicate_loop_ids() -> None:
    engine = make_engine()
    await engine.start()
    op = GateOp()
    try:
        engine.spawn(CountLoop(op), 1, None, loop_id="x", priority=BATCH, on_emit=no_emit)
        with pytest.raises(EngineError, match="already running"):
            engine.spawn(CountLoop(op), 1, None, loop_id="x", priority=BATCH, on_emit=no_emit)
    finally:
        op.gate.set()
        await engine.close()


async def test_failed_loop_releases_its_reservation() -> None:
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1))
    engine = make_engine(admission=admission)
    await engine.start()

    class Boom:
        name = "boom"
        batchable = False

        def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
            raise ValueError("kernel failed")

    verdict = admission.admit(AdmissionRequest("f", compute_gpu_s_per_s=0.5))
    assert isinstance(verdict, Admit)
    try:
        handle = engine.spawn(
            CountLoop(Boom()),
            3,
            None,
            loop_id="f",
            priority=BATCH,
            on_emit=no_emit,
            reservation_id=verdict.reservation_id,
        )
        with pytest.raises(LoopFailed, match="kernel failed") as info:
            await within(handle.result())
    finally:
        await engine.close()
    assert info.value.code == "step_exception"
    assert admission.usage().reservations == 0


class Later:
    """A ``PendingOutput`` produced when ``done`` is set (as a second-stream decode would be)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.done = threading.Event()

    def ready(self) -> bool:
        return self.done.is_set()

    def result(self) -> Any:
        if not self.done.wait(10.0):
            raise TimeoutError("never produced")
        return self.value


class DeferringOp:
    """Returns a ``Later`` for step 0 (and ``Bad`` ones if asked), plain outputs otherwise."""

    name = "defer"
    batchable = False

    def __init__(self, bad: bool = False) -> None:
        self.pending: list[Later] = []
        self.ran: list[int] = []
        self.bad = bad

    def __call__(self, args: Sequence[int], *, deterministic: bool = False) -> list[Any]:
        self.ran.extend(args)
        outs: list[Any] = []
        for step in args:
            if step == 0:
                self.pending.append(Later(RuntimeError("sink breaks") if self.bad else "frame-0"))
                outs.append(self.pending[-1])
            else:
                outs.append(f"frame-{step}")
        return outs


async def test_pending_outputs_let_the_loop_go_on_and_are_emitted_in_plan_order() -> None:
    engine = make_engine()
    await engine.start()
    op = DeferringOp()
    emitted: list[Any] = []
    try:
        handle = engine.spawn(
            CountLoop(op),
            3,
            None,
            loop_id="d",
            priority=BATCH,
            on_emit=lambda e: emitted.append(e.output),
        )
        await until(lambda: op.ran == [0, 1, 2])  # every plan ran while step 0 was pending
        await asyncio.sleep(0.05)
        assert emitted == [] and not handle.done  # ...and nothing overtook it
        op.pending[0].done.set()
        result = await within(handle.result())
    finally:
        await engine.close()
    assert emitted == ["frame-0", "frame-1", "frame-2"]
    assert result.outputs == {"steps": 3}


class PlainOp:
    """Returns each step's output at once."""

    name = "plain"
    batchable = False

    def __call__(self, args: Sequence[int], *, deterministic: bool = False) -> list[Any]:
        return [f"b-{step}" for step in args]


async def test_a_decode_left_on_the_device_does_not_hold_up_another_loops_steps() -> None:
    # session a's first decode stays on the device (a second stream); b's plans run meanwhile
    engine = make_engine()
    await engine.start()
    decoding = DeferringOp()
    a_out: list[Any] = []
    b_out: list[Any] = []
    try:
        a = engine.spawn(
            CountLoop(decoding),
            3,
            None,
            loop_id="a",
            priority=BATCH,
            on_emit=lambda e: a_out.append(e.output),
        )
        await until(lambda: len(decoding.pending) == 1)
        b = engine.spawn(
            CountLoop(PlainOp()),
            4,
            None,
            loop_id="b",
            priority=BATCH,
            on_emit=lambda e: b_out.append(e.output),
        )
        await within(b.result())
        assert b_out == ["b-0", "b-1", "b-2", "b-3"]
        assert a_out == [] and not a.done  # a's frames wait for its decode, in order
        decoding.pending[0].done.set()
        await within(a.result())
    finally:
        await engine.close()
    assert a_out == ["frame-0", "frame-1", "frame-2"]


async def test_a_sink_failing_on_a_deferred_emission_fails_the_loop() -> None:
    engine = make_engine()
    await engine.start()
    op = DeferringOp(bad=True)

    def sink(emission: Emission) -> None:
        if isinstance(emission.output, Exception):
            raise emission.output

    try:
        handle = engine.spawn(CountLoop(op), 3, None, loop_id="e", priority=BATCH, on_emit=sink)
        await until(lambda: len(op.pending) == 1)
        op.pending[0].done.set()
        with pytest.raises(LoopFailed, match="sink breaks") as info:
            await within(handle.result())
    finally:
        await engine.close()
    assert info.value.code == "emit_failed"


async def test_inline_runs_resolve_pending_outputs() -> None:
    op = DeferringOp()
    loop = CountLoop(op)

    async def produce() -> None:
        await until(lambda: len(op.pending) == 1)
        op.pending[0].done.set()

    producer = asyncio.create_task(produce())
    result, emissions = await within(
        asyncio.to_thread(lambda: asyncio.run(run_inline(loop, 2, None)))
    )
    await producer
    assert [e.output for e in emissions] == ["frame-0", "frame-1"] and result.outputs["steps"] == 2


# --------------------------------------------------------------------------------------------
# scheduling policies end to end


class ChunkedToyLoop(ToyDenoiseLoop):
    """The toy loop with sessions' chunk structure: every second step emits a chunk's final
    media (``final`` False on the step before, like a first decode part)."""

    def next(self, state: ToyState) -> WorkPlan | Done:
        plan = super().next(state)
        if isinstance(plan, Done):
            return plan
        media = EmitSpec("media", {"chunk": state.step // 2, "final": state.step % 2 == 1})
        return dataclasses.replace(plan, emits=(*plan.emits, media))


class StepNames:
    """Observer naming every executed plan ``<loop><index>`` in execution order."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self._counts: dict[str, int] = {}

    def before_batch(self, info: BatchInfo) -> None:
        for loop_id in info.loop_ids:
            index = self._counts.get(loop_id, 0)
            self._counts[loop_id] = index + 1
            self.order.append(f"{loop_id}{index}")

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[Any], wall_s: float
    ) -> Observation | None:
        return None


class Reports:
    def __init__(self) -> None:
        self.reports: list[BatchReport] = []

    def batch_done(self, report: BatchReport) -> None:
        self.reports.append(report)


async def run_two_sessions_and_a_job(
    model: ToyModel, scheduler: Any
) -> tuple[dict[str, torch.Tensor], list[str], Engine, Reports]:
    names, reports = StepNames(), Reports()
    engine = make_engine(
        scheduler=scheduler, deterministic=True, observers=[names], listeners=[reports]
    )
    await engine.start()
    try:
        spawned = {
            "A": (ChunkedToyLoop(model), ToyRequest(seed=1), RT),
            "B": (ChunkedToyLoop(model), ToyRequest(seed=2), RT),
            "J": (ToyDenoiseLoop(model), ToyRequest(seed=3), BATCH),
        }
        handles = {
            loop_id: engine.spawn(
                loop, request, model, loop_id=loop_id, priority=priority, on_emit=no_emit
            )
            for loop_id, (loop, request, priority) in spawned.items()
        }
        results = {k: (await within(h.result())).outputs["x"] for k, h in handles.items()}
    finally:
        await engine.close()
    return results, names.order, engine, reports


@pytest.mark.parametrize("policy", SCHEDULER_POLICIES)
async def test_every_policy_runs_sessions_and_a_job_to_the_solo_results(
    model: ToyModel, policy: str
) -> None:
    scheduler = make_scheduler(policy)
    results, order, engine, reports = await run_two_sessions_and_a_job(model, scheduler)
    assert engine.scheduler is scheduler
    for loop_id, seed in (("A", 1), ("B", 2), ("J", 3)):
        solo, _ = await run_inline(ToyDenoiseLoop(model), ToyRequest(seed=seed), model)
        assert torch.equal(results[loop_id], solo.outputs["x"]), loop_id
    assert sorted(order) == sorted(f"{k}{i}" for k in "ABJ" for i in range(6))
    stats = engine.stats()
    assert stats.plans_executed == 18 and stats.loops_succeeded == 3
    assert sum(len(r.step_wall_s) for r in reports.reports) == 18
    assert len(reports.reports) == stats.batches_executed


async def test_engine_with_chunk_rr_gives_sessions_whole_chunks_in_turn(model: ToyModel) -> None:
    _, order, _, _ = await run_two_sessions_and_a_job(model, ChunkRoundRobinScheduler())
    assert order == [
        "A0", "A1", "B0", "B1",
        "J0", "J1", "J2", "J3", "J4", "J5",  # the job emits no media: one turn, its whole run
        "A2", "A3", "B2", "B3", "A4", "A5", "B4", "B5",
    ]  # fmt: skip


async def test_engine_with_fifo_runs_each_loop_to_completion_in_arrival_order(
    model: ToyModel,
) -> None:
    _, order, _, _ = await run_two_sessions_and_a_job(model, FifoScheduler())
    assert order == [f"{k}{i}" for k in "ABJ" for i in range(6)]


async def test_engine_with_step_edf_interleaves_the_sessions_step_by_step(
    model: ToyModel,
) -> None:
    _, order, _, _ = await run_two_sessions_and_a_job(model, StepEdfScheduler(max_batch=1))
    sessions = [name for name in order if name[0] in "AB"]
    # equal media times: EDF alternates the two sessions (running loops first at a tie)
    assert [name[0] for name in sessions] == list("AB" * 6)
