"""``dreamrt serve`` and ``dreamrt router`` once their flags are parsed (``server/cli.py``
builds the parser): the config, its checks before anything slow, and the uvicorn run.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["run_app", "serve"]


def run_app(app: FastAPI, args: argparse.Namespace, banner: str) -> int:
    import uvicorn

    sys.stdout.write(banner + "\n")
    sys.stdout.flush()
    # loop="asyncio": the standard loop whatever is installed (the fleet extra brings uvloop)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, loop="asyncio")
    return 0


def serve(args: argparse.Namespace, argv: list[str]) -> int:
    """``dreamrt serve``: a ServerConfig from the flags, ``DREAMRT_*`` and the config file
    (``server.config.sources``), checked, then served (rank 0) or followed (other ranks of
    ``--gpus N``). -> exit code."""
    import uvicorn

    from server import spmd_serving
    from server.app import create_app, resolve_admin_key
    from server.config.sources import load_config
    from server.edge.auth import InsecureBindError, WeakAdminKeyError, resolve_auth_mode
    from server.ops.shutdown import GracefulServer

    try:
        config = load_config(argv[1:] if argv[:1] == ["serve"] else argv)
        mode = resolve_auth_mode(config.host, config.auth, force=config.force_no_auth)
    except (InsecureBindError, ValueError) as exc:  # ConfigError is a ValueError
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    config = config.replace(auth=mode.value)
    gpus = config.model.gpus
    rank, world_size, _ = spmd_serving.world()
    if gpus > 1 and world_size == 1:
        from models.card.parallel import ParallelPlanError

        try:  # before any process starts or any weight loads
            spmd_serving.plan_for(config.model.card, gpus, config.model.parallel)
        except (ParallelPlanError, LookupError) as exc:
            sys.stderr.write(f"dreamrt: {exc}\n")
            return 2
        spmd_serving.relaunch(gpus, argv)
    if world_size != gpus:
        sys.stderr.write(f"dreamrt: --gpus {gpus} in a world of {world_size} processes\n")
        return 2
    from models.loops.extensions import deploy_extensions
    from runtime.extensions import ExtensionRejected, parse_extension_arg

    try:  # an unknown extension or invalid parameters: refuse to start
        deploy_extensions([parse_extension_arg(a) for a in config.model.extensions])
    except ExtensionRejected as exc:
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    if rank != 0:  # the server is rank 0's; the others run what it decides
        return spmd_serving.follow(config)
    try:
        resolve_admin_key(config, mode)
    except WeakAdminKeyError as exc:
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    sys.stdout.write(f"dreamrt: open http://{config.host}:{config.port}/  (auth {mode.value})\n")
    sys.stdout.flush()
    app = create_app(config)
    server = GracefulServer(
        uvicorn.Config(
            app, host=config.host, port=config.port, log_level=args.log_level, loop="asyncio"
        ),
        app,
        timeout_s=config.shutdown_timeout_s,
    )
    # a server that listens while it warms up (server.lifespan.starts_listening_first) stops itself
    # when its build fails
    app.state.stop_serving = lambda: setattr(server, "should_exit", True)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT: uvicorn raises it again at exit
        server.run()
    failed = getattr(app.state, "start_error", None) is not None
    return 0 if server.started and not failed else 3
