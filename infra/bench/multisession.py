"""Many live sessions on one GPU: scenarios x scheduling policies, side by side in one process.

The serving path as ``dreamrt serve --compile`` runs it, minus the network: one loaded (and on
CUDA compiled) instance, warmed up once per profile; for every (scenario, scheduler) a fresh
``Engine`` with ``make_scheduler(name)`` and a ``Profiler`` calibrating one shared cost model (a
warm pass after the compiling warm-up calibrates it first, so no policy starts on priors);
sessions' ``chunk_rollout`` loops spawned with ``Priority.REALTIME`` on their slab of the
preallocated K/V buffer, with ``media_t0_s`` (the engine's playout deadlines); frames reach the
host as uint8 (the engine
resolves a decode's ``PendingOutput`` off the event loop) and a simulated viewer per session
(``infra.bench.sim_viewer``) plays them out at the profile fps, moving the loop's deadline
anchor as a session does.

Scenarios (``--scenarios``; the card's default profile unless said):

- ``n1``, ``n2``, ``n3``: N sessions from t = 0.
- ``n2job``: N = 2 plus one T2V job (``JobRequest(task="t2v", num_frames=21)``, batch class,
  the card's ``loop_for("text_to_video")``); its completion time against the job alone.
- ``n2switch``: N = 2, session 0 switches prompt every ``--switch-every`` seconds.
- ``small``: ``--small-profile`` (480x272@16), the sessions admitted by an
  ``AdmissionController`` as ``sessions.host`` builds the request (compute share = the cost
  model's prior of ``chunk_flops`` / chunk seconds, a slab of the profile's pool, peak bytes):
  N = the admission limit, started one every ``--ramp`` seconds. Then ``small+1`` (policies in
  ``--refusal-schedulers``): the same, and after the ramp one more is asked for; it must be
  refused (``Reject`` with ``retry_after_s``), and the admitted sessions' numbers are compared
  with the ``small`` run. The limit from the calibrated (measured) costs is reported beside it;
  ``--admit-from measured`` admits from those instead.

Every session gets one prompt switch (at 35 % of the run) and, where the card takes actions,
one action (60 %); inputs go through ``LoopHandle.push_input`` and are timed until the first
media of the chunk their ``applied`` acknowledgement names. Each run lasts ``--seconds`` after
its last session started. Per run: the measured cost per plan kind; after every run the JSON
(``--json``) and the cost snapshot (``--cost-snapshot``) are rewritten, so a timeout keeps
what finished. The table comes last.

    python -m infra.bench.multisession [--device cpu --model wan-tiny-random] [--seconds 12]
        [--scenarios n1,n2,n3,n2job,n2switch,small] [--schedulers step-edf,chunk-rr,fifo]

Its parts: ``multisession_scenarios`` (the scenario table), ``multisession_warmup`` (the
warm-up, calibration and job-alone passes), ``multisession_admission`` (admission as the
session host asks it), ``multisession_report`` (profiler, table, JSON, cost snapshot).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from infra.bench.multisession_admission import (
    admission_controller,
    admission_limit,
    measured_share,
    session_request,
)
from infra.bench.multisession_report import (
    ShapeProfiler,
    compare_refusal,
    cost_snapshot,
    format_costs,
    format_table,
    write_json,
)
from infra.bench.multisession_scenarios import SCENARIOS, Scenario, parse_profile, scenarios
from infra.bench.multisession_warmup import JOB_FRAMES, job_alone, job_request, warm_up
from infra.bench.sim_viewer import SimViewer
from models.card import Profile
from models.instance import WanInstance, load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.admission import Admit, Reject
from runtime.contract import ActionInput, Cancelled, InputKind, LoopFailed, Priority, PromptInput
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from runtime.policies import SCHEDULER_POLICIES, make_scheduler


@dataclass
class Bench:
    """What every run shares: the instance, the cost model, the settings, the results."""

    args: argparse.Namespace
    instance: WanInstance
    cost: CostModel
    can_act: bool
    meta: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, dict[tuple[str, str], list]] = field(default_factory=dict)
    chunk_seconds: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    job_alone_s: float | None = None
    admit_share: float | None = None  # None: admission's share is the prior of chunk_flops

    def write(self) -> None:
        write_json(
            self.args.json,
            {**self.meta, **self.extra, "job_alone_s": self.job_alone_s, "runs": self.runs},
        )
        write_json(
            self.args.cost_snapshot,
            cost_snapshot(self.meta, self.samples, self.chunk_seconds, self.cost),
        )


def _key(p: Profile) -> str:
    return f"{p.width}x{p.height}@{p.fps}"


# -- one (scenario, scheduler) ------------------------------------------------------------


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
    if stop.is_set():
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
        delay = live.viewer.first_arrival_s + at_s - time.monotonic()
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


async def _run(bench: Bench, scenario: Scenario, scheduler: str) -> dict[str, Any]:
    args, inst, profile = bench.args, bench.instance, scenario.profile
    tag = f"{scenario.name}/{scheduler}"
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
    stats = engine.stats()
    result = {
        "scenario": scenario.name if not scenario.one_more else "small+1",
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
    by_shape = bench.samples.setdefault(_key(profile), defaultdict(list))
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
    viewer = SimViewer(profile.fps, on_anchor=lambda t0: handles[0].set_media_t0(t0))
    spawned_s = time.monotonic()
    handles.append(
        engine.spawn(
            inst.loop("chunk_rollout"),
            SessionRequest(
                prompt=f"{tag} session {index}",
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


# -- the whole bench ----------------------------------------------------------------------


async def _bench(bench: Bench, names: list[str], schedulers: list[str]) -> None:
    inst, args = bench.instance, bench.args
    default = inst.card.default_profile
    sizes = [1] + [int(n[1]) for n in names if n[:1] == "n" and n[1:2].isdigit()]
    inst.reserve_kv_slabs(default, max(sizes))  # one buffer per geometry: sized once, here
    profiles = [default]
    if "small" in names:
        w, h, fps = parse_profile(args.small_profile)
        small = inst.card.resolve_profile(width=w, height=h, fps=fps)
        inst.reserve_kv_slabs(small, args.small_max)
        profiles.append(small)
    for profile in profiles:
        bench.chunk_seconds[_key(profile)] = inst.chunk_seconds(profile)
        # compile on a throwaway cost model, then calibrate the bench's on a warm pass
        seconds = await warm_up(inst, profile, CostModel(bench.cost.device), can_act=bench.can_act)
        calibrate_s = await warm_up(inst, profile, bench.cost, can_act=bench.can_act)
        print(
            f"warm-up {_key(profile)}: {seconds:.1f} s, calibration pass {calibrate_s:.1f} s",
            flush=True,
        )
    small_limit = 0
    if "small" in names:  # the prior (as the server admits today) and the measured costs
        measured = measured_share(inst, bench.cost, small)
        if args.admit_from == "measured" and measured is None:
            raise SystemExit("multisession: no measured costs of the small profile to admit from")
        bench.admit_share = measured if args.admit_from == "measured" else None
        limit = admission_limit(
            inst,
            bench.cost,
            small,
            slabs=args.small_max,
            max_batch=args.max_batch,
            share=bench.admit_share,
        )
        small_limit = limit["limit"]
        limit.update(admit_from=args.admit_from, share_measured=measured)
        bench.extra["small_admission"] = limit
        print(
            f"small {_key(small)}: admission ({args.admit_from}) limit {small_limit}, next "
            f"refused for {limit['reject_reason']}; share per session: prior "
            f"{limit['share_prior']:.3f}, measured {measured} GPU-s/s (capacity "
            f"{limit['capacity']})",
            flush=True,
        )
    if "n2job" in names:
        bench.job_alone_s = await job_alone(inst, bench.cost, default)
        print(f"t2v job alone ({JOB_FRAMES} frames): {bench.job_alone_s:.2f} s", flush=True)
    for scenario in scenarios(inst.card, args, names, small_limit):
        variants = [(scenario, schedulers)]
        if scenario.admitted:
            refusal = [s for s in args.refusal_schedulers.split(",") if s in schedulers]
            variants.append((dataclasses.replace(scenario, one_more=True), refusal))
        for variant, policies in variants:
            for scheduler in policies:
                bench.runs.append(await _run(bench, variant, scheduler))
                bench.write()
    for line in compare_refusal(bench.runs):
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--model",
        default=None,
        help="card (default: wan2.1-1.3b-causal on cuda, wan-tiny-random on cpu)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="per run after its last session started (default 12 cuda, 3 cpu)",
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--schedulers", default=",".join(SCHEDULER_POLICIES))
    parser.add_argument(
        "--refusal-schedulers",
        default="step-edf",
        help="policies that also run small+1 (the refused extra session)",
    )
    parser.add_argument(
        "--small-profile", default=None, help="WxH@FPS (default 480x272@16 cuda, 32x32@8 cpu)"
    )
    parser.add_argument(
        "--small-max",
        type=int,
        default=None,
        help="slabs of the small profile's pool (default 12 cuda, 4 cpu)",
    )
    parser.add_argument(
        "--admit-from",
        choices=["prior", "measured"],
        default="prior",
        help="small's compute share: the prior (as sessions.host) or measured",
    )
    parser.add_argument("--ramp", type=float, default=0.5, help="seconds between small's starts")
    parser.add_argument("--switch-every", type=float, default=3.0)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--playout-buffer-s", type=float, default=0.25)
    parser.add_argument("--max-lead-s", type=float, default=1.0)
    parser.add_argument("--job-timeout", type=float, default=60.0)
    out = os.environ.get("OUT")
    parser.add_argument("--json", default=f"{out}/multisession.json" if out else None)
    parser.add_argument("--cost-snapshot", default=f"{out}/cost_snapshot.json" if out else None)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("multisession: CUDA is not available (--device cpu for a smoke run)", file=sys.stderr)
        return 2
    args.model = args.model or ("wan2.1-1.3b-causal" if cuda else "wan-tiny-random")
    args.seconds = args.seconds if args.seconds is not None else (12.0 if cuda else 3.0)
    args.small_profile = args.small_profile or ("480x272@16" if cuda else "32x32@8")
    args.small_max = args.small_max or (12 if cuda else 4)
    schedulers = args.schedulers.split(",")
    for name in schedulers:
        make_scheduler(name)  # an unknown name fails now, naming the known ones
    card = get(args.model)
    # each K/V-prefix length and re-cache layout is a graph of the blocks' one code object
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    start = time.perf_counter()
    instance = load_instance(
        card, device=args.device, random_weights=True, precision="bf16" if cuda else "fp32"
    )
    if cuda:
        instance.compile()
    spec = card.loops["chunk_rollout"]
    bench = Bench(
        args=args,
        instance=instance,
        cost=CostModel(DeviceConstants.h200() if cuda else DeviceConstants.cpu()),
        can_act="action" in spec.inputs,
        meta={
            "card": card.model_id,
            "device": args.device,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "seconds": args.seconds,
            "max_batch": args.max_batch,
            "playout_buffer_s": args.playout_buffer_s,
            "max_lead_s": args.max_lead_s,
        },
    )
    print(
        f"{card.model_id} on {bench.meta['device_name']}: loaded in "
        f"{time.perf_counter() - start:.1f} s",
        flush=True,
    )
    asyncio.run(_bench(bench, args.scenarios.split(","), schedulers))
    bench.write()
    print(
        f"\n{card.model_id}, {bench.meta['device_name']}, {args.seconds:g} s per run, "
        f"buffer {args.playout_buffer_s} s, lead {args.max_lead_s} s; total "
        f"{time.perf_counter() - start:.0f} s"
    )
    print(format_table(bench.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
