"""``chunk_rollout.fork``: a candidate continues the parent's live state exactly, in its own slab.

tiny-world on the CPU: a parent stream on slab 0 generates chunk 0 and stops at the chunk
boundary; forks on slabs 1 and 2 (the parent's seed, another seed) each generate the next
chunk, and so does the parent. The same-seed fork's chunk equals the parent's bit for bit;
the other seed's differs; the forks' caches are views of their own slabs, and the parent's
cache is untouched by them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from models import registry
from models.instance import load_instance
from models.loops.requests import SessionRequest
from runtime.contract import Stream
from runtime.driver import Driver, InlineContext


@pytest.fixture(scope="module")
def instance() -> Any:
    return load_instance(registry.get("tiny-world"), device="cpu")


async def next_chunk(driver: Driver[Any], ctx: InlineContext) -> np.ndarray:
    parts: list[np.ndarray] = []
    while True:
        ctx.emissions.clear()
        await driver.step()
        for e in ctx.emissions:
            if e.spec.stream == Stream.MEDIA:
                parts.append(np.asarray(e.output))
                if e.spec.meta.final:
                    while driver.state.phase.value != "start":  # to the chunk boundary
                        await driver.step()
                    return np.concatenate(parts)


async def test_fork_copies_the_state_into_its_slab_and_differs_only_by_seed(
    instance: Any,
) -> None:
    card = instance.card
    profile = card.default_profile
    buffer = instance.reserve_kv_slabs(profile, 3)
    loop = instance.loop("chunk_rollout")
    request = SessionRequest(prompt="a red ball on grass", seed=3, kv_slab=0)
    ctx = InlineContext("parent")
    parent = Driver(loop, ctx)
    parent.init(request, instance)
    await next_chunk(parent, ctx)
    state = parent.state
    before = state.kv.k.clone()
    forks = []
    for slab, seed in ((1, 3), (2, 99)):
        child = loop.fork(state, SessionRequest(prompt="", seed=seed, kv_slab=slab), instance)
        assert buffer.owns(child.kv) == slab and child.seed == seed
        assert torch.equal(child.kv.k, state.kv.k) and child.chunk == state.chunk
        forks.append((Driver.from_state(loop, cctx := InlineContext(f"f{slab}"), child), cctx))
    same, other = [await next_chunk(d, c) for d, c in forks]
    assert torch.equal(state.kv.k, before), "the forks wrote only their own slabs"
    mine = await next_chunk(parent, ctx)
    assert np.array_equal(same, mine), "same seed: the parent's next chunk, bit for bit"
    assert not np.array_equal(other, mine)
