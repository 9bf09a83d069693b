"""``dreamrt compile``: build the compile cache of a card and its compiled set without serving.

It takes ``dreamrt serve``'s settings (flags, ``DREAMRT_*``, ``--config FILE``) - the card,
device, weights, levers, ``--compile-cache`` and ``--data-dir`` - loads the instance as the
server would, warms up every profile of the compiled set and calibrates the cost model
(``server.ops.warm_start``), then prints what it built and exits. A server started afterwards with
the same settings and cache (on this machine, or on another of the same GPU model and torch
that mounts or copies the directory) loads all of it and traces nothing: for container images
and shared volumes, build once and start many.

Exit codes: 0 built; 1 the build failed, or a region could not be precompiled whole (a graph
break: it would compile just in time at every start, the output names it); 2 bad settings.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.config.serve import ServerConfig

__all__ = ["compile_cache_command"]


def compile_cache_command(argv: list[str]) -> int:
    """``dreamrt compile ARGS`` (``argv`` without the command) -> exit code."""
    from server.config.sources import load_config

    try:
        config = load_config(argv)
    except ValueError as exc:  # ConfigError is a ValueError
        sys.stderr.write(f"dreamrt: {exc}\n")
        return 2
    if config.model.gpus > 1:
        sys.stderr.write("dreamrt: compile builds the cache of one GPU (--gpus 1)\n")
        return 2
    config = config.replace(compile=True)
    try:
        return asyncio.run(_compile(config))
    except Exception as exc:  # noqa: BLE001 - the user gets the reason, not a traceback
        sys.stderr.write(f"dreamrt: compile failed: {type(exc).__name__}: {exc}\n")
        return 1


async def _compile(config: ServerConfig) -> int:
    import time

    from models.compiled_set import compiled_set
    from runtime.cost import CostModel, DeviceConstants
    from server import spmd_serving
    from server.config.groups import DEFAULT_MODEL
    from server.ops.compile_cache import INDUCTOR_DIR, cache_bytes, cost_file, portable_bytes
    from server.ops.warm_start import (
        WarmUpProgress,
        compile_directory,
        compile_workers,
        load_cost,
        warm_start,
    )

    began = time.monotonic()
    model_id = config.model.card or DEFAULT_MODEL
    card, instance = await asyncio.to_thread(spmd_serving.load, config, model_id)
    if "session.realtime" not in card.capabilities:
        sys.stderr.write(f"dreamrt: {model_id} serves no sessions: nothing to warm up\n")
        return 2
    directory = compile_directory(config, model_id, instance)
    assert directory is not None  # compile=True
    on_gpu = str(instance.device).startswith("cuda")
    cost = CostModel(DeviceConstants.h200() if on_gpu else DeviceConstants.cpu())
    load_cost(cost, cost_file(directory, instance.levers))
    # the set ``serve`` with these settings warms: its batch sizes where it batches sessions
    batching = config.engine.batches_sessions(on_gpu=on_gpu, spmd=False)
    instance.batch_sessions(batching)
    served = compiled_set(instance.card, config.engine.max_batch if batching else 1)
    done = await warm_start(
        instance,
        directory,
        served,
        config.engine.max_sessions,
        cost,
        WarmUpProgress(),
        compile_workers(config),
    )
    out = sys.stdout
    out.write(f"compiled {model_id} on {instance.device}: {', '.join(served.describe())}\n")
    out.write("| region | graphs | compiled | compile s | loaded | load s |\n")
    out.write("| --- | --- | --- | --- | --- | --- |\n")
    for name, region in done.regions.items():
        out.write(
            f"| {name} | {region['signatures']} | {region['compiled']} | "
            f"{region['compile_s']:.1f} | {region['loaded']} | {region['load_s']:.1f} |\n"
        )
    dynamo = done.dynamo
    out.write(
        f"Dynamo: {int(dynamo.get('graphs', 0))} graphs, tracing {dynamo.get('tracing_s', 0):.1f}"
        f" s, backend {dynamo.get('backend_s', 0):.1f} s\n"
    )
    out.write(
        f"cache: {directory} ({cache_bytes(directory) / 1e6:.1f} MB; without {INDUCTOR_DIR}/, "
        f"what a GPU start needs: {portable_bytes(directory) / 1e6:.1f} MB), "
        f"{time.monotonic() - began:.1f} s in all\n"
    )
    breaks = done.graph_breaks()
    for reason in breaks:
        out.write(f"graph break: {reason}\n")
    out.flush()
    return 1 if breaks else 0
