"""KVSlabBuffer: sessions' chunk-KV caches are views of one preallocated tensor per geometry."""

from __future__ import annotations

import pytest
import torch

from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT
from models.wan.kv.cache import CacheShapeError, ChunkKVCache
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry

GEOMETRY = SlabGeometry(sink_frames=1, window_frames=2, tokens_per_frame=6)
CHUNK = 2


def make_model() -> WanDiT:
    cfg = WanDiTConfig(
        name="slab-test", dim=48, num_layers=2, num_heads=3, ffn_dim=64, freq_dim=16, text_dim=20
    )
    torch.manual_seed(1)
    return WanDiT(cfg).eval()


def make_buffer(model: WanDiT, num_slabs: int = 3) -> KVSlabBuffer:
    return KVSlabBuffer(
        model.config, GEOMETRY, num_slabs=num_slabs, device="cpu", dtype=torch.float32
    )


def latents(frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 16, frames, 4, 6, generator=g)  # 2 x 3 patches = 6 tokens per frame


@torch.no_grad()
def rollout(model: WanDiT, cache: ChunkKVCache, x: torch.Tensor) -> list[torch.Tensor]:
    """Denoise-then-cache, chunk by chunk, as a session does."""
    cross = model.cross_kv(torch.randn(1, 4, 20, generator=torch.Generator().manual_seed(3)))
    outs = []
    for start in range(0, x.shape[2], CHUNK):
        chunk = x[:, :, start : start + CHUNK]
        outs.append(model.forward_chunk(chunk, torch.tensor([500.0]), cross, cache, start))
        model.forward_chunk(chunk, torch.zeros(1), cross, cache, start, write_cache=True)
    return outs


def test_a_slab_view_is_the_buffer_itself_and_computes_what_an_own_cache_computes() -> None:
    model = make_model()
    buffer = make_buffer(model)
    view = buffer.cache(1)
    own = ChunkKVCache.allocate(
        model.config,
        batch=1,
        sink_frames=1,
        window_frames=2,
        tokens_per_frame=6,
        device="cpu",
        dtype=torch.float32,
    )
    assert view.k.shape == own.k.shape and buffer.owns(view) == 1 and buffer.owns(own) is None
    x = latents(4 * CHUNK, seed=5)
    for ours, ref in zip(rollout(model, view, x), rollout(model, own, x), strict=True):
        assert torch.equal(ours, ref)  # same kernels, same values: bit-identical
    assert torch.equal(buffer.k[:, 1:2], own.k) and view.slot_positions == own.slot_positions
    assert not buffer.k[:, 0].any() and not buffer.k[:, 2].any()  # the other slabs untouched
    assert buffer.valid[1].all() and not buffer.valid[0].any()


def test_fork_copies_a_slab_and_the_copies_then_diverge() -> None:
    model = make_model()
    buffer = make_buffer(model)
    parent = buffer.cache(0)
    rollout(model, parent, latents(2 * CHUNK, seed=6))
    buffer.copy_slab(0, 2)
    child = buffer.view(2)
    child.slot_positions = list(parent.slot_positions)
    child.frames_written = parent.frames_written
    assert torch.equal(buffer.k[:, 2], buffer.k[:, 0]) and torch.equal(child.valid, parent.valid)
    nxt = latents(CHUNK, seed=7)
    with torch.no_grad():
        cross = model.cross_kv(torch.randn(1, 4, 20))
        a = model.forward_chunk(nxt, torch.tensor([500.0]), cross, parent, 2 * CHUNK)
        b = model.forward_chunk(nxt, torch.tensor([500.0]), cross, child, 2 * CHUNK)
        assert torch.equal(a, b)  # same prefix, same continuation
        model.forward_chunk(
            latents(CHUNK, seed=8), torch.zeros(1), cross, child, 2 * CHUNK, write_cache=True
        )
    assert not torch.equal(buffer.k[:, 2], buffer.k[:, 0])  # writing the child spares the parent


def test_copy_from_moves_a_restored_cache_into_a_slab() -> None:
    model = make_model()
    buffer = make_buffer(model)
    own = ChunkKVCache.allocate(
        model.config,
        batch=1,
        sink_frames=1,
        window_frames=2,
        tokens_per_frame=6,
        device="cpu",
        dtype=torch.float32,
    )
    rollout(model, own, latents(2 * CHUNK, seed=9))
    slab = buffer.cache(2)
    slab.copy_from(own)
    assert torch.equal(buffer.k[:, 2:3], own.k) and slab.slot_positions == own.slot_positions
    assert slab.frames_written == own.frames_written
    small = ChunkKVCache.allocate(
        model.config,
        batch=1,
        sink_frames=0,
        window_frames=3,
        tokens_per_frame=6,
        device="cpu",
        dtype=torch.float32,
    )
    with pytest.raises(CacheShapeError, match="cannot copy"):
        slab.copy_from(small)


def test_a_fresh_cache_on_a_used_slab_starts_empty_and_bad_slabs_are_refused() -> None:
    model = make_model()
    buffer = make_buffer(model, num_slabs=2)
    rollout(model, buffer.cache(0), latents(CHUNK, seed=1))
    again = buffer.cache(0)  # the slab's next session: nothing of the last one leaks
    assert not buffer.k[:, 0].any() and again.frames_written == 0 and not again.valid.any()
    with pytest.raises(CacheShapeError, match="slab 2 is not in a buffer of 2"):
        buffer.cache(2)
    assert buffer.slab_bytes * 2 == buffer.nbytes and GEOMETRY.key == "s1w2t6"
