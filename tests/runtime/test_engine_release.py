"""A finished loop's handle keeps its result and status, not the loop's state: owners keep
handles long after the loop ended (a job stays listed), and the driver holds the latents,
the chunk-KV views, the rollout and its last plan."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
import torch

from runtime.contract import ActionInput, Cancelled, InputEvent, InputKind, LoopFailed, Priority
from runtime.cost import CostModel
from runtime.engine import Engine
from tests.runtime.toy_loops import ToyDenoiseLoop, ToyDenoiser, ToyModel, ToyRequest


@pytest.mark.parametrize("end", ["succeeded", "cancelled", "failed"])
async def test_a_finished_loop_keeps_no_state(end: str) -> None:
    model = ToyModel(ToyDenoiser(seed=3))
    engine = Engine(cost=CostModel(), max_lead_s=10.0)
    await engine.start()
    try:
        poison = {"poison_step": 2, "poison": "raise"} if end == "failed" else {}
        request = ToyRequest(seed=1, **poison)
        handle = engine.spawn(
            ToyDenoiseLoop(model),
            request,
            model,
            loop_id="a",
            priority=Priority.BATCH,
            on_emit=lambda emission: None,
        )
        driver = weakref.ref(handle._record.driver)
        if end == "cancelled":
            handle.push_input(InputEvent(kind=InputKind.ACTION, seq=1, payload=ActionInput()))
            handle.cancel("deleted")
        try:
            result = await asyncio.wait_for(handle.result(), 20.0)
        except (Cancelled, LoopFailed):
            result = None
    finally:
        await engine.close()
    gc.collect()
    assert driver() is None, gc.get_referrers(driver())  # the state went with the driver
    assert handle._record.inputs == type(handle._record.inputs)()
    assert handle.done and handle.state_name == end  # the handle still answers
    if end == "succeeded":
        assert isinstance((await handle.result()).outputs["x"], torch.Tensor)
    else:
        assert result is None
