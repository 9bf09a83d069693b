"""The engine on CUDA: the interleave gate with the toy denoiser on the GPU, and the
Profiler's CUDA-event timing reaching ``StepResult.device_s``. Skipped without CUDA.

Written as sync tests around ``asyncio.run`` so they run where pytest-asyncio is absent.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.contract import Emission, Priority
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.observers import Profiler
from tests.runtime.test_interleave import alone, assert_same_loops, concurrently
from tests.runtime.toy_loops import ToyDenoiseLoop, ToyDenoiser, ToyModel, ToyRequest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_model() -> ToyModel:
    return ToyModel(ToyDenoiser(seed=42), device=torch.device("cuda"))


def test_interleave_gate_on_cuda(cuda_model: ToyModel) -> None:
    async def scenario() -> None:
        want = await alone(cuda_model)
        assert all(x.is_cuda for x, _ in want.values())
        got, spy, _ = await concurrently(cuda_model, max_batch=1)
        assert_same_loops(got, want, exact=True)
        assert len({ids[0] for ids in spy.batches[:3]}) == 3  # interleaved
        got, spy, _ = await concurrently(cuda_model, max_batch=3)
        assert_same_loops(got, want, exact=False)
        assert {len(ids) for ids in spy.batches} == {3}
        got, spy, _ = await concurrently(cuda_model, max_batch=3, deterministic=True)
        assert_same_loops(got, want, exact=True)

    asyncio.run(scenario())


def test_profiler_reports_cuda_event_time(cuda_model: ToyModel) -> None:
    async def scenario() -> tuple[list[float | None], Profiler]:
        cost = CostModel()
        profiler = Profiler(cost)
        engine = Engine(cost=cost, observers=[profiler], max_lead_s=10.0)
        await engine.start()
        device_s: list[float | None] = []

        class Recording(ToyDenoiseLoop):
            def advance(self, state, result):  # type: ignore[no-untyped-def]
                device_s.append(result.device_s)
                return super().advance(state, result)

        def sink(emission: Emission) -> None:
            return None

        try:
            handle = engine.spawn(
                Recording(cuda_model),
                ToyRequest(seed=1),
                cuda_model,
                loop_id="g",
                priority=Priority.BATCH,
                on_emit=sink,
            )
            await asyncio.wait_for(handle.result(), 60.0)
        finally:
            await engine.close()
        return device_s, profiler

    device_s, profiler = asyncio.run(scenario())
    assert len(device_s) == 6 and all(d is not None and d > 0 for d in device_s)
    summary = profiler.device_summary()["diffusion_step"]
    assert summary.count == 6 and summary.median_s > 0
    assert profiler.summary()["diffusion_step"].count == 6
