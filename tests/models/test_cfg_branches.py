"""The ``cfg`` axis on 2 gloo CPU processes: a 50-step CFG job (``diffusion_denoise``, guidance
5) of the tiny bidirectional Wan card, each rank running one guidance branch per step
(models/loops/cfg_branches.py), rank 0's engine scheduling and rank 1 following
(runtime/spmd.py), against the same job in one process (both branches as one batch of 2).

Tolerance: the final latents within 1e-4 relative to their largest value (float32: two
batch-1 forwards instead of one of batch 2, rounding compounded over 50 Euler steps; measured
below 1e-6) and the uint8 frames within 1 of 255. Every step ran on both ranks, each with half
the batch. About 15-25 s (load).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.gloo_world import run_world

pytestmark = pytest.mark.slow

CARD = "wan2.1-t2v-tiny-random"


async def _job(engine, instance) -> dict:
    from models.loops.requests import JobRequest
    from runtime.contract import Priority

    await engine.start()
    request = JobRequest(task="t2v", prompt="a red kite", num_frames=5, seed=2)
    handle = engine.spawn(
        instance.loop("diffusion_denoise"),
        request,
        instance,
        loop_id="job",
        priority=Priority.BATCH,
        on_emit=lambda e: None,
    )
    outputs = (await handle.result()).outputs
    await engine.close()
    return outputs


class _Batches:
    """Records the batch size of every DiT forward of a diffusion step (what a rank computed)."""

    def __init__(self, dit) -> None:
        self.sizes: list[int] = []
        self._forward = dit.forward
        dit.forward = self

    def __call__(self, x, t, text, **kw):
        self.sizes.append(x.shape[0])
        return self._forward(x, t, text, **kw)


def _worker(rank: int, world: int) -> dict:
    import torch

    from models.card import ParallelPlan
    from models.instance import load_instance
    from models.loops.cfg_branches import CfgBranches
    from models.registry import get
    from runtime.cost import CostModel, DeviceConstants
    from runtime.engine import Engine
    from runtime.spmd import Channel, Follower, Leader, model_ops

    card = get(CARD)
    out: dict = {}
    if rank == 0:  # one process: both branches in one batch of 2
        single = load_instance(card, device="cpu")
        batches = _Batches(single.dit)
        ref = asyncio.run(_job(Engine(cost=CostModel(DeviceConstants.cpu())), single))
        out["single_batches"] = set(batches.sizes)
    instance = load_instance(card, device="cpu")
    plan = ParallelPlan(cfg=2).check(world_size=world, num_heads=instance.dit_config.num_heads)
    instance.diffusion_step_op.branches = CfgBranches(plan.mesh("cpu")["cfg"].get_group())
    batches = _Batches(instance.dit)
    channel = Channel(local_buffers=instance.rank_local_buffers())
    if rank == 0:
        engine = Engine(cost=CostModel(DeviceConstants.cpu()))
        Leader.install(engine, channel)
        got = asyncio.run(_job(engine, instance))
        latents, ref_latents = got["latents"].float(), ref["latents"].float()
        out["latent_err"] = ((latents - ref_latents).abs().max() / ref_latents.abs().max()).item()
        frames, ref_frames = got["frames"].int(), ref["frames"].int()
        out["frames_shape"] = (tuple(frames.shape), tuple(ref_frames.shape))
        out["frame_err"] = (frames - ref_frames).abs().max().item()
    else:
        log: list = []
        Follower(channel, model_ops(instance), on_batch=log.append).serve()
        out["steps"] = sum(b.op_name == "diffusion_step" for b in log)
    out["batches"] = batches.sizes
    del torch
    return out


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_worker, 2, timeout_s=150)


def test_cfg_over_two_ranks_equals_one_process(world: list[dict]) -> None:
    lead = world[0]
    assert lead["latent_err"] <= 1e-4
    shape, ref_shape = lead["frames_shape"]
    assert shape == ref_shape and shape[0] >= 5
    assert lead["frame_err"] <= 1


def test_each_rank_ran_one_branch_of_every_step(world: list[dict]) -> None:
    lead, follower = world
    assert lead["single_batches"] == {2}  # one process: batched CFG
    assert follower["steps"] == 50  # the card's schedule, every step on rank 1 too
    assert lead["batches"] == follower["batches"] == [1] * 50
