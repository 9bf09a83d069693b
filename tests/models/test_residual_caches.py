"""The residual caches (FBCache-, TeaCache-style) on the tiny 50-step T2V card, on the CPU:
threshold 0 is bit-exact, a threshold reuses steps within a bound, the state lives in the
loop (two interleaved jobs with caching equal each alone; a snapshot round-trips it), and the
pre-flight rules refuse what they must before a loop starts."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import torch

from models.card.specs import ScheduleSpec
from models.instance import load_instance
from models.loops.requests import JobRequest
from models.registry import get
from runtime.contract import Done, LoopFailed, StepResult
from runtime.driver import run_inline
from runtime.snapshot import restore_state, snapshot_state
from runtime.step_edf import StepEdfScheduler
from tests.models.conftest import CACHES_OFF, run_jobs


@pytest.fixture(scope="module")
def instance(t2v_instance: Any) -> Any:
    return t2v_instance


def job(name: str | None = None, threshold: float = 0.0, **kw: Any) -> JobRequest:
    extensions = dict(CACHES_OFF)
    if name is not None:
        extensions[name] = {"enabled": True, "threshold": threshold}
    fields = {"task": "t2v", "prompt": "a red fox in snow", "num_frames": 5, "seed": 1} | kw
    return JobRequest(extensions=extensions, **fields)


def run(instance: Any, request: JobRequest, loop_id: str = "job") -> Any:
    loop = instance.loop("diffusion_denoise")
    result, _ = asyncio.run(run_inline(loop, request, instance, loop_id=loop_id))
    return result.outputs


@pytest.fixture(scope="module")
def plain(instance: Any) -> Any:
    return run(instance, job())


@pytest.mark.parametrize("name", ["fbcache", "teacache"])
def test_threshold_zero_is_bit_identical_to_no_extension(
    instance: Any, plain: Any, name: str
) -> None:
    hooked = run(instance, job(name, 0.0))
    assert hooked["extensions"] == {name: {"reused": 0, "computed": 50}}
    assert torch.equal(hooked["latents"], plain["latents"])
    assert torch.equal(hooked["frames"], plain["frames"])
    assert "extensions" not in plain  # nothing active: the plain forward ran


def test_a_step_without_an_active_extension_takes_the_plain_forward(instance: Any) -> None:
    # both caches enabled at deploy scope, both off in the request: no hook reaches the op
    loop = instance.loop("diffusion_denoise")
    state = loop.init(job(), instance, None)
    assert state.plugin_state == {}
    kinds = []
    while state.denoise_step < 2:
        plan = loop.next(state)
        kinds.append(plan.kind.value)
        if plan.kind.value == "diffusion_step":
            assert plan.args.hooks is None
        state = loop.advance(state, StepResult(plan.op([plan.args])[0], 0.0, kind=plan.kind))
    assert kinds.count("diffusion_step") == 2
    hooked = loop.init(job("fbcache", 0.0), instance, None)
    while (plan := loop.next(hooked)).kind.value != "diffusion_step":
        hooked = loop.advance(hooked, StepResult(plan.op([plan.args])[0], 0.0, kind=plan.kind))
    assert plan.args.hooks is not None and plan.args.hooks.name == "fbcache"


@pytest.mark.parametrize("name", ["fbcache", "teacache"])
def test_a_threshold_reuses_steps_and_stays_close(instance: Any, plain: Any, name: str) -> None:
    cached = run(instance, job(name, 0.1))
    counts = cached["extensions"][name]
    assert counts["reused"] >= 10 and counts["reused"] + counts["computed"] == 50
    diff = (cached["latents"] - plain["latents"]).abs().max().item()
    assert 0.0 < diff < 0.05  # reused work, a small and bounded change
    more = run(instance, job(name, 0.4))["extensions"][name]["reused"]
    assert more > counts["reused"]  # a larger threshold reuses more


async def test_interleaved_jobs_with_caching_equal_each_alone(instance: Any) -> None:
    requests = {
        "fox": job("fbcache", 0.1),
        "owl": job("teacache", 0.1, prompt="an owl at night", seed=7),
        "cat": job("fbcache", 0.2, prompt="a cat on a roof", seed=3),
    }
    alone = {}
    for loop_id, request in requests.items():
        loop = instance.loop("diffusion_denoise")
        result, _ = await run_inline(loop, request, instance, loop_id=loop_id)
        alone[loop_id] = result.outputs
    order: list[str] = []

    class Spy:
        def before_batch(self, info: Any) -> None:
            order.extend(info.loop_ids)

        def after_batch(self, info: Any, outputs: Any, wall_s: float) -> None:
            return None

    # batch tickets age at once: the oldest queued step runs next, so the jobs take turns
    scheduler = StepEdfScheduler(max_batch=1, max_batch_wait_s=0.0)
    together = await run_jobs(instance, requests, observers=[Spy()], scheduler=scheduler)
    switches = sum(a != b for a, b in zip(order, order[1:], strict=False))
    assert switches >= 20  # the jobs really interleaved step by step
    for loop_id, want in alone.items():
        got = together[loop_id]
        assert got["extensions"] == want["extensions"]
        assert want["extensions"][next(iter(want["extensions"]))]["reused"] > 0
        assert torch.equal(got["latents"], want["latents"]), loop_id
        assert torch.equal(got["frames"], want["frames"]), loop_id


def test_a_snapshot_round_trips_the_plugin_state_and_resumes_exactly(instance: Any) -> None:
    loop = instance.loop("diffusion_denoise")
    request = job("fbcache", 0.1)
    state = loop.init(request, instance, None)
    while state.denoise_step < 20:  # mid-way: cached residuals of both CFG branches
        plan = loop.next(state)
        state = loop.advance(state, StepResult(plan.op([plan.args])[0], 0.0, kind=plan.kind))
    branches = state.plugin_state["fbcache"]["branches"]
    assert set(branches) == {"cond", "uncond"}
    assert not torch.equal(branches["cond"]["residual"], branches["uncond"]["residual"])
    restored = restore_state(snapshot_state(state), type(state))
    for name in ("cond", "uncond"):
        got, want = restored.plugin_state["fbcache"]["branches"][name], branches[name]
        assert set(got) == set(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value)
            else:
                assert got[key] == value
    assert restored.plugin_state["fbcache"]["params"] == {"enabled": True, "threshold": 0.1}

    def finish(s: Any) -> torch.Tensor:
        while not isinstance(plan := loop.next(s), Done):
            s = loop.advance(s, StepResult(plan.op([plan.args])[0], 0.0, kind=plan.kind))
        return loop.finalize(s).outputs["latents"]

    assert torch.equal(finish(restored), run(instance, request)["latents"])


def test_preflight_rejects_before_the_loop_starts(instance: Any) -> None:
    def rejected(request: JobRequest, inst: Any = instance) -> str:
        loop = inst.loop("diffusion_denoise")
        with pytest.raises(LoopFailed) as failed:
            asyncio.run(run_inline(loop, request, inst))
        assert "diffusion_denoise.init" in failed.value.message  # nothing was planned
        return failed.value.message

    both = JobRequest(task="t2v", prompt="x", num_frames=5, extensions={})
    assert "'fbcache' conflicts with 'teacache'" in rejected(both)
    # the same model with a 4-step distilled schedule (no CFG), which allows no skipping
    card = get("wan2.1-t2v-tiny-random")
    few_steps = ScheduleSpec(timesteps=(1000, 750, 500, 250), flow_shift=5.0)
    spec = dataclasses.replace(card.loops["diffusion_denoise"], schedule=few_steps)
    loops = {**card.loops, "diffusion_denoise": spec}
    profile = dataclasses.replace(card.default_profile, steps=4)
    few = dataclasses.replace(card, model_id="t2v-4step", loops=loops, default_profile=profile)
    distilled = load_instance(few)
    distilled.extensions = instance.extensions
    message = rejected(job("fbcache", 0.1), distilled)
    assert "'fbcache'" in message and "'t2v-4step'" in message
    assert "4-step schedule) does not allow step skipping" in message
    # with the cache off the job runs there
    assert run(distilled, job(num_frames=1, task="t2i"))["frames"].shape[0] == 1
    exact = job("teacache", 0.2, exact=True)
    assert "exact request refuses teacache.threshold=0.2" in rejected(exact)
    unknown = JobRequest(task="t2v", prompt="x", extensions={"taylorseer": {}})
    assert "'taylorseer' is not enabled" in rejected(unknown)


def test_a_card_allows_step_skipping_only_on_a_many_step_schedule() -> None:
    from models.wan.card import SELF_FORCING_SCHEDULE, WAN21_T2V_SCHEDULE

    assert WAN21_T2V_SCHEDULE.step_skipping and WAN21_T2V_SCHEDULE.problems() == []
    assert not SELF_FORCING_SCHEDULE.step_skipping
    wrong = dataclasses.replace(SELF_FORCING_SCHEDULE, step_skipping=True)
    assert any("step_skipping on a 4-step schedule" in p for p in wrong.problems())
