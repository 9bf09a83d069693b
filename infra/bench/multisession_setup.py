"""What every run of ``infra.bench.multisession`` shares: scenarios, the bench state, the
compiling warm-up and the job alone.

A scenario name may carry ``+batch``: the same scenario with cross-session batching on
(``WanInstance.batch_sessions``), so batched and unbatched rows stand side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from infra.bench.multisession_gate import FrameGate
from infra.bench.multisession_report import cost_snapshot, write_json
from infra.bench.sim_viewer import SimViewer
from models.card import Profile
from models.instance import WanInstance
from models.loops.requests import JobRequest, SessionRequest
from runtime.contract import ActionInput, InputKind, Priority, PromptInput
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.observers import Profiler
from runtime.policies import make_scheduler

__all__ = [
    "JOB_FRAMES",
    "SCENARIOS",
    "Bench",
    "Scenario",
    "job_alone",
    "job_request",
    "main_profile",
    "parse_profile",
    "profile_key",
    "scenarios",
    "warm_up",
    "warm_up_batched",
]

SCENARIOS = ("n1", "n2", "n3", "n2job", "n2switch", "small")
JOB_FRAMES = 21


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    profile: Profile
    sessions: int
    job: bool = False
    switch_every_s: float | None = None
    admitted: bool = False  # sessions go through admission (small)
    one_more: bool = False  # after the ramp, ask admission for one more (small+1)
    ramp_s: float = 0.0
    batch: bool = False  # cross-session batching on (``WanInstance.batch_sessions``)

    @property
    def label(self) -> str:
        base = "small+1" if self.one_more else self.name
        return base + ("+batch" if self.batch else "")


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
    gate: FrameGate = field(default_factory=FrameGate)

    def write(self) -> None:
        write_json(
            self.args.json,
            {**self.meta, **self.extra, "job_alone_s": self.job_alone_s, "runs": self.runs},
        )
        write_json(
            self.args.cost_snapshot,
            cost_snapshot(self.meta, self.samples, self.chunk_seconds, self.cost),
        )


def profile_key(p: Profile) -> str:
    return f"{p.width}x{p.height}@{p.fps}"


# -- warm-up and the job alone ------------------------------------------------------------


async def warm_up(bench: Bench, profile: Profile, cost: CostModel) -> float:
    """Like ``server.ops.warm_up.warm_up``: one bounded session through every K/V-prefix length into
    steady state, both parts of a first chunk, on slab 0 - plus prompt switches at several
    chunks (re-cache graphs) and an action, so no measured run compiles. Its plan times feed
    ``cost`` (a compiling pass must not calibrate the bench's cost model). -> seconds."""
    inst = bench.instance
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
            if bench.can_act:
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


async def warm_up_batched(bench: Bench, profile: Profile, cost: CostModel, sessions: int) -> float:
    """With batching on, ``sessions`` sessions started together into steady state, so the
    batched forward's graphs (batch 2, then one with a dynamic batch size) compile here and not
    in a measured run. -> seconds."""
    inst = bench.instance
    sink, ring = inst.kv_geometry(profile.chunk_latent_frames)
    fill = -(-(sink + ring) // profile.chunk_latent_frames)
    engine = Engine(
        cost=cost,
        scheduler=make_scheduler("step-edf", max_batch=bench.args.max_batch),
        observers=(Profiler(cost),),
    )
    await engine.start()
    inst.batch_sessions(True)
    start = time.perf_counter()
    try:
        now = time.monotonic()
        handles = [
            engine.spawn(
                inst.loop("chunk_rollout"),
                SessionRequest(
                    prompt=f"warm-up {i}",
                    seed=i,
                    width=profile.width,
                    height=profile.height,
                    fps=profile.fps,
                    max_chunks=fill + 3,
                    kv_slab=i,
                ),
                inst,
                loop_id=f"warm-up-{i}",
                priority=Priority.REALTIME,
                on_emit=lambda emission: None,
                media_t0_s=now,
            )
            for i in range(sessions)
        ]
        await asyncio.gather(*(h.result() for h in handles))
    finally:
        inst.batch_sessions(False)
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


async def job_alone(bench: Bench, profile: Profile) -> float:
    """The job on an otherwise idle engine (run twice; the first warms up) -> seconds."""
    seconds = math.nan
    for attempt in range(2):
        # the first attempt compiles the job's own graphs: its times calibrate nothing
        cost = bench.cost if attempt else CostModel(bench.cost.device)
        engine = Engine(
            cost=cost, scheduler=make_scheduler("step-edf"), observers=(Profiler(cost),)
        )
        await engine.start()
        try:
            start = time.monotonic()
            handle = engine.spawn(
                bench.instance.loop_for("text_to_video"),
                job_request(profile, f"alone {attempt}"),
                bench.instance,
                loop_id="job",
                priority=Priority.BATCH,
                on_emit=lambda emission: None,
            )
            await handle.result()
            seconds = time.monotonic() - start
        finally:
            await engine.close()
    return seconds


def main_profile(bench: Bench) -> Profile:
    """The profile of the n* scenarios: ``--profile`` or the card's default."""
    card = bench.instance.card
    if not bench.args.profile:
        return card.default_profile
    w, h, fps = parse_profile(bench.args.profile)
    return card.resolve_profile(width=w, height=h, fps=fps)


def parse_profile(text: str) -> tuple[int, int, int]:
    size, _, fps = text.partition("@")
    width, _, height = size.partition("x")
    return int(width), int(height), int(fps)


def scenarios(bench: Bench, names: list[str], small_limit: int) -> list[Scenario]:
    card, args = bench.instance.card, bench.args
    default = main_profile(bench)
    table = {
        "n1": Scenario("n1", default, 1),
        "n2": Scenario("n2", default, 2),
        "n3": Scenario("n3", default, 3),
        "n2job": Scenario("n2job", default, 2, job=True),
        "n2switch": Scenario("n2switch", default, 2, switch_every_s=args.switch_every),
    }
    out = []
    for full in names:
        name, _, suffix = full.partition("+")
        if suffix not in ("", "batch"):
            raise SystemExit(f"multisession: unknown suffix {suffix!r} of {full!r} (+batch)")
        batch = suffix == "batch"
        if name == "small":
            w, h, fps = parse_profile(args.small_profile)
            small = card.resolve_profile(width=w, height=h, fps=fps)
            out.append(
                Scenario("small", small, small_limit, admitted=True, ramp_s=args.ramp, batch=batch)
            )
        elif name in table:
            out.append(dataclasses.replace(table[name], batch=batch))
        else:
            raise SystemExit(f"multisession: unknown scenario {name!r}; known: {SCENARIOS}")
    return out
