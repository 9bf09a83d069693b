"""Cross-session batching: several sessions' denoising steps as one DiT forward.

The batched forward gathers each session's K/V from its slab and rotates each at its own
stream position; it must agree with one forward per session within the stated tolerance, fall
back to one by one where keys differ, and be bit-identical in deterministic mode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from models.compile_guard import CompileGuard
from models.instance import load_instance
from models.loops.ops import ChunkDenoiseArgs
from models.loops.requests import SessionRequest
from models.precompiled import Region, aot_supported
from models.registry import get
from models.wan.dit.block import WanBlock, block_dynamic
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import InputShapeError, WanDiT
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry
from runtime.contract import Emission, Priority, Stream
from runtime.cost import CostModel
from runtime.driver import run_inline
from runtime.engine import Engine
from runtime.observers import BatchInfo, Observation
from runtime.step_edf import StepEdfScheduler

# float32 GEMMs over a batch of B may block and accumulate differently from B batches of one
RTOL, ATOL = 1e-4, 1e-5
CHUNK = 2


def make_model() -> WanDiT:
    cfg = WanDiTConfig(
        name="batch-test",
        dim=48,
        num_layers=2,
        num_heads=3,
        ffn_dim=64,
        freq_dim=16,
        text_dim=20,
        action_dim=4,
    )
    torch.manual_seed(1)
    return WanDiT(cfg).eval()


def latents(seed: int, frames: int = CHUNK) -> torch.Tensor:
    return torch.randn(1, 16, frames, 4, 6, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_forward_chunks_equals_one_forward_per_session() -> None:
    model = make_model()
    buffer = KVSlabBuffer(
        model.config, SlabGeometry(1, 2, 6), num_slabs=2, device="cpu", dtype=torch.float32
    )
    caches = [buffer.cache(0), buffer.cache(1)]
    crosses = [model.cross_kv(torch.randn(1, 4, 20)), model.cross_kv(torch.randn(1, 5, 20))]
    crosses[1] = type(crosses[1])(crosses[1].k[:, :, :4], crosses[1].v[:, :, :4])  # same L
    # session 0 is 3 chunks in, session 1 four: different RoPE positions, both caches full
    for cache, cross, chunks in ((caches[0], crosses[0], 3), (caches[1], crosses[1], 4)):
        for k in range(chunks):
            model.forward_chunk(
                latents(10 * chunks + k), torch.zeros(1), cross, cache, k * CHUNK, write_cache=True
            )
    starts, xs = [3 * CHUNK, 4 * CHUNK], [latents(1), latents(2)]
    t = torch.tensor([750.0, 250.0])
    action = torch.randn(2, 4)
    solo = [
        model.forward_chunk(
            xs[i], t[i : i + 1], crosses[i], caches[i], starts[i], action=action[i : i + 1]
        )
        for i in range(2)
    ]
    stacked_cross = type(crosses[0])(
        torch.cat([c.k for c in crosses], 1), torch.cat([c.v for c in crosses], 1)
    )
    batched = model.forward_chunks(torch.cat(xs), t, stacked_cross, caches, starts, action=action)
    for i in range(2):
        torch.testing.assert_close(batched[i : i + 1], solo[i], rtol=RTOL, atol=ATOL)
    assert not torch.allclose(solo[0], solo[1])  # two different sessions, not one twice
    fresh = buffer.cache(1)  # a cache with fewer keys cannot join the batch
    with pytest.raises(InputShapeError, match="one filled prefix"):
        model.forward_chunks(torch.cat(xs), t, stacked_cross, [caches[0], fresh], starts)


@pytest.mark.skipif(not aot_supported(), reason="this torch has no aot_compile")
def test_one_compiled_block_graph_serves_every_batch_size_above_one() -> None:
    model = make_model()
    buffer = KVSlabBuffer(
        model.config, SlabGeometry(1, 2, 6), num_slabs=4, device="cpu", dtype=torch.float32
    )
    caches = [buffer.cache(i) for i in range(4)]
    cross = model.cross_kv(torch.randn(1, 4, 20))
    with torch.inference_mode():
        for i, cache in enumerate(caches):  # every cache full: steady state
            for k in range(3):
                model.forward_chunk(
                    latents(10 * i + k), torch.zeros(1), cross, cache, k * CHUNK, write_cache=True
                )

        def batch(n: int) -> torch.Tensor:
            stacked = type(cross)(
                cross.k.expand(-1, n, -1, -1, -1), cross.v.expand(-1, n, -1, -1, -1)
            )
            xs = torch.cat([latents(100 + i) for i in range(n)])
            t = torch.linspace(250.0, 750.0, n)
            starts = [3 * CHUNK + i for i in range(n)]
            return model.forward_chunks(
                xs, t, stacked, caches[:n], starts, action=torch.randn(n, 4)
            )

        eager = {n: (torch.manual_seed(n), batch(n))[1] for n in (2, 3, 4)}
        region = Region(
            "dit.blocks",
            WanBlock.forward,
            list(model.blocks),
            CompileGuard(),
            dynamic=block_dynamic,
        )
        compiled = {n: (torch.manual_seed(n), batch(n))[1] for n in (2, 3, 4)}
    # one graph for 2, 3 and 4 sessions (the batch symbolic), the same results as eager
    assert region.signatures() == 1 and region.stats.compiled == 1
    assert not region.stats.fallbacks
    for n, want in eager.items():
        torch.testing.assert_close(compiled[n], want, rtol=RTOL, atol=ATOL)


def test_the_blocks_rule_leaves_a_session_alone_its_own_batch() -> None:
    x, e0 = torch.zeros(1, 12, 48), torch.zeros(1, 1, 6, 48)
    cos = sin = torch.zeros(12, 8)
    cross = torch.zeros(1, 4, 3, 16)
    past = (torch.zeros(1, 24, 3, 16), torch.zeros(1, 24, 3, 16))
    block = object()
    marks = block_dynamic((block, x, e0, cos, sin, cross, cross, past, None))
    assert [(t.shape, d) for t, d in marks] == [(past[0].shape, 1), (past[1].shape, 1)]
    masked = block_dynamic((block, x, e0, cos, sin, cross, cross, past, torch.ones(12, 36)))
    assert masked == []  # a masked call reads the whole cache: nothing symbolic
    two = [torch.zeros(2, *t.shape[1:]) for t in (x, e0, cross, cross, *past)]
    cos2 = sin2 = torch.zeros(2, 12, 8)
    marks = block_dynamic((block, two[0], two[1], cos2, sin2, two[2], two[3], tuple(two[4:]), None))
    marked = {(id(t), d) for t, d in marks}
    assert marked == {(id(t), 0) for t in (*two, cos2, sin2)} | {(id(t), 1) for t in two[4:]}


class BatchSpy:
    def __init__(self) -> None:
        self.sizes: list[tuple[str, int]] = []

    def before_batch(self, info: BatchInfo) -> None:
        self.sizes.append((info.kind, len(info.loop_ids)))

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[Any], wall_s: float
    ) -> Observation | None:
        return None


def frames_of(emissions: Sequence[Emission]) -> list[torch.Tensor]:
    return [torch.as_tensor(e.output) for e in emissions if e.spec.stream == Stream.MEDIA]


async def run_sessions(instance: Any, *, deterministic: bool) -> tuple[dict, BatchSpy]:
    spy = BatchSpy()
    engine = Engine(
        cost=CostModel(),
        scheduler=StepEdfScheduler(max_batch=3),
        deterministic=deterministic,
        observers=[spy],
        max_lead_s=1000.0,
    )
    await engine.start()
    out: dict[str, list[Emission]] = {}
    try:
        t0_s = time.monotonic()
        handles = [
            engine.spawn(
                instance.loop("chunk_rollout"),
                request(i),
                instance,
                loop_id=f"s{i}",
                priority=Priority.REALTIME,
                on_emit=out.setdefault(f"s{i}", []).append,
                media_t0_s=t0_s,
            )
            for i in range(3)
        ]
        for handle in handles:
            await asyncio.wait_for(handle.result(), 300)
    finally:
        await engine.close()
    return {k: frames_of(v) for k, v in out.items()}, spy


def request(i: int) -> SessionRequest:
    return SessionRequest(prompt=f"a red ball number {i}", seed=20 + i, max_chunks=5, kv_slab=i)


@pytest.mark.slow
async def test_sessions_batched_through_the_engine_agree_with_each_alone() -> None:
    instance = load_instance(get("wan-tiny-random"), device="cpu")
    instance.reserve_kv_slabs(instance.card.default_profile, 3)
    alone = {}
    for i in range(3):
        _, emissions = await run_inline(
            instance.loop("chunk_rollout"), request(i), instance, loop_id=f"s{i}"
        )
        alone[f"s{i}"] = frames_of(emissions)
    instance.batch_sessions(True)
    try:
        batched, spy = await run_sessions(instance, deterministic=False)
        exact, exact_spy = await run_sessions(instance, deterministic=True)
    finally:
        instance.batch_sessions(False)
    # steps of several sessions really shared a forward once the caches were full
    assert ("chunk_step", 3) in spy.sizes and ("chunk_step", 3) in exact_spy.sizes
    for loop_id, want in alone.items():
        for a, b, c in zip(batched[loop_id], exact[loop_id], want, strict=True):
            assert torch.equal(b, c)  # deterministic mode: bit-identical
            assert (a.int() - c.int()).abs().max() <= 2  # batched: uint8 within 2 levels


def test_incompatible_steps_in_one_batch_run_one_by_one() -> None:
    instance = load_instance(get("wan-tiny-random"), device="cpu")
    op = instance.chunk_step_op
    op.batchable = True
    cross = instance.dit.cross_kv(torch.randn(1, instance.text_len, instance.dit.config.text_dim))
    geometry = instance.slab_geometry(instance.card.default_profile)
    caches = [instance.kv_cache(geometry, None) for _ in range(2)]
    x = torch.randn(1, 16, 3, 8, 8)

    def args(cache: Any) -> ChunkDenoiseArgs:
        return ChunkDenoiseArgs(
            x=x,
            timestep=500.0,
            sigma=0.5,
            sigma_next=0.25,
            noise_seed=1,
            init_seed=None,
            cross=cross,
            cache=cache,
            frame_start=0,
            action=None,
            audio=None,
        )

    # equal caches are compatible: one forward, equal to the solo run within tolerance
    solo = op([args(caches[0])])[0]
    for y in op([args(caches[0]), args(caches[1])]):
        torch.testing.assert_close(y, solo, rtol=RTOL, atol=ATOL)
    # a cache holding a chunk reads other keys: the two steps run one by one, exactly as alone
    with torch.no_grad():
        instance.dit.forward_chunk(x, torch.zeros(1), cross, caches[1], 0, write_cache=True)
    alone = [op([args(caches[0])])[0], op([args(caches[1])])[0]]
    mixed = op([args(caches[0]), args(caches[1])])
    assert all(torch.equal(m, a) for m, a in zip(mixed, alone, strict=True))
    assert not torch.equal(alone[0], alone[1])
    op.batchable = False
