"""Chunk-causal rollout over ChunkKVCache vs one block-causal forward; eviction, fork, reset."""

from __future__ import annotations

import pytest
import torch

from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import InputShapeError, WanDiT
from models.wan.kv.cache import EMPTY, CacheShapeError, ChunkKVCache, WriteRun
from runtime.contract import LoopState
from runtime.snapshot import restore_state, snapshot_state

TOLERANCE = 1e-5
CHUNK = 2  # latent frames per chunk
GRID_HW = (4, 6)  # latent H, W -> 2 x 3 = 6 tokens per frame
TOKENS = 6


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def make_model(**overrides) -> WanDiT:
    cfg = WanDiTConfig(
        name="kv-test",
        dim=48,
        num_layers=2,
        num_heads=3,
        ffn_dim=64,
        freq_dim=16,
        text_dim=20,
        **overrides,
    )
    torch.manual_seed(1)
    model = WanDiT(cfg).eval()
    with torch.no_grad():  # give the zero-initialised hooks real weights so they matter
        for hook in (model.action_embedding, model.audio_embedding):
            if hook is not None:
                hook[2].weight.normal_(0.0, 0.3)
                hook[2].bias.normal_(0.0, 0.3)
    return model


def make_cache(model: WanDiT, sink: int, window: int, batch: int = 1) -> ChunkKVCache:
    return ChunkKVCache.allocate(
        model.config,
        batch=batch,
        sink_frames=sink,
        window_frames=window,
        tokens_per_frame=TOKENS,
        device="cpu",
        dtype=torch.float32,
    )


def latents(frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 16, frames, *GRID_HW, generator=gen)


@torch.no_grad()
def test_chunked_rollout_equals_one_block_causal_forward() -> None:
    """Self-Forcing pattern per chunk: a denoise pass (no write), then the KV update (write).

    The denoise pass on noisy chunk i must equal the block-causal forward of [clean 0..i-1,
    noisy i] with per-frame timesteps; the update pass must equal the block-causal forward of
    the clean frames at t = 0. Hooks are live: per-chunk actions and per-frame audio.
    """
    model = make_model(action_dim=10, audio_dim=6)
    batch, chunks = 2, 4
    frames = chunks * CHUNK
    clean, noisy = latents(frames, batch, seed=1), latents(frames, batch, seed=2)
    text = torch.randn(batch, 5, 20)
    actions = torch.randn(batch, chunks, 10)
    audio = torch.randn(batch, frames, 6)
    per_frame_action = actions.repeat_interleave(CHUNK, dim=1)  # [B, F, 10]
    t_noisy = torch.tensor([750.0, 250.0])

    update_ref = model.forward_block_causal(
        clean, torch.zeros(batch), text, CHUNK, action=per_frame_action, audio=audio
    )
    cache = make_cache(model, sink=1, window=frames, batch=batch)
    cross = model.cross_kv(text)
    for i in range(chunks):
        now = slice(i * CHUNK, (i + 1) * CHUNK)
        mixed = torch.cat((clean[:, :, : i * CHUNK], noisy[:, :, now]), dim=2)
        t_frames = torch.zeros(batch, (i + 1) * CHUNK)
        t_frames[:, i * CHUNK :] = t_noisy[:, None]
        denoise_ref = model.forward_block_causal(
            mixed,
            t_frames,
            text,
            CHUNK,
            action=per_frame_action[:, : (i + 1) * CHUNK],
            audio=audio[:, : (i + 1) * CHUNK],
        )
        denoised = model.forward_chunk(
            noisy[:, :, now],
            t_noisy,
            cross,
            cache,
            i * CHUNK,
            action=actions[:, i],
            audio=audio[:, now],
        )
        assert cache.frames_written == i * CHUNK  # the denoise pass wrote nothing
        updated = model.forward_chunk(
            clean[:, :, now],
            torch.zeros(batch),
            cross,
            cache,
            i * CHUNK,
            action=actions[:, i],
            audio=audio[:, now],
            write_cache=True,
        )
        assert rel_err(denoised, denoise_ref[:, :, now]) <= TOLERANCE, f"denoise chunk {i}"
        assert rel_err(updated, update_ref[:, :, now]) <= TOLERANCE, f"update chunk {i}"
    assert cache.frames_written == frames
    assert cache.slot_positions == list(range(frames)) + [EMPTY]


@torch.no_grad()
def test_rolling_eviction_keeps_the_sinks_and_the_latest_window() -> None:
    model = make_model()
    sink, window, chunks = 1, 3, 6  # 12 frames through a 4-frame cache
    cache = make_cache(model, sink, window)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(chunks * CHUNK, seed=3)
    snapshots = []  # cache K/V right after each chunk's write
    for i in range(chunks):
        now = slice(i * CHUNK, (i + 1) * CHUNK)
        out = model.forward_chunk(
            x[:, :, now], torch.zeros(1), cross, cache, i * CHUNK, write_cache=True
        )
        assert torch.isfinite(out).all()
        snapshots.append((cache.k.clone(), cache.v.clone()))

    # frame n >= 1 lives in ring slot (n - 1) mod 3: frames 9, 10, 11 overwrote 6, 7, 8
    assert cache.slot_positions == [0, 10, 11, 9]
    assert cache.frames_written == 12
    assert cache.valid.all()
    writer_of_slot = {0: 0, 1: 5, 2: 5, 3: 4}  # chunk that last wrote each slot
    for slot, chunk in writer_of_slot.items():
        tokens = slice(slot * TOKENS, (slot + 1) * TOKENS)
        assert torch.equal(cache.k[:, :, tokens], snapshots[chunk][0][:, :, tokens]), slot
        assert torch.equal(cache.v[:, :, tokens], snapshots[chunk][1][:, :, tokens]), slot
    # the sink still holds frame 0's K/V from the very first chunk, bit for bit, and they
    # differ from what later chunks wrote elsewhere
    assert not torch.equal(cache.k[:, :, :TOKENS], cache.k[:, :, TOKENS : 2 * TOKENS])


@torch.no_grad()
def test_eviction_runs_for_positions_past_the_rope_table() -> None:
    model = make_model()
    cache = make_cache(model, sink=1, window=2)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(CHUNK, seed=4)
    for frame_start in (0, 2, 50_000, 50_002):
        out = model.forward_chunk(x, torch.zeros(1), cross, cache, frame_start, write_cache=True)
        assert torch.isfinite(out).all()
    # write order 6, 7 -> ring slots 2, 1 (write index n goes to 1 + (n - 1) mod 2)
    assert cache.slot_positions == [0, 50_003, 50_002]


@torch.no_grad()
def test_clone_is_an_independent_fork() -> None:
    model = make_model()
    cache = make_cache(model, sink=1, window=4)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(3 * CHUNK, seed=5)
    model.forward_chunk(x[:, :, :CHUNK], torch.zeros(1), cross, cache, 0, write_cache=True)
    fork = cache.clone()
    before = fork.k.clone(), fork.v.clone(), fork.valid.clone()

    step = x[:, :, CHUNK : 2 * CHUNK]
    a = model.forward_chunk(step, torch.zeros(1), cross, cache, CHUNK, write_cache=True)
    # writing into the original left the fork untouched
    assert torch.equal(fork.k, before[0]) and torch.equal(fork.v, before[1])
    assert torch.equal(fork.valid, before[2]) and fork.frames_written == CHUNK
    # the fork continues exactly like the original did, then diverges independently
    b = model.forward_chunk(step, torch.zeros(1), cross, fork, CHUNK, write_cache=True)
    assert torch.equal(a, b)
    assert torch.equal(fork.k, cache.k) and fork.slot_positions == cache.slot_positions
    model.forward_chunk(
        x[:, :, 2 * CHUNK :], torch.zeros(1), cross, fork, 2 * CHUNK, write_cache=True
    )
    assert fork.frames_written == 3 * CHUNK and cache.frames_written == 2 * CHUNK
    assert not torch.equal(fork.valid, cache.valid)


@torch.no_grad()
def test_reset_replays_a_stream_exactly() -> None:
    model = make_model()
    cache = make_cache(model, sink=1, window=2)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(3 * CHUNK, seed=6)

    def rollout() -> list[torch.Tensor]:
        return [
            model.forward_chunk(
                x[:, :, i * CHUNK : (i + 1) * CHUNK],
                torch.zeros(1),
                cross,
                cache,
                i * CHUNK,
                write_cache=True,
            )
            for i in range(3)
        ]

    first = rollout()
    cache.reset()
    assert cache.frames_written == 0 and not cache.valid.any()
    assert cache.slot_positions == [EMPTY, EMPTY, EMPTY]
    assert all(torch.equal(a, b) for a, b in zip(first, rollout(), strict=True))


def test_bytes_for_matches_the_allocation() -> None:
    cfg = WanDiTConfig.preset("tiny")
    for dtype in (torch.float32, torch.bfloat16):
        cache = ChunkKVCache.allocate(
            cfg,
            batch=2,
            sink_frames=1,
            window_frames=5,
            tokens_per_frame=7,
            device="cpu",
            dtype=dtype,
        )
        assert cache.nbytes == ChunkKVCache.bytes_for(cfg, 1, 5, 7, dtype, batch=2)
    # the 1.3B model at 832x480 with 1 sink + 20 window frames in bf16: 2 x 30 x 32760 x 1536 x 2
    big = WanDiTConfig.preset("wan2.1-1.3b")
    assert ChunkKVCache.bytes_for(big, 1, 20, 1560, torch.bfloat16) == 6_038_323_200 + 32_760


def test_write_plan_fills_sinks_then_wraps_the_ring() -> None:
    cache = ChunkKVCache.allocate(
        WanDiTConfig.preset("tiny"),
        batch=1,
        sink_frames=2,
        window_frames=3,
        tokens_per_frame=1,
        device="cpu",
        dtype=torch.float32,
    )
    assert cache.plan_write(4) == (WriteRun(0, 0, 4),)  # sinks 0-1, ring slots 2-3
    cache.commit(cache.plan_write(4), 4, frame_start=0)
    assert cache.plan_write(2) == (WriteRun(0, 4, 1), WriteRun(1, 2, 1))  # wraps around
    # a chunk longer than the window keeps only its last W frames
    # (write index 6, 7, 8 -> ring slots 3, 4, 2)
    assert cache.plan_write(5) == (WriteRun(2, 3, 2), WriteRun(4, 2, 1))


def test_rejects_impossible_geometry_and_mismatched_chunks() -> None:
    model = make_model()
    with pytest.raises(CacheShapeError, match="W=0"):
        make_cache(model, sink=1, window=0)
    cache = make_cache(model, sink=1, window=2)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    with pytest.raises(InputShapeError, match="8 tokens/frame"):
        model.forward_chunk(torch.randn(1, 16, 2, 4, 8), torch.zeros(1), cross, cache, 0)
    with pytest.raises(InputShapeError, match="batch 2"):
        model.forward_chunk(latents(CHUNK, batch=2), torch.zeros(2), cross, cache, 0)


class _HoldsCache(LoopState, kw_only=True):
    kv: ChunkKVCache


@torch.no_grad()
def test_a_cache_in_a_loop_state_snapshots_and_resumes_exactly() -> None:
    model = make_model()
    cache = make_cache(model, sink=1, window=2)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(3 * CHUNK, seed=7)
    for i in range(2):
        model.forward_chunk(
            x[:, :, i * CHUNK : (i + 1) * CHUNK],
            torch.zeros(1),
            cross,
            cache,
            i * CHUNK,
            write_cache=True,
        )
    restored = restore_state(snapshot_state(_HoldsCache(kv=cache)), _HoldsCache).kv
    assert restored.k is not cache.k and restored.slot_positions == cache.slot_positions
    assert restored.frames_written == cache.frames_written == 2 * CHUNK
    last = x[:, :, 2 * CHUNK :]
    a = model.forward_chunk(last, torch.zeros(1), cross, cache, 2 * CHUNK, write_cache=True)
    b = model.forward_chunk(last, torch.zeros(1), cross, restored, 2 * CHUNK, write_cache=True)
    assert torch.equal(a, b) and restored.slot_positions == cache.slot_positions
    with pytest.raises(CacheShapeError, match="2 slot positions"):
        ChunkKVCache(
            k=cache.k,
            v=cache.v,
            valid=cache.valid,
            sink_frames=1,
            window_frames=2,
            tokens_per_frame=TOKENS,
            slot_positions=[0, 1],
            frames_written=2,
        )


def test_mask_is_dropped_once_every_slot_is_filled() -> None:
    cache = ChunkKVCache.allocate(
        WanDiTConfig.preset("tiny"),
        batch=1,
        sink_frames=1,
        window_frames=2,
        tokens_per_frame=2,
        device="cpu",
        dtype=torch.float32,
    )
    mask = cache.attention_mask(4)
    assert mask is not None and mask.shape == (1, 1, 1, 10)
    assert mask[0, 0, 0].tolist() == [False] * 6 + [True] * 4
    cache.commit(cache.plan_write(2), 2, frame_start=0)
    assert (
        not cache.full
        and cache.attention_mask(4)[0, 0, 0].tolist() == [True] * 4 + [False] * 2 + [True] * 4
    )
    cache.commit(cache.plan_write(1), 1, frame_start=2)
    assert cache.full and cache.attention_mask(4) is None
    cache.reset()
    assert not cache.full and cache.attention_mask(4) is not None


def test_a_filled_prefix_is_read_unmasked_and_a_cache_with_holes_falls_back_to_the_mask() -> None:
    cache = ChunkKVCache.allocate(
        WanDiTConfig.preset("tiny"),
        batch=1,
        sink_frames=1,
        window_frames=2,
        tokens_per_frame=2,
        device="cpu",
        dtype=torch.float32,
    )
    assert cache.prefix_frames == 0 and cache.attention_keys(4) == (0, None)
    cache.commit(cache.plan_write(2), 2, frame_start=0)
    assert cache.prefix_frames == 2 and cache.attention_keys(4) == (4, None)
    valid = torch.tensor([True, True, False, False, True, True])
    holes = ChunkKVCache(
        k=cache.k,
        v=cache.v,
        valid=valid,
        sink_frames=1,
        window_frames=2,
        tokens_per_frame=2,
        slot_positions=[0, EMPTY, 1],
        frames_written=2,
    )
    tokens, mask = holes.attention_keys(4)
    assert holes.prefix_frames is None and tokens == 6
    assert mask[0, 0, 0].tolist() == [True] * 2 + [False] * 2 + [True] * 6
    k, v = cache.layer(1, 4)
    assert k.shape[1] == v.shape[1] == 4 and k.data_ptr() == cache.k[1].data_ptr()


def test_prefix_reads_equal_masked_reads_through_a_whole_rollout(monkeypatch) -> None:
    # the unmasked prefix path (what SDPA's fast kernels need) computes what the mask computes
    model = make_model()
    x, text = latents(5 * CHUNK), torch.randn(1, 3, 20)
    with torch.no_grad():
        cross = model.cross_kv(text)

    def rollout() -> list[torch.Tensor]:
        cache, outs = make_cache(model, sink=1, window=3), []
        for start in range(0, 5 * CHUNK, CHUNK):
            chunk = x[:, :, start : start + CHUNK]
            with torch.no_grad():
                outs.append(model.forward_chunk(chunk, torch.tensor([500.0]), cross, cache, start))
                model.forward_chunk(chunk, torch.zeros(1), cross, cache, start, write_cache=True)
        return outs

    prefix = rollout()
    monkeypatch.setattr(ChunkKVCache, "prefix_frames", property(lambda self: None))
    masked = rollout()
    for ours, ref in zip(prefix, masked, strict=True):
        assert rel_err(ours, ref) < TOLERANCE
