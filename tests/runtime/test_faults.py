"""FaultInjector: arms one loop's next denoising step; the executor's isolation does the rest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from runtime.executor import ExecJob, Executor
from runtime.faults import FaultInjector
from runtime.observers import BatchInfo, NaNWatch


class Step:
    """A denoising step: a fresh output tensor per plan."""

    name = "chunk_step"
    batchable = True

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        return [torch.full((2, 3), float(a)) for a in args]


def step_job(loops: Sequence[str], kind: str = "chunk_step", first_plan: int = 0) -> ExecJob:
    n = len(loops)
    return ExecJob(
        info=BatchInfo(
            batch_id=first_plan,
            kind=kind,
            shape_sig="s",
            instance_id="i",
            op_name="chunk_step",
            plan_ids=tuple(range(first_plan, first_plan + n)),
            loop_ids=tuple(loops),
        ),
        op=Step(),
        args=tuple(range(1, n + 1)),
        plan_flops=(0.0,) * n,
    )


@pytest.mark.parametrize(
    ("kind", "code"), [("nan", "nan"), ("exception", "step_exception"), ("oom", "oom")]
)
def test_an_armed_fault_fails_only_its_loop_batched_or_not(kind: str, code: str) -> None:
    injector = FaultInjector()
    executor = Executor(observers=(injector, NaNWatch()))
    injector.arm("b", kind)
    outcome = executor.run_job(step_job(["a", "b", "c"]))
    assert outcome.retried_solo  # the batch failed; each plan ran again alone
    assert [p.failure is None for p in outcome.plans] == [True, False, True]
    assert outcome.plans[1].failure[0] == code  # type: ignore[index]
    assert torch.equal(outcome.plans[0].output, torch.full((2, 3), 1.0))
    assert torch.equal(outcome.plans[2].output, torch.full((2, 3), 3.0))
    assert injector.injected == 1 and injector.armed() == {}
    # once spent, the loop's next step runs clean
    again = executor.run_job(step_job(["a", "b"], first_plan=10))
    assert all(p.failure is None for p in again.plans)


def test_faults_wait_for_a_denoising_step_and_are_off_unless_armed() -> None:
    injector = FaultInjector()
    executor = Executor(observers=(injector, NaNWatch()))
    assert all(p.failure is None for p in executor.run_job(step_job(["a", "b"])).plans)
    injector.arm("a", "nan")
    decode = executor.run_job(step_job(["a"], kind="vae_decode", first_plan=5))
    assert decode.plans[0].failure is None and injector.armed() == {"a": "nan"}
    step = executor.run_job(step_job(["a"], first_plan=6))
    assert step.plans[0].failure[0] == "nan"  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown fault kind"):
        injector.arm("a", "segfault")
