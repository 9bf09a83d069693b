"""Boundary calls, forks and the input log through the real engine (one executor thread).

A two-plan-per-chunk loop: each plan adds its index to a tensor; the second plan of a chunk
emits that chunk's final media. ``at_boundary(after_chunk=True)`` must see the state between
chunks only; ``fork_from`` must continue a live state exactly (the fork's own ``offset`` then
changes what it adds); the input log must name the step each input was absorbed at.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import torch

from runtime.contract import (
    Done,
    EmitSpec,
    InputEvent,
    LoopResult,
    LoopState,
    PlanKind,
    Priority,
    StepResult,
    WorkPlan,
)
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.loop_handle import LoopStatusError
from runtime.snapshot import clone_state

PLANS_PER_CHUNK = 2


class Acc(LoopState, kw_only=True):
    total: torch.Tensor  # [1]
    limit: int
    offset: int = 0
    seen: list[int] = []


class AddOp:
    name = "add"
    batchable = False

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        return [total + value for total, value in args]


class ChunkedAdd:
    name = "chunked_add"
    state_type = Acc

    def __init__(self) -> None:
        self.op = AddOp()

    def init(self, request: int, model: Any, ctx: Any) -> Acc:
        return Acc(total=torch.zeros(1), limit=request)

    def absorb(self, state: Acc, inputs: Sequence[InputEvent]) -> Acc:
        return msgspec.structs.replace(state, seen=[*state.seen, *(e.seq for e in inputs)])

    def next(self, state: Acc) -> WorkPlan | Done:
        if state.step >= state.limit:
            return Done()
        final = state.step % PLANS_PER_CHUNK == PLANS_PER_CHUNK - 1
        return WorkPlan(
            loop_id="acc",
            kind=PlanKind.HOST,
            op=self.op,
            args=(state.total, float(state.step + state.offset)),
            shape_sig="1",
            emits=(EmitSpec("media", {"final": final, "step": state.step}),),
        )

    def advance(self, state: Acc, result: StepResult) -> Acc:
        return msgspec.structs.replace(state, total=result.output, step=state.step + 1)

    def finalize(self, state: Acc) -> LoopResult:
        return LoopResult({"total": float(state.total), "seen": list(state.seen)})

    def fork(self, state: Acc, request: int, model: Any) -> Acc:
        return msgspec.structs.replace(state, total=state.total.clone(), offset=request)


async def within(awaitable: Any, timeout_s: float = 20.0) -> Any:
    return await asyncio.wait_for(awaitable, timeout_s)


@pytest.fixture
async def engine() -> Any:
    eng = Engine(cost=CostModel(), max_lead_s=10.0)
    await eng.start()
    yield eng
    await eng.close()


def spawn(engine: Engine, loop_id: str, limit: int = 8, **kwargs: Any) -> Any:
    request = kwargs.pop("request", limit)  # a fork's request: its offset
    return engine.spawn(
        ChunkedAdd(),
        request,
        None,
        loop_id=loop_id,
        priority=Priority.BATCH,
        on_emit=kwargs.pop("on_emit", lambda e: None),
        **kwargs,
    )


async def test_after_chunk_calls_see_only_states_between_chunks(engine: Engine) -> None:
    handle = spawn(engine, "a", limit=10)
    steps = [await within(handle.at_boundary(lambda s: s.step, after_chunk=True))]
    for _ in range(3):
        steps.append(await within(handle.at_boundary(lambda s: s.step, after_chunk=True)))
    any_step = await within(handle.at_boundary(lambda s: s.step))
    await within(handle.result())
    assert steps[0] == 0 and all(s % PLANS_PER_CHUNK == 0 for s in steps), steps
    assert steps == sorted(steps) and 0 <= any_step <= 10
    late = handle.at_boundary(lambda s: s.step)
    with pytest.raises(LoopStatusError):
        await within(late)


async def test_a_paused_loop_at_a_chunk_boundary_answers_at_once_and_advance_runs_it_there(
    engine: Engine,
) -> None:
    emitted: list[dict[str, Any]] = []
    handle = spawn(engine, "b", limit=12, on_emit=lambda e: emitted.append(e.spec.meta))
    await within(handle.at_boundary(lambda s: s.step, after_chunk=True))
    handle.pause()
    await asyncio.sleep(0.05)
    stopped = len(emitted)
    if stopped % PLANS_PER_CHUNK == 0:  # paused between chunks: no progress needed
        assert await within(handle.at_boundary(lambda s: s.step, after_chunk=True)) == stopped
    step = await within(handle.at_boundary(lambda s: s.step, after_chunk=True, advance=True))
    await asyncio.sleep(0.05)
    assert step % PLANS_PER_CHUNK == 0 and step >= stopped
    assert len(emitted) == step and handle.paused, "advanced to the boundary and paused again"
    handle.cancel("done")


async def test_fork_from_continues_the_live_state_and_the_input_log_names_steps(
    engine: Engine,
) -> None:
    logged: list[tuple[int, list[int]]] = []
    parent = spawn(engine, "parent", limit=8)
    parent.set_input_log(lambda step, inputs: logged.append((step, [e.seq for e in inputs])))
    parent.pause()
    children: list[Any] = []

    def fork(state: Acc) -> int:
        parent.pause()
        for loop_id, offset in (("same", 0), ("other", 100)):
            children.append(spawn(engine, loop_id, limit=8, fork_from=state, request=offset))
        return state.step

    at = await within(parent.at_boundary(fork, after_chunk=True, advance=True))
    parent.push_input(InputEvent("scale", 1, None, 0.0))
    parent.resume()
    results = [await within(h.result()) for h in (parent, *children)]
    assert at % PLANS_PER_CHUNK == 0
    want = float(sum(range(8)))
    assert results[0].outputs["total"] == want == results[1].outputs["total"]  # exact copy
    assert results[2].outputs["total"] == want + 100 * (8 - at)  # its own offset from there
    assert logged and logged[0][1] == [1] and logged[0][0] >= at
    assert results[0].outputs["seen"] == [1] and results[1].outputs["seen"] == []


def test_clone_state_is_independent_of_the_original() -> None:
    base = torch.arange(6.0)
    state = Acc(total=base[2:3], limit=3, seen=[1])
    copy = clone_state(state)
    base.zero_()
    assert float(copy.total) == 2.0 and copy.seen == [1] and copy.limit == 3
