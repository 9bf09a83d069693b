"""The passes of ``infra.bench.multisession`` outside its measured runs.

``warm_up``: one bounded session through every K/V-prefix length, both parts of a first chunk,
prompt switches at several chunks and an action, so that no measured run compiles; the bench
runs it twice per profile, first on a throwaway cost model (compiling) and then on its own
(calibrating). ``job_alone``: the T2V job of ``n2job`` on an otherwise idle engine, the
baseline its completion time is compared with.
"""

from __future__ import annotations

import math
import time
from typing import Any

from infra.bench.sim_viewer import SimViewer
from models.card import Profile
from models.instance import WanInstance
from models.loops.requests import JobRequest, SessionRequest
from runtime.contract import ActionInput, InputKind, Priority, PromptInput
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.observers import Profiler
from runtime.policies import make_scheduler

__all__ = ["JOB_FRAMES", "job_alone", "job_request", "warm_up"]

JOB_FRAMES = 21  # the n2job scenario's T2V job


async def warm_up(
    instance: WanInstance, profile: Profile, cost: CostModel, *, can_act: bool
) -> float:
    """Like ``server.app._warm_up``: one bounded session through every K/V-prefix length into
    steady state, both parts of a first chunk, on slab 0 - plus prompt switches at several
    chunks (re-cache graphs) and an action, so no measured run compiles. Its plan times feed
    ``cost`` (a compiling pass must not calibrate the bench's cost model). -> seconds."""
    inst = instance
    sink, ring = inst.kv_geometry(profile.chunk_latent_frames)
    fill = -(-(sink + ring) // profile.chunk_latent_frames)
    engine = Engine(cost=cost, observers=(Profiler(cost),))
    await engine.start()
    viewer = SimViewer(profile.fps)
    handles: list[Any] = []

    def on_emit(emission: Any) -> None:
        viewer.on_emit(emission)
        meta = emission.spec.meta
        if emission.spec.stream == "media" and meta.final and meta.chunk in (1, fill, fill + 1):
            viewer.push(handles[0], InputKind.PROMPT, PromptInput(text=f"warm-up {meta.chunk}"))
            if can_act:
                viewer.push(handles[0], InputKind.ACTION, ActionInput(keys=("d",)))

    start = time.perf_counter()
    try:
        handles.append(
            engine.spawn(
                inst.loop("chunk_rollout"),
                SessionRequest(
                    prompt="warm-up",
                    seed=0,
                    width=profile.width,
                    height=profile.height,
                    fps=profile.fps,
                    max_chunks=fill + 4,
                    kv_slab=0,
                ),
                inst,
                loop_id="warm-up",
                priority=Priority.BATCH,
                on_emit=on_emit,
            )
        )
        await handles[0].result()
    finally:
        await engine.close()
    return time.perf_counter() - start


def job_request(profile: Profile, tag: str) -> JobRequest:
    return JobRequest(
        task="t2v",
        prompt=f"job {tag}",
        num_frames=JOB_FRAMES,
        width=profile.width,
        height=profile.height,
        steps=profile.steps,
        seed=3,
    )


async def job_alone(instance: WanInstance, cost: CostModel, profile: Profile) -> float:
    """The job on an otherwise idle engine (run twice; the first warms up) -> seconds."""
    seconds = math.nan
    for attempt in range(2):
        # the first attempt compiles the job's own graphs: its times calibrate nothing
        run_cost = cost if attempt else CostModel(cost.device)
        engine = Engine(
            cost=run_cost, scheduler=make_scheduler("step-edf"), observers=(Profiler(run_cost),)
        )
        await engine.start()
        try:
            start = time.monotonic()
            handle = engine.spawn(
                instance.loop_for("text_to_video"),
                job_request(profile, f"alone {attempt}"),
                instance,
                loop_id="job",
                priority=Priority.BATCH,
                on_emit=lambda emission: None,
            )
            await handle.result()
            seconds = time.monotonic() - start
        finally:
            await engine.close()
    return seconds
