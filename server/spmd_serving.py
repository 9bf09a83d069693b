"""``dreamrt serve --gpus N``: one model instance over N processes of one node.

A composition root beside ``server/app.py`` (it wires ``runtime/spmd.py`` to a loaded model):

- ``relaunch``: ``dreamrt serve --gpus N`` outside torchrun re-executes itself under
  ``torch.distributed.run --standalone --nproc-per-node N`` (so torchrun's own launch works
  too: ``torchrun --nproc-per-node N -m server.cli serve --gpus N ...``).
- every rank: ``join`` initialises the default process group (NCCL on CUDA with
  ``NCCL_NVLS_ENABLE=0`` unless set, gloo on CPU), checks the parallel plan (``--parallel``,
  else the card's, else ``sp`` = N) against the world and the DiT's heads before anything runs,
  builds the ``DeviceMesh``; with ``sp > 1`` shards the DiT (Ulysses) and splits the Wan VAE
  decode by rows over the ``sp`` ranks (``models/spmd/decode.py``; another codec decodes
  on rank 0); with ``cfg = 2`` gives each rank of a ``cfg`` pair one guidance branch of a CFG
  step (``models/loops/cfg_branches.py``); for a causal card reserves the default profile's K/V
  slabs; then returns the ``Channel``. ``replica > 1`` is refused (not served yet).
- rank 0 runs the server: the engine's executor is a ``Leader``; the HTTP and WebRTC side
  talk only to rank 0. Every other rank runs ``follow``: the same instance, a ``Follower``
  (with ``NaNWatch``, so a NaN seen on any rank fails the session everywhere), no server.

Limits (the routes answer with the instance's error, nothing diverges silently): only the
default profile's slabs exist on every rank, so a session at another resolution is refused;
the compile warm-up is skipped (it would run collectives on rank 0 alone). Forks copy K/V
slabs outside any op and are not mirrored: ``NoForks`` answers every fork request (a 422 naming
``n``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from server.config.groups import DEFAULT_MODEL

if TYPE_CHECKING:
    from sessions.session import Session

__all__ = [
    "NoForks",
    "follow",
    "join",
    "lead",
    "load",
    "plan_for",
    "relaunch",
    "with_plan",
    "world",
]

log = logging.getLogger(__name__)


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside it."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def plan_for(model_id: str | None, gpus: int, parallel: str = "") -> Any:
    """The checked parallel plan of card ``model_id`` (None: the default) on ``gpus`` ranks;
    ``parallel`` (``--parallel``, e.g. ``"cfg=2"``) overrides the card's."""
    from models import registry
    from models.spmd.plan import plan_for as card_plan

    return card_plan(with_plan(registry.get(model_id or DEFAULT_MODEL), parallel, gpus), gpus)


def with_plan(card: Any, parallel: str, gpus: int) -> Any:
    """``card`` with the plan ``parallel`` (``""``: unchanged); ``ParallelPlanError`` for a plan
    that does not parse or does not span ``gpus`` processes."""
    import dataclasses

    from models.card.parallel import ParallelPlan, ParallelPlanError

    if not parallel:
        return card
    plan = ParallelPlan.parse(parallel)
    if plan.world_size != gpus:
        raise ParallelPlanError(
            [f"--parallel {parallel!r} spans {plan.world_size} processes, --gpus is {gpus}"]
        )
    return dataclasses.replace(card, parallel=plan)


def relaunch(gpus: int, argv: list[str]) -> NoReturn:
    """Re-execute ``dreamrt <argv>`` as ``gpus`` torchrun processes of this node."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={gpus}", "-m", "server.cli", *argv]
    os.execv(sys.executable, cmd)


def join(instance: Any, gpus: int, num_slabs: int) -> Any:
    """This rank's part of the world (module docstring); returns its ``runtime.spmd.Channel``."""
    import torch
    import torch.distributed as dist

    from models.loops.cfg_branches import CfgBranches
    from models.spmd.decode import split_decode
    from models.spmd.plan import plan_for
    from runtime.spmd import Channel

    rank, size, _ = world()
    plan = plan_for(instance.card, size)
    cuda = instance.device.type == "cuda"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    mesh = plan.mesh(device.type)
    profile = instance.card.default_profile
    split = False
    if plan.sp > 1:
        sp_group = mesh["sp"].get_group()
        instance.shard_sequence(sp_group)
        latent_rows = profile.height // instance.card.latent.spatial_stride
        split = split_decode(instance, sp_group, latent_rows)  # else rank 0 decodes alone
    if plan.cfg == 2:  # each rank of a cfg pair runs one guidance branch of a CFG step
        instance.diffusion_step_op.branches = CfgBranches(mesh["cfg"].get_group())
    if "chunk_kv" in instance.card.caches:  # a causal card: its sessions' slabs on every rank
        _reserve_default_slabs(instance, gpus, num_slabs)
    log.info(
        "rank %d of %d: %s under sp=%d cfg=%d, VAE decode %s",
        *(rank, size, instance.card.model_id, plan.sp, plan.cfg),
        "split by rows" if split else "on rank 0",
    )
    return Channel(device=device, local_buffers=instance.rank_local_buffers())


def _reserve_default_slabs(instance: Any, gpus: int, num_slabs: int) -> None:
    """The default profile's K/V slabs on this rank; a later reservation of another geometry
    (a session at another resolution) raises the instance's error."""
    from models.instance import InstanceError

    profile = instance.card.default_profile
    reserved = instance.slab_geometry(profile)
    instance.reserve_kv_slabs(profile, num_slabs)
    reserve = instance.reserve_kv_slabs

    def default_profile_only(other: Any, slabs: int) -> Any:
        if instance.slab_geometry(other) != reserved:
            raise InstanceError(
                f"--gpus {gpus} serves the default profile only ({profile.width}x"
                f"{profile.height}): its K/V slabs are the ones every rank holds"
            )
        return reserve(other, slabs)

    instance.reserve_kv_slabs = default_profile_only


class NoForks:
    """The fork registry under ``--gpus``: a fork's slab copy would happen on rank 0 only."""

    def of(self, parent_id: str) -> None:
        return None

    async def fork(
        self, parent: Session, n: int, prompt: str | None = None, seeds: list[int] | None = None
    ) -> NoReturn:
        from sessions.forks import ForkError

        raise ForkError("n", "forks are not supported under --gpus N (K/V slab copies)")

    async def choose(self, parent: Session, candidate_id: str) -> NoReturn:
        from sessions.forks import ForkError

        raise ForkError("candidate", "forks are not supported under --gpus N")


def lead(engine: Any, channel: Any) -> None:
    """Rank 0: the engine (not started yet) executes through a ``Leader``."""
    from runtime.spmd import Leader

    Leader.install(engine, channel)


def load(config: Any, model_id: str) -> tuple[Any, Any]:
    """(card, instance) of ``config`` (a ``ServerConfig``): what ``server/app.py`` serves and
    what every other rank loads alike."""
    from models import registry
    from models.instance import load_instance
    from models.loops.chunk_rollout.restart import (
        RegenerateWhenSooner,
        RestartCutsOnly,
        restart_policy,
    )
    from models.loops.extensions import deploy_extensions
    from models.spmd.plan import plan_for
    from runtime.extensions import parse_extension_arg

    options = config.model
    card = registry.get(model_id)
    if options.chunk_frames is not None:  # e.g. 1: the latency mode (4 video frames per chunk)
        card = card.with_chunk_frames(options.chunk_frames)
    if options.gpus > 1:  # the plan is checked before any weight loads
        card = with_plan(card, options.parallel, options.gpus)
        plan_for(card, options.gpus)
    restart = config.engine.chunk_restart
    if restart == "auto":  # baseline steering: only a cut restarts the chunk in flight
        fast = config.engine.steering == "fast"
        restart = RegenerateWhenSooner.name if fast else RestartCutsOnly.name
    instance = load_instance(
        card,
        device=options.device,
        checkpoint_dir=options.checkpoint_dir,
        random_weights=options.random_weights,
        chunk_restart=restart_policy(restart),
        extensions=deploy_extensions([parse_extension_arg(a) for a in options.extensions]),
    )
    fp8 = None if options.fp8_linears == "off" else options.fp8_linears
    if options.compile:
        instance.compile(
            attention=options.attention,
            cuda_graphs=options.cuda_graphs,
            kv_cache=options.kv_cache,
            fp8=fp8,
        )
    else:
        instance.configure(kv_cache=options.kv_cache, fp8=fp8)
    instance.adapters.register_specs(options.adapters)  # AdapterError: a bad one, before serving
    return card, instance


def follow(config: Any) -> int:
    """A rank other than 0: load the same instance, join, run what rank 0 decides."""
    import torch
    import torch.distributed as dist

    from runtime.observers import NaNWatch
    from runtime.spmd import Follower, model_ops

    if config.model.device in ("auto", "cuda") and torch.cuda.is_available():
        torch.cuda.set_device(world()[2])

    _, instance = load(config, config.model.card or DEFAULT_MODEL)
    channel = join(instance, config.model.gpus, config.engine.max_sessions)
    try:
        Follower(channel, model_ops(instance), observers=(NaNWatch(),)).serve()
    finally:
        dist.destroy_process_group()
    return 0
