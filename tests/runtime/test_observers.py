"""Profiler (timing, cost calibration, latency summary) and NaNWatch (non-finite outputs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec
import torch

from runtime.cost import CostModel, DeviceConstants
from runtime.observers import BatchInfo, NaNWatch, Profiler, summarize


def info(kind: str = "vae_decode", plan_ids: tuple[int, ...] = (0,)) -> BatchInfo:
    return BatchInfo(
        batch_id=0,
        kind=kind,
        shape_sig="s",
        instance_id="i",
        op_name="op",
        plan_ids=plan_ids,
        loop_ids=tuple(f"l{p}" for p in plan_ids),
    )


def test_profiler_calibrates_cost_and_summarizes_per_kind() -> None:
    cost = CostModel(DeviceConstants("d", 1e12, 1e11, 0.0), alpha=1.0)
    profiler = Profiler(cost, use_cuda_events=False)
    for wall_s in (0.1, 0.2, 0.3, 0.4):
        profiler.before_batch(info(plan_ids=(0, 1)))
        observation = profiler.after_batch(info(plan_ids=(0, 1)), [None, None], wall_s)
        assert observation.device_s is None
    assert cost.predict("vae_decode", "s") == 0.2  # last batch of 2 at alpha=1: 0.4 / 2
    assert profiler.wall_samples("vae_decode") == [0.1, 0.2, 0.3, 0.4]
    summary = profiler.summary()["vae_decode"]
    assert (summary.count, summary.median_s, summary.p95_s) == (4, 0.25, 0.4)
    assert profiler.summary().keys() == {"vae_decode"}


class Later:
    """A pending output whose asynchronous work ends when the test says so."""

    def __init__(self, device_s: float | None) -> None:
        self.done = False
        self._device_s = device_s

    def ready(self) -> bool:
        return self.done

    def result(self) -> str:
        return "frames"

    def device_s(self) -> float | None:
        return self._device_s if self.done else None


class Untimed:
    def ready(self) -> bool:
        return False

    def result(self) -> str:
        return "frames"


def test_asynchronous_device_time_is_calibrated_apart_once_done() -> None:
    cost = CostModel(DeviceConstants("d", 1e12, 1e11, 0.0), alpha=1.0)
    profiler = Profiler(cost, use_cuda_events=False)
    first, second = Later(0.140), Later(0.150)
    profiler.after_batch(info(), [first], 0.008)  # the launch held the executor 8 ms
    profiler.after_batch(info(), [second], 0.009)
    # the executor's occupancy is calibrated at once (the scheduler budgets it) ...
    assert cost.predict("vae_decode", "s") == 0.009
    # ... the asynchronous part only once the work is done
    assert cost.predict_async("vae_decode", "s") == 0.0
    second.done = True  # out of order: accounting stays in plan order
    assert profiler.collect() == 2
    first.done = True
    assert profiler.collect() == 0
    assert cost.predict_async("vae_decode", "s") == 0.150  # alpha=1: the last observation
    assert cost.gpu_seconds("vae_decode", "s") == 0.009 + 0.150
    assert profiler.async_summary()["vae_decode"].count == 2
    assert profiler.wall_samples("vae_decode") == [0.008, 0.009]
    # a pending output that cannot tell its time adds nothing asynchronous
    profiler.after_batch(info("other"), [Untimed()], 0.002)
    assert cost.gpu_seconds("other", "s") == 0.002


def test_summarize_nearest_rank_p95() -> None:
    s = summarize([float(i) for i in range(1, 101)])
    assert (s.count, s.median_s, s.p95_s) == (100, 50.5, 95.0)
    assert math.isnan(summarize([]).median_s)


@dataclass
class Out:
    frames: torch.Tensor
    meta: dict


class Nested(msgspec.Struct):
    latents: list[torch.Tensor]


def test_nanwatch_finds_non_finite_values_in_nested_outputs() -> None:
    watch = NaNWatch()
    good = {"x": torch.ones(2), "ids": torch.tensor([1, 2]), "label": "fine"}
    bad_inf = (torch.zeros(1), [torch.tensor([1.0, math.inf])])
    bad_dc = Out(torch.ones(3), {"feat": torch.tensor([math.nan, math.nan]).half()})
    bad_struct = Nested([torch.zeros(2), torch.tensor([math.nan])])
    obs = watch.after_batch(info(plan_ids=(0, 1, 2, 3)), [good, bad_inf, bad_dc, bad_struct], 0.0)
    assert obs is not None
    assert [(f.index, f.code) for f in obs.faults] == [(1, "nan"), (2, "nan"), (3, "nan")]
    assert (
        "output[1][1][0]" in obs.faults[0].message and "1 non-finite of 2" in obs.faults[0].message
    )
    assert "output[2].meta['feat']" in obs.faults[1].message
    assert "output[3].latents[1]" in obs.faults[2].message
    assert watch.hits == 3
    assert watch.after_batch(info(), [good], 0.0) is None
