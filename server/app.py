"""FastAPI application factory and composition root: the one place that builds the engine,
loads the model and wires sessions, store, auth, WebRTC and metrics together.

``create_app(ServerConfig(...))`` returns an app whose lifespan does the work. Startup: store
(SQLite under ``data_dir``) + recovery -> model instance(s), their LoRA adapters and extensions
-> engine (cost model calibrated from ``data_dir/cost/<card>@<device>.json`` when present, the
policy ``config.engine.scheduler``, admission, one executor thread, metrics as a batch
listener) -> KV slab pool -> session host, job host (resumes unfinished jobs) and trainer
controls on the same served models -> ICE host restriction and encoder bitrate. Shutdown:
viewers' peers -> sessions, jobs -> engine -> store; the process-wide aiortc/aioice settings
restored, the cost calibration saved to that file: nothing of the server keeps running.

Routes (``server.api``, ``server.openai``) reach these objects through ``request.app.state.ctx``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from runtime.errors import DreamrtError
from server.config.groups import DEFAULT_MODEL
from server.config.serve import ServerConfig
from server.context import ServerContext
from server.edge.auth import Authenticator, AuthMode, check_admin_key, resolve_auth_mode
from server.edge.request_guard import RequestGuard
from server.fleet.deployment import engine_id_for
from server.lifespan import lifespan_of
from server.media.webrtc import configure_video_bitrate, restrict_host_candidates
from server.ops.compile_cache import cost_file
from server.ops.heap_trim import HeapTrim, freeze_loaded_heap
from server.ops.loop_watchdog import LoopWatchdog
from server.ops.memory_watch import MemoryWatch
from server.ops.metrics import ServerMetrics
from server.ops.warm_start import (
    WarmUpProgress,
    compile_directory,
    compile_workers,
    load_cost,
    save_cost,
    warm_start,
)
from sessions.forks import ForkRegistry
from sessions.host import SessionHost
from sessions.job_host import JobHost
from sessions.recording import Recording
from sessions.resume import Resumer
from sessions.served_models import ServedModels
from sessions.store import Store
from sessions.trainer_controls import TrainerControls

__all__ = ["DEFAULT_MODEL", "ServerConfig", "ServerContext", "create_app", "resolve_admin_key"]

log = logging.getLogger(__name__)


def resolve_admin_key(config: ServerConfig, mode: AuthMode) -> str | None:
    """The admin key of token mode: the ``admin_key`` setting (``--admin-key``,
    ``$DREAMRT_ADMIN_KEY`` or the config file: ``server.config.sources``), the data dir's
    ``admin_key`` file, else a new one generated into that file. ``WeakAdminKeyError`` when
    the one found is under ``MIN_ADMIN_KEY_BYTES``."""
    if mode is AuthMode.NONE:
        return None
    if config.admin_key:
        return check_admin_key(config.admin_key, "the admin key (--admin-key, $DREAMRT_ADMIN_KEY)")
    path = config.data_dir / "admin_key"
    if path.exists():
        return check_admin_key(path.read_text().strip(), str(path))
    key = "drt_admin_" + secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(key + "\n")
    path.chmod(0o600)
    log.warning("generated an admin key in %s (token auth)", path)
    return key


async def _build(config: ServerConfig, progress: WarmUpProgress) -> ServerContext:
    # Heavy imports stay inside the lifespan: `dreamrt models` and the CLI parser do not pay them.
    from models.compiled_set import compiled_set
    from models.loops.inputs import action_vector, normalize_keys
    from runtime.admission import SLO_COMPUTE_CAPACITY, AdmissionConfig, AdmissionController
    from runtime.cost import CostModel, DeviceConstants
    from runtime.engine import Engine
    from runtime.faults import FaultInjector
    from runtime.lead import AdaptiveLead, FixedLead
    from runtime.observers import NaNWatch, Profiler
    from runtime.policies import make_scheduler
    from server import spmd_serving
    from server.ops.trace import ExecutorTrace

    mode = resolve_auth_mode(config.host, config.auth, force=config.force_no_auth)
    admin_key = resolve_admin_key(config, mode)  # a weak key fails here, before the model loads
    # before any slow work: an unknown policy name fails here, naming the known ones
    scheduler = make_scheduler(config.engine.scheduler, max_batch=config.engine.max_batch)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(config.data_dir / "dreamrt.sqlite3")
    unfinished_jobs = store.recover()
    model_id = config.model.card or DEFAULT_MODEL
    card, instance = await asyncio.to_thread(spmd_serving.load, config, model_id)
    # more GPUs: every rank joins the world; this one (rank 0) leads, the others follow
    channel = (
        spmd_serving.join(instance, config.model.gpus, config.engine.max_sessions)
        if config.model.gpus > 1
        else None
    )
    fast = config.engine.steering == "fast"
    device = str(instance.device)
    profile = card.default_profile
    # a job-only card (bidirectional) has no sessions: no chunk-KV, no session warm-up
    streams = "session.realtime" in card.capabilities
    compiled_dir = compile_directory(config, model_id, instance)
    warmed = (
        streams
        and channel is None
        and (config.model.warmup if config.model.warmup is not None else config.model.compile)
    )
    on_gpu = device.startswith("cuda")
    cost = CostModel(DeviceConstants.h200() if on_gpu else DeviceConstants.cpu())
    # measured plan costs: the calibration kept with the compiled artifacts (this card, GPU
    # model and levers: a restart from the cache on a fresh machine need not calibrate), then
    # the last run's on this machine, newer: admitted from the start
    cost_path = config.data_dir / "cost" / f"{model_id}@{device.replace(':', '-')}.json"
    cached = None if compiled_dir is None else cost_file(compiled_dir, instance.levers)
    for path in (cached, cost_path):
        if path is not None:
            load_cost(cost, path)
    # cross-session batching (server.config.groups.EngineConfig.batches_sessions): set before
    # the warm-up, which then compiles the batched shapes into the compiled set
    batching = config.engine.batches_sessions(on_gpu=on_gpu, spmd=channel is not None)
    if hasattr(instance, "batch_sessions"):
        instance.batch_sessions(batching)
    if warmed:
        served_set = compiled_set(instance.card, config.engine.max_batch if batching else 1)
        log.info(
            "warming up %s on %s (compiling every graph of the compiled set %s)",
            model_id,
            instance.device,
            ", ".join(served_set.describe()),
        )
        # then steady sessions calibrate the serving cost model: the first user's session is
        # priced by measurement (server.ops.warm_up.calibrate)
        await warm_start(
            instance,
            compiled_dir,
            served_set,
            config.engine.max_sessions,
            cost,
            progress,
            compile_workers(config),
        )
    admission = AdmissionController(
        AdmissionConfig(
            peak_capacity_bytes=(instance.peak_bytes(profile) if streams else 0)
            * config.engine.max_batch
            * 4,
            peak_concurrency=config.engine.max_batch,
            compute_capacity=(
                SLO_COMPUTE_CAPACITY
                if config.engine.compute_capacity is None
                else config.engine.compute_capacity
            ),
        )
    )
    # what the warm-up turned off (batched steps that never ran batched) stays off
    batching = batching and bool(getattr(instance, "batched_plan_kinds", frozenset)())
    # the metrics read live state through ``ctx`` (bound below, before the first scrape)
    metrics = ServerMetrics(lambda: ctx.metrics_snapshot())
    faults = FaultInjector() if config.engine.fault_injection else None
    trace = ExecutorTrace()
    if faults is not None:
        log.warning("fault injection is ON (POST /v1/faults): a test or drill setting")
    engine = Engine(
        cost=cost,
        scheduler=scheduler,
        admission=admission,
        deterministic=config.engine.deterministic,
        playout_buffer_s=config.engine.playout_buffer_s,
        max_lead_s=config.engine.max_lead_s,
        lead=AdaptiveLead(
            config.engine.max_lead_s,
            steer_lead_s=config.engine.steer_lead_s,
            steer_hold_s=config.engine.steer_hold_s,
        )
        if fast
        else FixedLead(config.engine.max_lead_s),
        withdraw_on_input=fast,
        # The profiler calibrates the cost model from measured plan times (admission and
        # deadlines then use what this machine really does); NaNWatch fails a session whose
        # step produced a non-finite value instead of streaming garbage. The fault injector
        # sits before the watch, so an injected NaN is caught the way a real one is.
        observers=(
            Profiler(cost),
            *(() if faults is None else (faults,)),
            NaNWatch(),
            trace,  # POST /v1/profile: a torch-profiler trace of the executor's batches
        ),
        listeners=(metrics,),
    )
    log.info(
        "scheduling policy: %s; steering %s (chunks of %d latent frames)",
        scheduler.name,
        config.engine.steering,
        card.default_profile.chunk_latent_frames,
    )
    if channel is not None:
        spmd_serving.lead(engine, channel)
    await engine.start()

    def validate_action(keys: list[str], mouse: tuple[float, float]) -> list[str]:
        action_vector(keys, mouse)  # raises InputError (a ValueError) naming the bad key/value
        return normalize_keys(keys)

    served = ServedModels({model_id: instance}, default=model_id)
    recording = Recording(
        config.data_dir,
        snapshot_every=config.recording.snapshot_every,
        snapshot_keep=config.recording.snapshot_keep,
        snapshot_mbps=config.recording.snapshot_mbps,
        snapshot_keep_gb=config.recording.snapshot_keep_gb,
        snapshot_dir=config.recording.snapshot_dir,
    )
    host = SessionHost(
        engine=engine,
        models=served,
        recording=recording,
        store=store,
        slabs_per_geometry=config.engine.max_sessions,
        action_validator=validate_action,
        admission_cost=config.engine.admission_cost,
        steering_cost=config.engine.steering_cost,
        max_pending_inputs=config.limits.max_pending_inputs,
        max_prompt_chars=config.limits.max_prompt_chars,
        handoff_dir=config.recording.snapshot_dir,
        max_batch=config.engine.max_batch if batching else 1,
    )
    jobs = JobHost(
        engine=engine,
        models=served,
        store=store,
        artifact_dir=config.data_dir / "artifacts",
        recording=recording,
    )
    host.preallocate()  # the default profile's chunk-KV slabs exist before the first session
    auth = Authenticator(mode, store=store, admin_key=admin_key)
    ctx = ServerContext(
        config=config,
        store=store,
        engine=engine,
        host=host,
        jobs=jobs,
        auth=auth,
        metrics=metrics,
        device=device,
        model_id=model_id,
        faults=faults,
        trace=trace,
        forks=ForkRegistry(host) if channel is None else spmd_serving.NoForks(),
        trainer=TrainerControls.build(host, jobs, engine),
        resumer=Resumer(host, config.data_dir, grace_s=config.recording.resume_grace_s),
        engine_id=config.fleet.engine_id or engine_id_for(config.host, config.port),
        public_url=config.fleet.public_url or f"http://{config.host}:{config.port}",
    )
    ctx.undo.append(lambda: save_cost(cost, cost_path))  # after the engine has stopped
    # the model and the warm-up's graphs live as long as the process: out of the collector's
    # walk, or a full collection stands the event loop still for seconds (server.ops.heap_trim);
    # before the watchdog, which would count the freeze's own collection as a stall
    ctx.undo.append(freeze_loaded_heap())
    # after the warm-up (whose compiles are expected): a stall now is one a viewer feels
    watchdog = LoopWatchdog(on_stall=metrics.loop_stalled)
    watchdog.start()
    ctx.undo.append(watchdog.close)
    if config.ice_hosts:
        ctx.undo.append(restrict_host_candidates(config.ice_hosts))
    if config.video_bitrate_bps is not None:
        ctx.undo.append(configure_video_bitrate(config.video_bitrate_bps))
    # from here on nothing compiles: a shape outside the warmed set runs eagerly, counted.
    # Before any plan runs again (a resumed job): the stance may not change inside a compile.
    seal = getattr(instance, "seal", None)
    if seal is not None:
        seal(enforce=bool(warmed))
        ctx.compiles_after_ready = instance.compiles_after_ready
    jobs.resume_jobs(unfinished_jobs)
    # ended sessions' freed native memory goes back to the OS (RSS does not ratchet up)
    ctx.heap = HeapTrim(
        lambda: sum(host.finished_states.values()), busy=lambda: bool(host.sessions())
    )
    ctx.heap.start()
    ctx.memory = MemoryWatch.from_env(config.data_dir)
    if ctx.memory is not None:
        ctx.memory.start()
    timeouts = [t for t in (config.unwatched_timeout_s, config.limits.idle_timeout_s) if t > 0]
    if timeouts:
        host.start_reaper(
            config.unwatched_timeout_s,
            interval_s=min(5.0, min(timeouts) / 2),
            max_idle_s=config.limits.idle_timeout_s,
        )
    if config.fleet.namespace is not None:  # after everything it serves exists
        from server.fleet.worker import FleetWorker

        ctx.fleet = FleetWorker(ctx)
        await ctx.fleet.start()
    progress.phase = "ready"
    log.info(
        "dreamrt ready: model %s on %s, auth %s, up to %d sessions",
        model_id,
        device,
        mode.value,
        config.engine.max_sessions,
    )
    return ctx


async def _teardown(ctx: ServerContext) -> None:
    ctx.draining = True
    if ctx.fleet is not None:  # leave the fleet first: nothing new is placed here
        with contextlib.suppress(Exception):
            await ctx.fleet.close()
    if ctx.heap is not None:
        await ctx.heap.close()
    if ctx.memory is not None:
        await ctx.memory.close()
    for participant in list(ctx.rooms.values()):
        with contextlib.suppress(Exception):
            await participant.close()
    for peer in list(ctx.peers.values()):
        with contextlib.suppress(Exception):
            await peer.close()
    if ctx.whep is not None:  # after the peers: their sessions end as their resources do
        await ctx.whep.close()
    await ctx.host.close()
    await ctx.jobs.close()
    await ctx.trainer.close()
    await ctx.engine.close()
    if ctx.host.recording is not None:  # queued snapshots and chunk media, then the store
        await asyncio.to_thread(ctx.host.recording.close)
    await asyncio.to_thread(ctx.store.close)
    for undo in reversed(ctx.undo):
        undo()
    log.info("dreamrt stopped")


def create_app(config: ServerConfig | None = None, **overrides: Any) -> FastAPI:
    """The dreamrt app for ``config`` (keyword overrides replace its settings, by key:
    ``create_app(data_dir=..., device="cpu")``)."""
    from server.api import deployment
    from server.api import jobs as routes_jobs
    from server.api import sessions as routes_sessions
    from server.api import system as routes_system
    from server.api import trainer as routes_trainer
    from server.api import whep as routes_whep
    from server.api import workflows as routes_workflows
    from server.edge.errors import error_response
    from server.openai import image_routes as routes_openai_images
    from server.openai import model_routes as routes_openai_models
    from server.openai import video_routes as routes_openai_videos
    from server.openai.errors import OpenAIErrorBodies

    config = (config or ServerConfig()).replace(**overrides)
    if isinstance(config.data_dir, str):
        config = config.replace(data_dir=Path(config.data_dir))

    # _build is looked up at each start: tests replace it to hold or fail a start
    progress = WarmUpProgress()  # GET /readyz shows it while the server starts
    lifespan = lifespan_of(config, lambda c: _build(c, progress), _teardown)
    app = FastAPI(title="dreamrt", version="0.1.0", lifespan=lifespan)
    app.state.config = config
    app.state.progress = progress
    app.state.draining = False  # set when a graceful shutdown begins (server.ops.shutdown)
    app.add_middleware(
        RequestGuard, limits=config.limits, draining=lambda: bool(app.state.draining)
    )
    app.add_middleware(OpenAIErrorBodies)  # outside the guard: its refusals take OpenAI's shape

    @app.exception_handler(DreamrtError)  # every error a client is told about (docs/api.md)
    async def dreamrt_error(request: Request, exc: DreamrtError) -> JSONResponse:
        return error_response(exc)

    app.include_router(routes_system.router)
    app.include_router(deployment.router)
    app.include_router(routes_sessions.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_workflows.router)
    app.include_router(routes_trainer.router)
    # the OpenAI-compatible API (models, videos, images), errors in OpenAI's shape
    app.include_router(routes_openai_models.router)
    app.include_router(routes_openai_videos.router)
    app.include_router(routes_openai_images.router)
    app.include_router(routes_whep.router)  # WHEP playback (RFC 9725)
    if config.engine.fault_injection:
        app.include_router(routes_system.faults_router)
    routes_system.mount_web(app, config.web_dir)
    return app
