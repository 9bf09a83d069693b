"""One (scenario, scheduler) run of ``infra.bench.multisession``: sessions spawned as a server
spawns them (admission first where the scenario says so), each watched by a ``SimViewer``,
their inputs pushed on a schedule, an optional T2V job beside them; the run's numbers.

Session ``i`` has the prompt ``session i`` and seed ``i`` in every run, so ``s0`` of every run
can be held against ``s0`` alone (``infra.bench.multisession_gate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from infra.bench.multisession_admission import admission_controller, session_request
from infra.bench.multisession_report import ShapeProfiler, format_costs
from infra.bench.multisession_setup import (
    JOB_FRAMES,
    Bench,
    Scenario,
    job_request,
    profile_key,
)
from infra.bench.sim_viewer import SimViewer
from models.card import Profile
from models.instance import WanInstance
from models.loops.requests import SessionRequest
from runtime.admission import Admit, Reject
from runtime.contract import ActionInput, Cancelled, InputKind, LoopFailed, Priority, PromptInput
from runtime.engine import Engine
from runtime.policies import make_scheduler

__all__ = ["run_scenario"]

# chunks of s0 kept for the interleave gate (before its first input applies)
_GATE_CHUNKS = 6


@dataclass
class _Live:
    viewer: SimViewer
    handle: Any
    spawned_s: float
    task: asyncio.Task[None] | None = None


async def _drive_inputs(
    bench: Bench, live: _Live, scenario: Scenario, index: int, tag: str, stop: asyncio.Event
) -> None:
    """Pushes this session's inputs, timed from its first frame."""
    while live.viewer.first_arrival_s is None and not stop.is_set():
        await asyncio.sleep(0.01)
    first_s = live.viewer.first_arrival_s
    if stop.is_set() or first_s is None:
        return
    seconds = bench.args.seconds
    if scenario.switch_every_s is not None and index == 0:
        count = int(seconds // scenario.switch_every_s)
        plan = [(k * scenario.switch_every_s, InputKind.PROMPT) for k in range(1, count + 1)]
    else:
        plan = [(0.35 * seconds, InputKind.PROMPT)]
    if bench.can_act:
        plan.append((0.6 * seconds, InputKind.ACTION))
    for k, (at_s, kind) in enumerate(sorted(plan)):
        delay = first_s + at_s - time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, delay))
        if stop.is_set():
            return
        payload = (
            PromptInput(text=f"{tag} s{index} prompt {k}")
            if kind is InputKind.PROMPT
            else ActionInput(keys=("w",))
        )
        live.viewer.push(live.handle, kind, payload)


async def run_scenario(bench: Bench, scenario: Scenario, scheduler: str) -> dict[str, Any]:
    args, inst, profile = bench.args, bench.instance, scenario.profile
    tag = f"{scenario.label}/{scheduler}"
    profiler = ShapeProfiler(bench.cost)
    admission = None
    if scenario.admitted:
        admission = admission_controller(
            inst, profile, inst.reserve_kv_slabs(profile, 1).num_slabs, max_batch=args.max_batch
        )
    engine = Engine(
        cost=bench.cost,
        scheduler=make_scheduler(scheduler, max_batch=args.max_batch),
        admission=admission,
        playout_buffer_s=args.playout_buffer_s,
        max_lead_s=args.max_lead_s,
        observers=(profiler,),
    )
    await engine.start()
    inst.batch_sessions(scenario.batch)
    stop = asyncio.Event()
    lives: dict[str, _Live] = {}
    inputs: list[asyncio.Task[None]] = []
    job: dict[str, Any] | None = None
    refusal: dict[str, Any] | None = None
    try:
        # Admission first, as a server answers each POST before its session starts.
        slabs: list[tuple[int, str | None]] = []
        for i in range(scenario.sessions):
            if admission is None:
                slabs.append((i, None))
                continue
            answer = admission.admit(
                session_request(inst, bench.cost, f"s{i}", profile, share=bench.admit_share)
            )
            if not isinstance(answer, Admit) or answer.slab is None:
                raise RuntimeError(f"{tag}: admission refused session {i} of its limit: {answer}")
            slabs.append((answer.slab.slab_id, answer.reservation_id))
        if scenario.job:
            job_handle = engine.spawn(
                inst.loop_for("text_to_video"),
                job_request(profile, tag),
                inst,
                loop_id="job",
                priority=Priority.BATCH,
                on_emit=lambda emission: None,
            )
            job_task = asyncio.create_task(_timed(job_handle, time.monotonic()))
        for i, (slab, reservation) in enumerate(slabs):
            if i and scenario.ramp_s:
                await asyncio.sleep(scenario.ramp_s)
            lives[f"s{i}"] = live = await _spawn_session(
                engine, inst, profile, i, slab, reservation, tag
            )
            live.task = asyncio.create_task(live.viewer.run(stop))
            inputs.append(asyncio.create_task(_drive_inputs(bench, live, scenario, i, tag, stop)))
        if scenario.one_more:
            if admission is None:
                raise ValueError(f"{tag}: one more session asks admission, which is not in use")
            answer = admission.admit(
                session_request(inst, bench.cost, "one-more", profile, share=bench.admit_share)
            )
            refusal = {"refused": isinstance(answer, Reject), "answer": dataclasses.asdict(answer)}
            if isinstance(answer, Admit):
                admission.release(answer.reservation_id)
        await asyncio.sleep(args.seconds)
        end_s = time.monotonic()
        stop.set()
        for live in lives.values():
            live.handle.cancel("bench run over")
        await asyncio.gather(*inputs, *(live.task for live in lives.values()))
        failures = {}
        for sid, live in lives.items():
            try:
                await live.handle.result()
            except Cancelled:
                pass
            except LoopFailed as exc:
                failures[sid] = str(exc)
        if scenario.job:
            job = await _finish_job(bench, job_task)
    finally:
        stop.set()
        await engine.close()
        inst.batch_sessions(False)
    stats = engine.stats()
    gate = None
    if "s0" in lives:
        gate = bench.gate.observe(
            tag,
            profile_key(profile),
            lives["s0"].viewer,
            reference=scenario.sessions == 1 and not scenario.batch and not scenario.job,
        )
    result = {
        "scenario": scenario.label,
        "batch_sessions": scenario.batch,
        "gate": gate,
        "scheduler": scheduler,
        "profile": profile.as_dict(),
        "sessions": {
            sid: live.viewer.summary(live.spawned_s, end_s) for sid, live in lives.items()
        },
        "failures": failures,
        "job": job,
        "refusal": refusal,
        "plan_deadlines": {"met": stats.deadlines_met, "missed": stats.deadline_misses},
        "costs_ms": {
            k: {"median": s.median_s * 1e3, "p95": s.p95_s * 1e3, "n": s.count}
            for k, s in profiler.summary().items()
        },
    }
    by_shape = bench.samples.setdefault(profile_key(profile), defaultdict(list))
    for key, values in profiler.by_shape.items():
        by_shape[key].extend(values)
    print(
        f"{result['scenario']} / {scheduler}: plan costs (median / p95):\n{format_costs(profiler)}",
        flush=True,
    )
    return result


async def _spawn_session(
    engine: Engine,
    inst: WanInstance,
    profile: Profile,
    index: int,
    slab: int,
    reservation: str | None,
    tag: str,
) -> _Live:
    handles: list[Any] = []
    # the viewer moves the loop's deadline anchor as a session does (set_media_t0)
    viewer = SimViewer(
        profile.fps,
        on_anchor=lambda t0: handles[0].set_media_t0(t0),
        keep_chunks=_GATE_CHUNKS if index == 0 else 0,
    )
    spawned_s = time.monotonic()
    handles.append(
        engine.spawn(
            inst.loop("chunk_rollout"),
            SessionRequest(
                prompt=f"session {index}",
                seed=index,
                width=profile.width,
                height=profile.height,
                fps=profile.fps,
                kv_slab=slab,
            ),
            inst,
            loop_id=f"s{index}",
            priority=Priority.REALTIME,
            on_emit=viewer.on_emit,
            media_t0_s=spawned_s,
            reservation_id=reservation,
        )
    )
    return _Live(viewer, handles[0], spawned_s)


async def _timed(handle: Any, start_s: float) -> float:
    await handle.result()
    return time.monotonic() - start_s


async def _finish_job(bench: Bench, task: asyncio.Task[float]) -> dict[str, Any]:
    """The job's completion time (waiting up to ``--job-timeout`` after the sessions ended)."""
    during = task.done()
    out: dict[str, Any] = {
        "num_frames": JOB_FRAMES,
        "alone_s": bench.job_alone_s,
        "completion_s": None,
        "x_alone": None,
        "finished_while_sessions_ran": during,
    }
    try:
        seconds = await asyncio.wait_for(asyncio.shield(task), bench.args.job_timeout)
    except (TimeoutError, Cancelled, LoopFailed) as exc:
        task.cancel()
        return {**out, "error": type(exc).__name__}
    alone = bench.job_alone_s
    return {
        **out,
        "completion_s": seconds,
        "x_alone": seconds / alone if alone and math.isfinite(alone) else None,
    }
