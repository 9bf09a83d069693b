"""Executor: runs ops, observers and failure isolation (called inline, no thread)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from runtime.executor import ExecJob, Executor
from runtime.observers import BatchInfo, NaNWatch


class Doubler:
    name = "double"
    batchable = True

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.deterministic_flags: list[bool] = []

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        self.calls.append(list(args))
        self.deterministic_flags.append(deterministic)
        if "boom" in args:
            raise RuntimeError("bad item")
        if "short" in args:
            return []
        return [torch.tensor([float("nan")]) if a == "nan" else a * 2 for a in args]


def job(*args: Any) -> ExecJob:
    n = len(args)
    return ExecJob(
        info=BatchInfo(
            batch_id=1,
            kind="host",
            shape_sig="",
            instance_id="i",
            op_name="double",
            plan_ids=tuple(range(n)),
            loop_ids=tuple(f"l{i}" for i in range(n)),
        ),
        op=Doubler(),
        args=args,
        plan_flops=(0.0,) * n,
    )


def test_clean_batch_returns_outputs_in_order() -> None:
    j = job(1, 2, 3)
    outcome = Executor(deterministic=True).run_job(j)
    assert [p.output for p in outcome.plans] == [2, 4, 6]
    assert all(p.failure is None and p.batch_size == 3 for p in outcome.plans)
    assert not outcome.retried_solo and j.op.deterministic_flags == [True]  # type: ignore[attr-defined]


def test_exception_in_batch_reruns_each_plan_alone() -> None:
    j = job(1, "boom", 3)
    outcome = Executor().run_job(j)
    assert outcome.retried_solo
    assert [p.output for p in outcome.plans] == [2, None, 6]
    assert outcome.plans[1].failure == ("step_exception", "double raised RuntimeError: bad item")
    assert [p.batch_size for p in outcome.plans] == [1, 1, 1]
    assert j.op.calls == [[1, "boom", 3], [1], ["boom"], [3]]  # type: ignore[attr-defined]


def test_wrong_output_count_is_a_step_exception() -> None:
    outcome = Executor().run_job(job("short"))
    assert outcome.plans[0].failure == ("step_exception", "double returned 0 outputs for 1 plans")


def test_nan_fault_reruns_alone_and_fails_only_that_plan() -> None:
    j = job(1, "nan")
    outcome = Executor(observers=[NaNWatch()]).run_job(j)
    assert outcome.retried_solo and outcome.plans[0].output == 2
    assert outcome.plans[1].failure is not None and outcome.plans[1].failure[0] == "nan"


def test_broken_observer_is_ignored() -> None:
    class Broken:
        def before_batch(self, info: BatchInfo) -> None:
            raise RuntimeError("observer bug")

        def after_batch(self, *args: Any) -> None:
            raise RuntimeError("observer bug")

    outcome = Executor(observers=[Broken()]).run_job(job(5))
    assert outcome.plans[0].output == 10 and outcome.plans[0].failure is None


class OomOnItem(Doubler):
    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        if "oom" in args:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().__call__(args, deterministic=deterministic)


def test_out_of_memory_is_its_own_code_and_fails_only_that_plan() -> None:
    j = job(1, "oom", 3)
    j = ExecJob(info=j.info, op=OomOnItem(), args=j.args, plan_flops=j.plan_flops)
    outcome = Executor().run_job(j)
    assert outcome.retried_solo
    assert [p.output for p in outcome.plans] == [2, None, 6]
    code, message = outcome.plans[1].failure  # type: ignore[misc]
    assert code == "oom" and "OutOfMemoryError" in message
