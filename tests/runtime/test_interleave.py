"""THE INTERLEAVE GATE (docs/architecture.md §3 "Batching", §7 "gate"): loops sharing one
model through the engine, interleaved step by step or batched, produce what each produces alone.

- interleaved (max_batch=1): bit-identical (torch.equal) to each loop run alone;
- batched (max_batch=3): equal within the stated tolerance BATCHED_RTOL / BATCHED_ATOL;
- batched with deterministic=True: bit-identical.

Each run also proves the schedule it claims (the executed order alternates between loops,
batches really held 3 plans), otherwise the gate could pass without interleaving anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from runtime.contract import Emission, Priority
from runtime.cost import CostModel
from runtime.driver import run_inline
from runtime.engine import Engine
from runtime.observers import BatchInfo, NaNWatch, Observation
from runtime.step_edf import StepEdfScheduler
from tests.runtime.toy_loops import ToyDenoiseLoop, ToyDenoiser, ToyModel, ToyRequest

# Stated tolerance for batched (non-deterministic) execution: float32 GEMMs over a batch may
# block/accumulate differently from a batch of one; over 6 steps this stays far below 1e-5
# relative (plus 1e-6 absolute for entries near zero).
BATCHED_RTOL = 1e-5
BATCHED_ATOL = 1e-6

SEEDS = (3, 5, 8)
STEPS = 6


async def within(awaitable: Any, timeout_s: float = 20.0) -> Any:
    """Await with a bound, so a runtime bug fails the test instead of hanging the suite."""
    return await asyncio.wait_for(awaitable, timeout_s)


class OrderSpy:
    """Observer recording which loops every executed batch held."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, ...]] = []

    def before_batch(self, info: BatchInfo) -> None:
        self.batches.append(info.loop_ids)

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[Any], wall_s: float
    ) -> Observation | None:
        return None


@pytest.fixture(scope="module")
def model() -> ToyModel:
    return ToyModel(ToyDenoiser(seed=42))


def requests() -> dict[str, ToyRequest]:
    return {f"loop{seed}": ToyRequest(seed=seed, num_steps=STEPS, churn=0.6) for seed in SEEDS}


async def alone(model: ToyModel) -> dict[str, tuple[torch.Tensor, list[torch.Tensor]]]:
    out = {}
    for loop_id, request in requests().items():
        result, emissions = await run_inline(ToyDenoiseLoop(model), request, model, loop_id=loop_id)
        out[loop_id] = (result.outputs["x"], [e.output.x for e in emissions])
    return out


async def concurrently(
    model: ToyModel, *, max_batch: int, deterministic: bool = False
) -> tuple[dict[str, tuple[torch.Tensor, list[torch.Tensor]]], OrderSpy, Engine]:
    spy = OrderSpy()
    engine = Engine(
        cost=CostModel(),
        scheduler=StepEdfScheduler(max_batch=max_batch),
        deterministic=deterministic,
        observers=[spy, NaNWatch()],
        max_lead_s=10.0,
    )
    await engine.start()
    t0_s = time.monotonic()
    emitted: dict[str, list[torch.Tensor]] = {}
    handles = {}
    try:
        for loop_id, request in requests().items():
            emitted[loop_id] = []
            sink = emitted[loop_id]

            def on_emit(emission: Emission, sink: list[torch.Tensor] = sink) -> None:
                sink.append(emission.output.x)

            handles[loop_id] = engine.spawn(
                ToyDenoiseLoop(model),
                request,
                model,
                loop_id=loop_id,
                priority=Priority.REALTIME,
                on_emit=on_emit,
                media_t0_s=t0_s,
            )
        results = {loop_id: await within(h.result()) for loop_id, h in handles.items()}
    finally:
        await engine.close()
    return {k: (results[k].outputs["x"], emitted[k]) for k in handles}, spy, engine


def assert_same_loops(got: dict[str, Any], want: dict[str, Any], *, exact: bool) -> None:
    assert set(got) == set(want)
    for loop_id, (x, trajectory) in want.items():
        got_x, got_trajectory = got[loop_id]
        assert len(got_trajectory) == len(trajectory) == STEPS
        for a, b in zip([got_x, *got_trajectory], [x, *trajectory], strict=True):
            if exact:
                assert torch.equal(a, b), f"{loop_id}: max diff {(a - b).abs().max().item()}"
            else:
                torch.testing.assert_close(a, b, rtol=BATCHED_RTOL, atol=BATCHED_ATOL)


async def test_interleaved_loops_are_bit_identical_to_each_run_alone(model: ToyModel) -> None:
    want = await alone(model)
    got, spy, engine = await concurrently(model, max_batch=1)
    assert_same_loops(got, want, exact=True)
    # The executed order really alternates: EDF with equal media anchors is round robin.
    order = [loop_ids[0] for loop_ids in spy.batches]
    assert all(len(b) == 1 for b in spy.batches)
    assert order == [f"loop{s}" for s in SEEDS] * STEPS
    assert engine.stats().plans_executed == 3 * STEPS


async def test_batched_loops_agree_within_tolerance(model: ToyModel) -> None:
    want = await alone(model)
    model.op.calls.clear()
    got, spy, engine = await concurrently(model, max_batch=3)
    assert_same_loops(got, want, exact=False)
    assert spy.batches == [tuple(f"loop{s}" for s in SEEDS)] * STEPS
    assert model.op.calls == [3] * STEPS  # one batched forward per step
    assert engine.stats().batches_executed == STEPS


async def test_batched_loops_are_bit_identical_in_deterministic_mode(model: ToyModel) -> None:
    want = await alone(model)
    model.op.calls.clear()
    got, spy, engine = await concurrently(model, max_batch=3, deterministic=True)
    assert_same_loops(got, want, exact=True)
    assert spy.batches == [tuple(f"loop{s}" for s in SEEDS)] * STEPS  # batched by the scheduler
    assert model.op.calls == [1] * (3 * STEPS)  # executed item by item by the op
    assert engine.stats().batches_executed == STEPS


class SmearingOp:
    """The bug the gate exists for: per-request state kept on a shared object (here, the last
    velocity, like a module-global residual cache). Alone it is harmless; interleaved, one
    loop's residual leaks into another's step."""

    name = "toy_euler_smearing"
    batchable = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last_x: torch.Tensor | None = None

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        outs = self.inner(args, deterministic=deterministic)
        smeared = []
        for out in outs:
            x = out.x if self.last_x is None else out.x + 0.01 * self.last_x
            self.last_x = out.x
            smeared.append(type(out)(x, out.rng_state))
        return smeared


async def test_gate_detects_cross_request_state_smearing(model: ToyModel) -> None:
    smearing = ToyModel(model.denoiser)
    smearing.op = SmearingOp(smearing.op)  # type: ignore[assignment]
    want = {}
    for loop_id, request in requests().items():
        smearing.op.last_x = None  # type: ignore[attr-defined]
        result, _ = await run_inline(ToyDenoiseLoop(smearing), request, smearing, loop_id=loop_id)
        want[loop_id] = result.outputs["x"]
    smearing.op.last_x = None  # type: ignore[attr-defined]
    got, spy, _ = await concurrently(smearing, max_batch=1)
    assert [ids[0] for ids in spy.batches][:3] == [f"loop{s}" for s in SEEDS]
    assert not any(torch.equal(got[k][0], want[k]) for k in want)
