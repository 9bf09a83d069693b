"""Driver: the loop contract, snapshots at step boundaries, failure codes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import torch

from runtime.contract import (
    Done,
    EmitSpec,
    InputEvent,
    LoopFailed,
    LoopResult,
    LoopState,
    PlanKind,
    StepResult,
    WorkPlan,
)
from runtime.driver import (
    Driver,
    DriverPhase,
    DriverPhaseError,
    InlineContext,
    SnapshotError,
    restore_state,
    run_inline,
    snapshot_state,
)
from tests.runtime.toy_loops import ToyDenoiseLoop, ToyDenoiser, ToyModel, ToyRequest, ToyState


class Tensors(LoopState, kw_only=True):
    a: torch.Tensor
    maybe: torch.Tensor | None = None
    named: dict[str, torch.Tensor] = {}
    listed: list[torch.Tensor] = []
    loose: Any = None
    note: str = ""


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.dtype.is_floating_point else t


@pytest.fixture(scope="module")
def model() -> ToyModel:
    return ToyModel(ToyDenoiser(seed=0))


def test_snapshot_roundtrip_keeps_dtype_shape_and_bits() -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, generator=gen)
    shared = torch.arange(5)
    state = Tensors(
        step=3,
        a=base.t()[1:3],  # non-contiguous view
        maybe=torch.randn(3, generator=gen).to(torch.bfloat16),
        named={
            "half": torch.randn(2, 2, generator=gen).half(),
            "bool": torch.tensor([True, False]),
            "u8": torch.Generator().manual_seed(2).get_state(),
            "scalar": torch.tensor(float("nan")),
            "shared": shared,
        },
        listed=[shared, torch.empty(0, 3)],
        loose={"feat": [torch.ones(2, dtype=torch.int8)], "n": 3},
        note="x",
    )
    back = restore_state(snapshot_state(state), Tensors)
    assert back.step == 3 and back.note == "x"
    assert back.a.dtype == torch.float32 and back.a.shape == (2, 4) and torch.equal(back.a, state.a)
    assert (
        back.maybe is not None
        and back.maybe.dtype == torch.bfloat16
        and torch.equal(back.maybe, state.maybe)
    )
    for name, t in state.named.items():
        got = back.named[name]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(bits(got), bits(t))  # exact bits, NaN included
    assert back.listed[0] is back.named["shared"]  # one object stays one object
    assert back.listed[1].shape == (0, 3)
    assert back.loose["n"] == 3 and back.loose["feat"][0].dtype == torch.int8
    assert torch.equal(back.loose["feat"][0], torch.ones(2, dtype=torch.int8))
    assert restore_state(snapshot_state(Tensors(a=torch.zeros(1))), Tensors).maybe is None


def test_snapshot_is_a_copy_not_a_view() -> None:
    t = torch.zeros(3)
    blob = snapshot_state(Tensors(a=t))
    t.add_(1)
    assert torch.equal(restore_state(blob, Tensors).a, torch.zeros(3))


def test_tensors_sharing_storage_are_restored_independently() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = Tensors(a=base[0], named={"row1": base[1], "all": base})  # three views, one storage
    back = restore_state(snapshot_state(state), Tensors)
    assert torch.equal(back.a, base[0]) and torch.equal(back.named["row1"], base[1])
    back.named["all"].zero_()
    assert torch.equal(back.a, base[0])  # no longer aliased after the round trip


def test_snapshot_rejects_unserializable_fields_and_wrong_types() -> None:
    class Bad(LoopState, kw_only=True):
        thing: Any

    with pytest.raises(SnapshotError, match="Generator"):
        snapshot_state(Bad(thing=torch.Generator()))
    blob = snapshot_state(Tensors(a=torch.zeros(1)))
    with pytest.raises(SnapshotError, match="Tensors"):
        restore_state(blob, ToyState)
    with pytest.raises(SnapshotError, match="not a loop-state snapshot"):
        restore_state(b"garbage", Tensors)


async def run_uninterrupted(model: ToyModel, request: ToyRequest) -> tuple[LoopResult, list[Any]]:
    return await run_inline(ToyDenoiseLoop(model), request, model, loop_id="ref")


@pytest.mark.parametrize("k", [0, 2, 5])
async def test_snapshot_at_step_k_then_restore_equals_uninterrupted_run(
    model: ToyModel, k: int
) -> None:
    request = ToyRequest(seed=11, num_steps=6, churn=0.7)
    ref, ref_emissions = await run_uninterrupted(model, request)

    loop = ToyDenoiseLoop(model)
    first_ctx = InlineContext("a")
    first = Driver(loop, first_ctx)
    first.init(request, model)
    for _ in range(k):
        assert await first.step()
    assert first.phase is DriverPhase.BOUNDARY
    blob = first.snapshot()
    del first  # the original process "dies" here

    second_ctx = InlineContext("b")
    second = Driver.from_snapshot(loop, second_ctx, blob, ToyState)
    assert second.phase is DriverPhase.BOUNDARY and second.state.step == k
    result = await second.run()
    assert second.phase is DriverPhase.DONE
    assert torch.equal(result.outputs["x"], ref.outputs["x"])
    assert result.outputs["steps"] == ref.outputs["steps"] == 6
    emissions = first_ctx.emissions + second_ctx.emissions
    assert [e.spec.meta["step"] for e in emissions] == [e.spec.meta["step"] for e in ref_emissions]
    for got, want in zip(emissions, ref_emissions, strict=True):
        assert torch.equal(got.output.x, want.output.x)
        assert torch.equal(got.output.rng_state, want.output.rng_state)


async def test_snapshot_outside_a_boundary_names_the_phase(model: ToyModel) -> None:
    loop = ToyDenoiseLoop(model)
    driver: Driver[ToyState] | None = None
    seen: list[str] = []

    class Peeking(InlineContext):
        async def execute(self, plan: WorkPlan) -> StepResult:
            with pytest.raises(DriverPhaseError, match="current phase is 'executing'") as info:
                driver.snapshot()  # type: ignore[union-attr]
            seen.append(info.value.phase.value)
            return await super().execute(plan)

    driver = Driver(loop, Peeking("p"))
    with pytest.raises(DriverPhaseError, match="'created'"):
        driver.snapshot()
    await driver.run(ToyRequest(seed=1, num_steps=2), model)
    assert seen == ["executing", "executing"]
    with pytest.raises(DriverPhaseError, match="'done'"):
        driver.snapshot()


async def test_on_boundary_hook_runs_before_every_step(model: ToyModel) -> None:
    phases: list[tuple[str, int]] = []

    def hook(d: Driver[ToyState]) -> None:
        phases.append((d.phase.value, d.state.step))
        d.snapshot()  # allowed here

    driver = Driver(ToyDenoiseLoop(model), InlineContext("h"), on_boundary=hook)
    await driver.run(ToyRequest(seed=1, num_steps=3), model)
    assert phases == [("boundary", 0), ("boundary", 1), ("boundary", 2), ("boundary", 3)]
    assert driver.steps_run == 3 and driver.done_reason == "complete"


async def test_inputs_reach_absorb_at_the_boundary(model: ToyModel) -> None:
    ctx = InlineContext("in")
    ctx.push_input(InputEvent("scale", seq=4, payload=0.5))
    driver = Driver(ToyDenoiseLoop(model), ctx)
    result = await driver.run(ToyRequest(seed=1, num_steps=2), model)
    assert result.outputs["applied_seqs"] == [4]
    assert [plan.args.scale for plan in ctx.executed] == [0.5, 0.5]


async def test_bad_input_kind_fails_with_bad_input(model: ToyModel) -> None:
    ctx = InlineContext("in")
    ctx.push_input(InputEvent("audio", seq=1, payload=[0.0]))
    with pytest.raises(LoopFailed) as info:
        await Driver(ToyDenoiseLoop(model), ctx).run(ToyRequest(seed=1, num_steps=2), model)
    assert info.value.code == "bad_input" and "audio" in info.value.message


class Counter(LoopState, kw_only=True):
    limit: int = 2


class _NoOp:
    name = "noop"
    batchable = True

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        return list(args)


class NoAbsorbLoop:
    """Has no absorb method at all."""

    name = "no_absorb"

    def init(self, request: Any, model: Any, ctx: Any) -> Counter:
        return Counter()

    def next(self, state: Counter) -> WorkPlan | Done:
        if state.step >= state.limit:
            return Done("limit")
        return WorkPlan(
            loop_id="x",
            kind=PlanKind.HOST,
            op=_NoOp(),
            args=state.step,
            shape_sig="",
            emits=(EmitSpec("progress"),),
        )

    def advance(self, state: Counter, result: StepResult) -> Counter:
        return msgspec.structs.replace(state, step=state.step + 1)

    def finalize(self, state: Counter) -> LoopResult:
        return LoopResult({"steps": state.step})


async def test_loop_without_absorb_fails_on_inputs_but_runs_without() -> None:
    result, emissions = await run_inline(NoAbsorbLoop(), None, None)
    assert result.outputs == {"steps": 2} and [e.output for e in emissions] == [0, 1]
    ctx = InlineContext("n")
    ctx.push_input(InputEvent("prompt", seq=1, payload="hi"))
    with pytest.raises(LoopFailed) as info:
        await Driver(NoAbsorbLoop(), ctx).run()
    assert info.value.code == "bad_input" and "prompt" in info.value.message


@pytest.mark.parametrize(
    ("method", "code"),
    [
        ("next", "loop_exception"),
        ("advance", "bad_state"),
        ("finalize", "bad_result"),
        ("init", "loop_exception"),
    ],
)
async def test_loop_method_faults_are_structured(method: str, code: str) -> None:
    class Broken(NoAbsorbLoop):
        def init(self, request: Any, model: Any, ctx: Any) -> Counter:
            if method == "init":
                raise KeyError("cfg")
            return Counter()

        def next(self, state: Counter) -> WorkPlan | Done:
            if method == "next" and state.step == 1:
                raise ZeroDivisionError("oops")
            return super().next(state)

        def advance(self, state: Counter, result: StepResult) -> Any:
            return None if method == "advance" else super().advance(state, result)

        def finalize(self, state: Counter) -> Any:
            return {"not": "a LoopResult"} if method == "finalize" else super().finalize(state)

    driver = Driver(Broken(), InlineContext("b"))
    with pytest.raises(LoopFailed) as info:
        await driver.run()
    assert info.value.code == code and info.value.loop_id == "b"
    assert driver.phase is DriverPhase.FAILED


async def test_emit_sink_failure_is_emit_failed() -> None:
    def sink(emission: Any) -> None:
        raise OSError("queue closed")

    with pytest.raises(LoopFailed) as info:
        await Driver(NoAbsorbLoop(), InlineContext("e", on_emit=sink)).run()
    assert info.value.code == "emit_failed" and "queue closed" in info.value.message
