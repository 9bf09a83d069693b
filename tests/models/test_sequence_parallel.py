"""Ulysses sequence parallelism on 2 gloo CPU processes equals one process (tiny preset).

One world runs every check (spawning costs more than the math): a chunk-causal rollout of
five chunks (denoising steps, K/V writes, the sink + window eviction, masked and unmasked
attention, a per-frame timestep) through the tiny DiT, once whole on each rank and once with
``sequence_parallel.enable`` over the world. Tolerance: 1e-5 relative to the output's largest
magnitude (float32; the sharded run does the same matmuls on fewer rows, so only summation
order can differ - measured ~1e-7).
"""

from __future__ import annotations

import pytest
import torch

from models.card import ParallelPlan
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.sequence_parallel import local_kv_config
from models.wan.dit.transformer import WanDiT
from models.wan.kv.cache import ChunkKVCache
from tests.gloo_world import run_world

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
CHUNK = 3  # latent frames
HW = (8, 8)  # latent -> 4 x 4 = 16 tokens per frame


def _cache(config: WanDiTConfig) -> ChunkKVCache:
    return ChunkKVCache.allocate(
        config,
        batch=1,
        sink_frames=CHUNK,
        window_frames=2 * CHUNK,
        tokens_per_frame=16,
        device="cpu",
        dtype=torch.float32,
    )


def _rollout(dit: WanDiT, cache: ChunkKVCache) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    text = torch.randn(1, 16, dit.config.text_dim, generator=gen)
    cross = dit.cross_kv(text)
    outs = []
    for chunk in range(5):
        x = torch.randn(1, 16, CHUNK, *HW, generator=gen)
        start = chunk * CHUNK
        for t in (torch.tensor([900.0]), torch.tensor([[500.0, 450.0, 400.0]])):
            outs.append(dit.forward_chunk(x, t, cross, cache, start))
        outs.append(dit.forward_chunk(x, torch.zeros(1), cross, cache, start, write_cache=True))
    return outs


def _sp_worker(rank: int, world: int) -> dict:
    from models.wan.dit.sequence_parallel import enable

    config = WanDiTConfig.preset("tiny")
    torch.manual_seed(0)
    reference = WanDiT(config).eval()
    torch.manual_seed(0)
    sharded = WanDiT(config).eval()
    with torch.no_grad():
        ref_cache = _cache(config)
        ref = _rollout(reference, ref_cache)
        mesh = ParallelPlan(sp=world).mesh("cpu")
        shards = enable(sharded, mesh["sp"].get_group())
        local = _cache(local_kv_config(config, shards.size))
        out = _rollout(sharded, local)
    heads = config.num_heads // world
    mine = slice(rank * heads, (rank + 1) * heads)
    return {
        "rel_err": max(((o - r).abs().max() / r.abs().max()).item() for o, r in zip(out, ref)),
        "outputs": len(out),
        "local_heads": local.k.shape[3],
        "cache_err": (local.k - ref_cache.k[:, :, :, mine]).abs().max().item(),
        "cache_nonzero": bool(local.k.abs().sum() > 0),
        "slots_equal": local.slot_positions == ref_cache.slot_positions,
        "out_sum": float(out[-1].sum()),
        "mesh": (mesh.mesh_dim_names, tuple(mesh.shape), shards.rank),
    }


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_sp_worker, 2)


def test_sharded_rollout_equals_one_process(world: list[dict]) -> None:
    for rank in world:
        assert rank["outputs"] == 15
        assert rank["rel_err"] < TOLERANCE, rank
    # every rank returns the whole chunk (the head's output is all-gathered)
    assert world[0]["out_sum"] == world[1]["out_sum"]


def test_plan_builds_the_mesh_the_shards_use(world: list[dict]) -> None:
    assert [r["mesh"] for r in world] == [
        (("replica", "cfg", "sp"), (1, 1, 2), 0),
        (("replica", "cfg", "sp"), (1, 1, 2), 1),
    ]


def test_each_rank_caches_its_heads_only(world: list[dict]) -> None:
    for rank in world:
        assert rank["local_heads"] == 1  # tiny: 2 heads over sp=2
        assert rank["cache_nonzero"] and rank["slots_equal"]
        assert rank["cache_err"] < 1e-5, rank


def test_local_kv_config_keeps_head_dim() -> None:
    config = WanDiTConfig.preset("wan2.1-14b")
    local = local_kv_config(config, 4)
    assert (local.num_heads, local.head_dim, local.num_layers) == (10, 128, 40)
    with pytest.raises(ValueError, match="does not divide"):
        local_kv_config(config, 3)
