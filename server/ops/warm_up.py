"""The warm-up before serving: short throwaway sessions that trace, compile and capture every
graph of a compiled instance, at every profile of its compiled set (``models.compiled_set``),
so no user's session or job waits for compilation (``server.app``). The server seals the
instance afterwards (``WanInstance.seal``): nothing compiles after ready.

Then, given the serving cost model, one more session per profile and decoder runs into steady
state on an engine that calibrates it (``calibrate``): admission prices the first session of
each by measurement, not by the FLOP prior (on the H200 the prior priced an 832x480@16 session
at 0.405 GPU-s/s against 0.66-0.69 measured, so two sessions arriving together on a fresh
server would both have been admitted).

Where the server batches sessions' steps (``WanInstance.batch_sessions``), each profile also
warms up and calibrates with sessions side by side (``batched_sessions``): their steps run as
one forward, whose graphs (one for every batch size above one) are compiled before ready, and
admission prices a session by what it adds to the batch it joins."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.card import Profile
    from models.instance import WanInstance
    from models.loops.requests import SessionRequest
    from runtime.cost import CostModel
    from runtime.emissions import Emission
    from runtime.engine import Engine
    from runtime.loop_handle import LoopHandle

__all__ = [
    "batched_sessions",
    "calibrate",
    "compile_summary",
    "warm_up",
    "warm_up_set",
    "warm_up_stages",
]

log = logging.getLogger("server.app")  # the server's start lines, in one logger


async def warm_up_set(
    instance: WanInstance,
    profiles: Sequence[Profile],
    num_slabs: int,
    cost: CostModel | None = None,
    on_stage: Callable[[str, int, int], None] | None = None,
    max_batch: int = 1,
) -> dict[str, float]:
    """``warm_up`` at each of ``profiles`` in turn, then (``cost``: the serving cost model)
    ``calibrate`` at each -> seconds per step (``WxH/c``, ``calibration``). ``on_stage(name,
    done, total)`` is told when each stage begins and once all are done (``name`` "done"):
    per profile its sessions, batched sessions, its job and a session per other decoder
    (``warm_up_stages``), then the calibration. ``max_batch``: the compiled set's
    (``models.compiled_set``), the most sessions' steps the engine batches."""
    batch = batched_sessions(instance, max_batch, num_slabs)
    stages = [f"{_name(p)} {part}" for p in profiles for part in warm_up_stages(instance, batch)]
    if cost is not None:
        stages.append("calibration")
    done = 0

    def begun(name: str) -> None:
        nonlocal done
        if on_stage is not None:
            on_stage(name, done, len(stages))
        done += 1

    took: dict[str, float] = {}
    for profile in profiles:
        name = _name(profile)
        took[name] = await warm_up(
            instance, profile, num_slabs, functools.partial(_prefixed, begun, name), batch
        )
    if cost is not None:  # after every compile: the sessions below time compiled graphs only
        begun("calibration")
        began = time.perf_counter()
        for profile in profiles:
            await calibrate(instance, profile, cost, batched_sessions(instance, batch, num_slabs))
        took["calibration"] = time.perf_counter() - began
    if on_stage is not None:
        on_stage("done", len(stages), len(stages))
    return took


def _prefixed(tell: Callable[[str], None], profile: str, part: str) -> None:
    tell(f"{profile} {part}")


def warm_up_stages(instance: WanInstance, batch: int = 1) -> list[str]:
    """The parts ``warm_up`` runs at each profile, in order: its sessions, sessions side by
    side (where ``batch``, ``batched_sessions``, is 2 or more), a job (a card that makes
    videos), and one session per decoder other than the default."""
    parts = ["sessions"]
    if batch >= 2:
        parts.append("batched sessions")
    if "text_to_video" in instance.card.capabilities:
        parts.append("job")
    return parts + [f"{decoder} decoder" for decoder in _other_decoders(instance)]


def batched_sessions(instance: WanInstance, max_batch: int, num_slabs: int) -> int:
    """How many sessions side by side calibrate the batched steps of a profile: ``max_batch``
    (the engine's), at most one per K/V slab; 1 (none) where the instance does not batch
    sessions' steps (``batched_plan_kinds``) or fewer than two fit. That batch and a session
    alone give admission the line between (``runtime.cost``). The warm-up's side-by-side
    stage needs two: its graphs serve every batch size above one
    (``models.wan.dit.block.block_dynamic``)."""
    batches = bool(getattr(instance, "batched_plan_kinds", frozenset)())
    size = min(max_batch, num_slabs) if batches else 1
    return size if size >= 2 else 1


def compile_summary() -> dict[str, float]:
    """Where this process's compiling went, from Dynamo's own counters (``dynamo_timed``): the
    graphs it made, seconds tracing bytecode, seconds in the backend (Inductor: code generation
    and the C++/Triton compiler, or loading all of that from the compile cache) and analyses it
    restarted (a graph break makes Dynamo trace the frame again). Logged once the warm-up is
    done: on a start from the compile cache, what is left is mostly tracing. Cumulative over
    the process (``torch._dynamo.reset`` clears the times, not the graph count); empty where
    torch lacks these internals."""
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except ImportError:
        return {}
    times = {name: sum(values) for name, values in compilation_time_metrics.items()}
    return {
        "graphs": float(counters["stats"]["unique_graphs"]),
        "tracing_s": times.get("bytecode_tracing", 0.0),
        "backend_s": times.get("OutputGraph.call_user_compiler", 0.0),
        "restarts": float(len(compilation_time_metrics.get("compile_attempt_1", ()))),
    }


def _name(profile: Profile) -> str:
    return f"{profile.width}x{profile.height}/{profile.chunk_latent_frames}"


def _fill_chunks(instance: WanInstance, profile: Profile) -> int:
    """Chunks of ``profile`` until a session's K/V cache is full (then every chunk is steady)."""
    sink, ring = instance.kv_geometry(profile.chunk_latent_frames)
    return -(-(sink + ring) // profile.chunk_latent_frames)


async def calibrate(
    instance: WanInstance, profile: Profile, cost: CostModel, batch: int = 1
) -> None:
    """One session of ``profile`` per decoder, through the fill of its K/V cache and two
    steady chunks, on an engine whose cost model is ``cost``: what a steady chunk of each
    costs is measured before the first user's session is priced. With ``batch`` (2 or more,
    ``batched_sessions``) also that many sessions side by side, whose steady steps run as
    batches of ``batch``: what a session adds to a batch. What ``cost`` already knows (what a
    restart loaded from the compile cache's ``cost.json`` or from ``DATA_DIR/cost``) is
    skipped. Run it warm (every graph compiled), or it times the compiler."""
    from runtime.engine import Engine
    from runtime.observers import Profiler
    from sessions.session_pricing import batch_measured, steady_chunk_measured

    runs: list[tuple[str | None, int]] = [
        (decoder, 1)
        for decoder in (None, *_other_decoders(instance))
        if not steady_chunk_measured(cost, instance, profile, decoder)
    ]
    if batch >= 2 and not batch_measured(cost, instance, profile, batch):
        runs.append((None, batch))
    if not runs:
        return

    chunks = _fill_chunks(instance, profile) + 2
    profiler = Profiler(cost)  # what folds each batch's times into ``cost``, as serving's does
    engine = Engine(cost=cost, observers=(profiler,))
    await engine.start()
    try:
        for decoder, sessions in runs:
            await _side_by_side(
                engine, instance, profile, sessions, chunks, "calibration", decoder=decoder
            )
    finally:
        await engine.close()
    for _ in range(500):  # the last decodes' second-stream time, once the device is done
        if not profiler.collect():
            break
        await asyncio.sleep(0.01)


async def _side_by_side(
    engine: Engine,
    instance: WanInstance,
    profile: Profile,
    sessions: int,
    chunks: int,
    name: str,
    decoder: str | None = None,
) -> None:
    """``sessions`` sessions of ``profile`` on slabs 0 .. ``sessions - 1``, spawned together and
    run to ``chunks`` chunks without inputs: in lockstep, so the engine batches their steps
    wherever the instance lets it (steady caches of one profile present the same keys)."""
    from runtime.contract import Priority

    handles = [
        engine.spawn(
            instance.loop("chunk_rollout"),
            _session(profile, name, slab, chunks, decoder, seed=slab),
            instance,
            loop_id=f"{name}-{_name(profile)}-{decoder or 'default'}-{slab}of{sessions}",
            priority=Priority.BATCH,
            on_emit=lambda emission: None,
        )
        for slab in range(sessions)
    ]
    for handle in handles:
        await handle.result()


def _session(
    profile: Profile,
    prompt: str,
    slab: int,
    chunks: int,
    decoder: str | None = None,
    seed: int = 0,
) -> SessionRequest:
    """A throwaway session of ``profile`` on K/V slab ``slab``, ``chunks`` chunks long."""
    from models.loops.requests import SessionRequest

    return SessionRequest(
        prompt=prompt,
        seed=seed,
        max_chunks=chunks,
        kv_slab=slab,
        fps=profile.fps,
        width=profile.width,
        height=profile.height,
        decoder=decoder,
    )


async def warm_up(
    instance: WanInstance,
    profile: Profile,
    num_slabs: int,
    on_part: Callable[[str], None] | None = None,
    batch: int = 1,
) -> float:
    """Run short sessions of ``instance`` on a throwaway engine: through every K/V-prefix
    length into steady state, with the first chunk's two decode parts, prompt switches that
    re-cache at several prefix lengths (a restarted chunk runs the same graphs) and, with CUDA
    graphs, one KV update into every ring position (``instance.warmup_chunks``), so a compiled
    instance has traced, compiled and captured all its graphs before a user's session needs
    them. One session on slab 0; with CUDA graphs one per slab, side by side, since graphs are
    per slab; then (``batch`` >= 2: ``batched_sessions``) two sessions side by side for two
    chunks, whose steps run batched (``_warm_batches``); then a
    two-chunk t2v job (its clip's shapes); then, for each other
    decoder a session may pick (``"full"`` / ``"tiny"``), one short session with a prompt switch
    that decodes with it (the DiT's graphs are warm by then: only the decoder's compile). The
    serving engine (and its cost calibration) never sees them. ``on_part`` is told as each part
    begins (``warm_up_stages``' names). -> seconds it took."""
    from models.loops.requests import JobRequest
    from runtime.contract import InputEvent, InputKind, Priority, PromptInput
    from runtime.cost import CostModel
    from runtime.engine import Engine

    # one chunk more than the instance asks for: the chunk after the last prompt switch decodes
    # whole (a steady chunk), whatever the switches' spacing on a small cache
    chunks = instance.warmup_chunks(profile) + 1
    fill = _fill_chunks(instance, profile)
    slabs = range(num_slabs) if instance.levers.get("cuda_graphs") else range(1)
    # Sessions' caches are views of the preallocated slab buffer: warm up on them (free again
    # afterwards) so the compiled graphs see exactly the tensors sessions will pass.
    instance.reserve_kv_slabs(profile, num_slabs)
    engine = Engine(cost=CostModel())
    await engine.start()
    handles: list[LoopHandle] = []
    at = (0, fill // 2, fill) if "prompt.switch" in instance.card.capabilities else ()

    def on_emit(index: int, switch_at: tuple[int, ...]) -> Callable[[Emission], None]:
        def emitted(emission: Emission) -> None:
            meta = emission.spec.meta
            if emission.spec.stream == "media" and meta.final and meta.chunk in switch_at:
                text = f"warm-up {meta.chunk}"  # a switch at the next chunk: a re-cache
                handles[index].push_input(
                    InputEvent(InputKind.PROMPT, meta.chunk + 1, PromptInput(text=text))
                )

        return emitted

    def spawn_session(slab: int, max_chunks: int, decoder: str | None = None) -> LoopHandle:
        name = decoder or str(slab)
        handle = engine.spawn(
            instance.loop("chunk_rollout"),
            _session(profile, "warm-up", slab, max_chunks, decoder),
            instance,
            loop_id=f"warm-up-{profile.width}x{profile.height}-{name}",
            priority=Priority.BATCH,
            # the other decoders' sessions switch once: their DiT shapes are warm already
            on_emit=on_emit(len(handles), at if decoder is None else at[:1]),
        )
        handles.append(handle)
        return handle

    def part(name: str) -> None:
        if on_part is not None:
            on_part(name)

    start_s = time.perf_counter()
    try:
        part("sessions")
        for slab in slabs:
            spawn_session(slab, chunks)
        for handle in handles:
            await handle.result()
        if batch >= 2:
            part("batched sessions")
            await _warm_batches(engine, instance, profile)
        if "text_to_video" in instance.card.capabilities:
            # a two-chunk t2v job: what a job's loop plans that a session's does not
            part("job")
            frames = 2 * profile.chunk_latent_frames * instance.card.latent.temporal_stride
            job = engine.spawn(
                instance.loop_for("text_to_video"),
                JobRequest(
                    task="t2v",
                    prompt="warm-up job",
                    num_frames=frames,
                    width=profile.width,
                    height=profile.height,
                ),
                instance,
                loop_id=f"warm-up-job-{profile.width}x{profile.height}",
                priority=Priority.BATCH,
                on_emit=lambda emission: None,  # its frames are thrown away
            )
            await job.result()
        for decoder in _other_decoders(instance):
            # first chunk, a switch (a changing chunk decodes in parts) and steady chunks, all
            # at prefix lengths the sessions above compiled
            part(f"{decoder} decoder")
            await spawn_session(0, min(chunks, 4), decoder).result()
    finally:
        await engine.close()
    return time.perf_counter() - start_s


async def _warm_batches(engine: Engine, instance: WanInstance, profile: Profile) -> None:
    """Two sessions side by side for two chunks: their steps run as batches of two, the
    first chunk's without a past, the second's with one. With the batch and the K/V past
    length symbolic (``models.wan.dit.block.block_dynamic``) those two graphs serve every
    batch size above one at every prefix length, steady state included; a batch reads an
    unmasked prefix only (``models.loops.ops.ChunkDenoiseOp``). Batching is turned off if no
    step ran batched (its shapes would not be warm)."""
    forwards = instance.chunk_step_op.batch_forwards
    before = sum(n for size, n in forwards.items() if size >= 2)
    await _side_by_side(engine, instance, profile, 2, 2, "warm-up")
    if sum(n for size, n in forwards.items() if size >= 2) == before:
        log.warning(
            "%s: two warm-up sessions side by side never ran a batched step; cross-session "
            "batching is off (its shapes are not in the compiled set)",
            _name(profile),
        )
        instance.batch_sessions(False)


def _other_decoders(instance: WanInstance) -> tuple[str, ...]:
    """The decoders a session may pick other than the default one (none for a model with one)."""
    options = tuple(getattr(instance, "decoder_options", tuple)())
    default = getattr(instance, "default_decoder", None)
    return tuple(option for option in options if option != default)
