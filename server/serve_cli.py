"""``dreamrt serve`` and ``dreamrt router`` once their flags are parsed (``server/cli.py``
builds the parser): the config, its checks before anything slow, and the uvicorn run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

__all__ = ["run_app", "serve"]


def run_app(app: object, args: argparse.Namespace, banner: str) -> int:
    import uvicorn

    sys.stdout.write(banner + "\n")
    sys.stdout.flush()
    # loop="asyncio": the standard loop whatever is installed (the fleet extra brings uvloop)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, loop="asyncio")
    return 0


def serve(args: argparse.Namespace, argv: list[str]) -> int:
    """``dreamrt serve``: a ServerConfig from the flags, checked, then served (rank 0) or
    followed (other ranks of ``--gpus N``). -> exit code."""
    import uvicorn

    from server import spmd_serving
    from server.app import ServerConfig, create_app, resolve_admin_key
    from server.auth import InsecureBindError, WeakAdminKeyError, resolve_auth_mode
    from server.limits import limits_from_args
    from server.shutdown import GracefulServer

    rank, world_size, _ = spmd_serving.world()
    if args.gpus > 1 and world_size == 1:
        from models.card_parallel import ParallelPlanError

        try:  # before any process starts or any weight loads
            spmd_serving.plan_for(args.model, args.gpus, args.parallel)
        except (ParallelPlanError, LookupError) as exc:
            sys.stderr.write(f"dreamrt: {exc}\n")
            return 2
        spmd_serving.relaunch(args.gpus, argv)
    if world_size != args.gpus:
        sys.stderr.write(f"dreamrt: --gpus {args.gpus} in a world of {world_size} processes\n")
        return 2

    try:
        mode = resolve_auth_mode(args.host, args.auth, force=args.force_no_auth)
        limits = limits_from_args(args)
    except (InsecureBindError, ValueError) as exc:
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    from models.loops.extensions import deploy_extensions
    from runtime.extensions import ExtensionRejected, parse_extension_arg

    try:  # an unknown extension or invalid parameters: refuse to start
        deploy_extensions([parse_extension_arg(a) for a in args.extension])
    except ExtensionRejected as exc:
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    config = ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        device=args.device,
        data_dir=args.data_dir,
        ice_hosts=tuple(args.ice_host),
        ice_servers=tuple(args.ice_server),
        auth=mode.value,
        force_no_auth=args.force_no_auth,
        admin_key=args.admin_key,
        max_sessions=args.max_sessions,
        video_bitrate_bps=args.bitrate,
        deterministic=args.deterministic,
        scheduler=args.scheduler,
        compile=args.compile,
        compile_cache=args.compile_cache,
        attention=args.attention,
        cuda_graphs=args.cuda_graphs,
        warmup=False if args.no_warmup else None,
        checkpoint_dir=args.checkpoint,
        adapters=tuple(args.adapter),
        random_weights=args.random_weights,
        chunk_frames=args.chunk_frames,
        steering=args.steering,
        admission_cost=args.admission_cost,
        unwatched_timeout_s=args.unwatched_timeout,
        snapshot_every=args.snapshot_every,
        snapshot_keep=args.snapshot_keep,
        snapshot_mbps=args.snapshot_mbps,
        snapshot_keep_gb=args.snapshot_keep_gb,
        livekit_key=args.livekit_key,
        livekit_secret=args.livekit_secret,
        snapshot_dir=args.snapshot_dir,
        fleet=args.fleet,
        fleet_discovery=args.fleet_discovery,
        fleet_dir=args.fleet_dir,
        engine_id=args.engine_id,
        public_url=args.public_url,
        extensions=tuple(args.extension),
        gpus=args.gpus,
        parallel=args.parallel,
        limits=limits,
        fault_injection=args.fault_injection,
        shutdown_timeout_s=args.shutdown_timeout,
        resume_grace_s=args.resume_grace,
    )
    if rank != 0:  # the server is rank 0's; the others run what it decides
        return spmd_serving.follow(config)
    try:
        resolve_admin_key(config, mode)
    except WeakAdminKeyError as exc:
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    sys.stdout.write(f"dreamrt: open http://{args.host}:{args.port}/  (auth {mode.value})\n")
    sys.stdout.flush()
    app = create_app(config)
    server = GracefulServer(
        uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level, loop="asyncio"
        ),
        app,
        timeout_s=args.shutdown_timeout,
    )
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT: uvicorn raises it again at exit
        server.run()
    return 0 if server.started else 3
