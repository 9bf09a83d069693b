"""SPMD serving on 2 gloo CPU processes: rank 0's engine runs two realtime sessions of the tiny
Wan card under Ulysses (sp=2), rank 1 follows (runtime/spmd.py).

One world, three claims: the session that no rank faults streams the same frames as one
process (float32: within 1e-5 of the 0..255 range, i.e. equal after rounding - measured exact,
the VAE decode split by rows over both ranks included); rank 1 ran exactly the batches rank 0
decided, in order, the decode among them and the leader-only text encode excepted; a fault
that only rank 1 sees (an observer's ``nan`` on session A's third chunk step) fails session A
on rank 0, is logged for the same batch on rank 1, and session B goes on.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.gloo_world import run_world

pytestmark = pytest.mark.slow

CHUNKS = 3


class _FaultOnRank:
    """Faults loop ``loop_id``'s chunk steps from the ``nth`` on (an observer: after the op's
    collectives, as a NaN check is)."""

    def __init__(self, loop_id: str, nth: int) -> None:
        self.loop_id, self.nth, self.seen = loop_id, nth, 0

    def before_batch(self, info) -> None:
        pass

    def after_batch(self, info, outputs, wall_s):
        from runtime.observers import Observation, PlanFault

        if info.op_name != "chunk_step" or self.loop_id not in info.loop_ids:
            return None
        self.seen += 1
        if self.seen < self.nth:
            return None
        return Observation(faults=(PlanFault(info.loop_ids.index(self.loop_id), "nan", "inj"),))


async def _serve(engine, instance, loop_ids: list[str]) -> dict:
    from models.loops.requests import SessionRequest
    from runtime.contract import Priority

    frames: dict[str, list[torch.Tensor]] = {i: [] for i in loop_ids}
    await engine.start()
    handles = [
        engine.spawn(
            instance.loop("chunk_rollout"),
            SessionRequest(prompt="a red kite", seed=5, max_chunks=CHUNKS, kv_slab=slab),
            instance,
            loop_id=loop_id,
            priority=Priority.BATCH,
            on_emit=lambda e, i=loop_id: e.spec.stream == "media" and frames[i].append(e.output),
        )
        for slab, loop_id in enumerate(loop_ids)
    ]
    ends = {}
    for loop_id, handle in zip(loop_ids, handles, strict=True):
        try:
            await handle.result()
            ends[loop_id] = "done"
        except Exception as exc:  # LoopFailed
            ends[loop_id] = f"{type(exc).__name__}: {exc}"
    await engine.close()
    return {"ends": ends, "frames": {i: torch.cat(f) if f else None for i, f in frames.items()}}


def _worker(rank: int, world: int) -> dict:
    from models.card import ParallelPlan
    from models.instance import load_instance
    from models.registry import get
    from models.spmd.decode import split_decode
    from runtime.cost import CostModel, DeviceConstants
    from runtime.engine import Engine
    from runtime.spmd import Channel, Follower, Leader, model_ops

    card = get("wan-tiny-random")
    reference = None
    if rank == 0:  # one process, no parallelism: what session B must stream
        single = load_instance(card, device="cpu")
        single.reserve_kv_slabs(card.default_profile, 2)
        engine = Engine(cost=CostModel(DeviceConstants.cpu()))
        reference = asyncio.run(_serve(engine, single, ["B"]))["frames"]["B"]
    instance = load_instance(card, device="cpu")
    plan = ParallelPlan(sp=world).check(world_size=world, num_heads=instance.dit_config.num_heads)
    group = plan.mesh("cpu")["sp"].get_group()
    instance.shard_sequence(group)
    assert split_decode(instance, group, card.default_profile.height // 8)
    instance.reserve_kv_slabs(card.default_profile, 2)
    channel = Channel(local_buffers=instance.rank_local_buffers())
    if rank == 0:
        engine = Engine(cost=CostModel(DeviceConstants.cpu()))
        leader = Leader.install(engine, channel)
        served = asyncio.run(_serve(engine, instance, ["A", "B"]))
        diff = (served["frames"]["B"].float() - reference.float()).abs().max().item()
        return {
            "ends": served["ends"],
            "b_frames": tuple(served["frames"]["B"].shape),
            "b_diff": diff,
            "decisions": leader.published,
        }
    log = []
    follower = Follower(
        channel, model_ops(instance), observers=[_FaultOnRank("A", 3)], on_batch=log.append
    )
    follower.serve()
    return {"log": log, "held": channel.held}


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_worker, 2, timeout_s=150)


def test_unfaulted_session_streams_single_process_frames(world: list[dict]) -> None:
    lead = world[0]
    assert lead["ends"]["B"] == "done"
    assert lead["b_frames"][0] > 0
    assert lead["b_diff"] <= 1e-5 * 255


def test_followers_ran_the_leaders_decisions(world: list[dict]) -> None:
    decided = world[0]["decisions"]
    ran = [(b.batch_id, b.op_name, b.loop_ids) for b in world[1]["log"]]
    assert ran == decided
    ops = {name for _, name, _ in decided}
    # the decode is split by rows (models/wan/vae/split.py): every rank runs it; text encode
    # stays on rank 0
    assert {"chunk_step", "vae_decode"} <= ops and "text_encode" not in ops


def test_a_fault_on_rank_1_fails_that_session_everywhere(world: list[dict]) -> None:
    ends = world[0]["ends"]
    assert ends["A"].startswith("LoopFailed") and "rank 1: inj" in ends["A"], ends
    failed = [b for b in world[1]["log"] if any(f is not None for f in b.failures)]
    assert failed, "rank 1 logged no failure"
    first = failed[0]
    index = first.loop_ids.index("A")
    assert first.failures[index] == ("nan", "rank 1: inj")
    # after the failure no batch of rank 1 holds A, while B's steps go on
    later = [b for b in world[1]["log"] if b.batch_id > first.batch_id]
    assert all("A" not in b.loop_ids for b in later if b.op_name == "chunk_step")
    assert any("B" in b.loop_ids for b in later)
