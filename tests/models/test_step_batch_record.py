"""A chunk's record says the largest batch its denoising steps ran in (``step_batch``): a batched
step agrees with a solo one only within the batched tolerance, so a replay of that chunk is not
expected to be bit-identical; a restarted chunk counts only the attempt that was decoded."""

from __future__ import annotations

import pytest

from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.contract import Done, PlanKind, StepResult


@pytest.fixture(scope="module")
def instance():
    return load_instance(get("wan-tiny-random"), device="cpu")


def captures(instance, batches: list[int]) -> list[int]:
    """Run two chunks, the i-th denoising step reported as run in a batch of ``batches[i]``;
    -> the ``step_batch`` of each chunk's record."""
    loop = instance.loop("chunk_rollout")
    state = loop.init(SessionRequest(prompt="a red ball", seed=2, max_chunks=2), instance)
    steps, found = iter(batches), []
    while not isinstance(plan := loop.next(state), Done):
        (output,) = plan.op([plan.args])
        size = next(steps) if plan.kind is PlanKind.CHUNK_STEP else 1
        for spec in plan.emits:
            capture = getattr(spec.meta, "capture", None)
            if capture is not None:
                found.append(capture["step_batch"])
        state = loop.advance(state, StepResult(output, 0.0, batch_size=size, kind=plan.kind))
    return found


def test_the_record_names_the_largest_batch_of_the_chunks_steps(instance) -> None:
    assert captures(instance, [1, 1, 1, 1, 1, 3, 2, 1]) == [1, 3]
    assert captures(instance, [2, 1, 1, 1, 1, 1, 1, 1]) == [2, 1]  # counted anew per chunk
