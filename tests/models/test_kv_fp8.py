"""The FP8 chunk-KV cache: e4m3 K/V with per-head descales - writes, reads, slabs, snapshots, and
a rollout over it against the same rollout over a full-precision cache."""

from __future__ import annotations

import pytest
import torch

from models.wan.kv.cache import CacheShapeError, ChunkKVCache
from models.wan.kv.fp8 import E4M3_MAX, HEADROOM, Fp8Past, dequantize
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry
from runtime.contract import LoopState
from runtime.snapshot import restore_state, snapshot_state
from tests.models.test_kv_cache import CHUNK, TOKENS, latents, make_model

E4M3 = torch.float8_e4m3fn


class _HoldsCache(LoopState):
    kv: ChunkKVCache


def make_fp8_cache(model, sink: int = 1, window: int = 3, batch: int = 1) -> ChunkKVCache:
    return ChunkKVCache.allocate(
        model.config,
        batch=batch,
        sink_frames=sink,
        window_frames=window,
        tokens_per_frame=TOKENS,
        device="cpu",
        dtype=E4M3,
    )


def chunk_kv(model, frames: int, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shape = (1, frames * TOKENS, model.config.num_heads, model.config.head_dim)
    return tuple(torch.randn(shape, generator=gen) * scale for _ in range(2))


def rel_l2(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).norm() / ref.float().norm()).item()


@torch.no_grad()
def test_writes_quantise_with_a_scale_the_first_chunk_fixes() -> None:
    model = make_model()
    cache = make_fp8_cache(model)
    assert cache.fp8 and cache.k.dtype == E4M3
    assert cache.k_descale is not None and cache.v_descale is not None
    assert cache.k_descale.shape == (model.config.num_layers, 1, model.config.num_heads)
    assert not cache.k_descale.any()  # unset until the first write
    k, v = chunk_kv(model, CHUNK, seed=0)
    runs = cache.plan_write(CHUNK)
    for layer in range(cache.num_layers):
        cache.write(layer, k, v, runs)
    cache.commit(runs, CHUNK, 0)
    amax = k.abs().amax(dim=(1, 3))  # [1, H]
    assert torch.allclose(cache.k_descale[0], amax * HEADROOM / E4M3_MAX)
    past = cache.layer_past(1, CHUNK * TOKENS)
    assert isinstance(past, Fp8Past) and past.k.dtype == E4M3
    back_k = dequantize(past.k, past.k_descale, torch.float32)
    back_v = dequantize(past.v, past.v_descale, torch.float32)
    # e4m3 keeps 3 mantissa bits: ~2-4 % relative error per value
    assert rel_l2(back_k, k) < 0.05 and rel_l2(back_v, v) < 0.05
    # a later, larger chunk keeps the first scale and saturates past its headroom
    before = cache.k_descale.clone()
    big_k, big_v = chunk_kv(model, CHUNK, seed=1, scale=10 * HEADROOM)
    runs = cache.plan_write(CHUNK)
    for layer in range(cache.num_layers):
        cache.write(layer, big_k, big_v, runs)
    cache.commit(runs, CHUNK, CHUNK)
    assert torch.equal(cache.k_descale, before)
    stored = cache.k[0, :, CHUNK * TOKENS : 2 * CHUNK * TOKENS].float()
    assert stored.abs().max().item() == E4M3_MAX and not stored.isnan().any()
    cache.reset()
    assert not cache.k_descale.any() and not cache.k.float().any()


@torch.no_grad()
def test_a_rollout_over_an_fp8_cache_tracks_the_full_precision_one() -> None:
    model = make_model()
    ref = ChunkKVCache.allocate(
        model.config,
        batch=1,
        sink_frames=1,
        window_frames=3,
        tokens_per_frame=TOKENS,
        device="cpu",
        dtype=torch.float32,
    )
    ours = make_fp8_cache(model)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(5 * CHUNK, seed=3)
    errors = []
    for i in range(5):  # through the ring's wrap
        part = x[:, :, i * CHUNK : (i + 1) * CHUNK]
        a = model.forward_chunk(part, torch.zeros(1), cross, ref, i * CHUNK, write_cache=True)
        b = model.forward_chunk(part, torch.zeros(1), cross, ours, i * CHUNK, write_cache=True)
        errors.append(rel_l2(b, a))
    assert ours.slot_positions == ref.slot_positions
    assert 0 < max(errors) < 0.05, errors  # lossy, and close


@torch.no_grad()
def test_an_fp8_cache_snapshots_bit_exactly() -> None:
    model = make_model()
    cache = make_fp8_cache(model)
    cross = model.cross_kv(torch.randn(1, 4, 20))
    x = latents(3 * CHUNK, seed=5)
    for i in range(2):
        part = x[:, :, i * CHUNK : (i + 1) * CHUNK]
        model.forward_chunk(part, torch.zeros(1), cross, cache, i * CHUNK, write_cache=True)
    restored = restore_state(snapshot_state(_HoldsCache(kv=cache)), _HoldsCache).kv
    assert restored.k.dtype == E4M3 and restored.k_descale is not None
    assert torch.equal(restored.k.view(torch.uint8), cache.k.view(torch.uint8))
    assert torch.equal(restored.v.view(torch.uint8), cache.v.view(torch.uint8))
    assert torch.equal(restored.k_descale, cache.k_descale)
    assert torch.equal(restored.v_descale, cache.v_descale)
    last = x[:, :, 2 * CHUNK :]
    a = model.forward_chunk(last, torch.zeros(1), cross, cache, 2 * CHUNK, write_cache=True)
    b = model.forward_chunk(last, torch.zeros(1), cross, restored, 2 * CHUNK, write_cache=True)
    assert torch.equal(a, b)


def test_slabs_in_e4m3_carry_their_descales_and_take_half_the_bytes() -> None:
    model = make_model()
    geometry = SlabGeometry(1, 3, TOKENS)
    bf16 = KVSlabBuffer(model.config, geometry, num_slabs=2, device="cpu", dtype=torch.bfloat16)
    fp8 = KVSlabBuffer(model.config, geometry, num_slabs=2, device="cpu", dtype=E4M3)
    assert fp8.k.nbytes * 2 == bf16.k.nbytes
    assert fp8.slab_bytes < bf16.slab_bytes
    assert fp8.slab_bytes == ChunkKVCache.bytes_for(model.config, 1, 3, TOKENS, E4M3)
    assert sorted(fp8.tensors()) == sorted(
        f"kv:{geometry.key}:{n}" for n in ("k", "v", "k_descale", "v_descale")
    )
    first = fp8.cache(0)
    k, v = chunk_kv(model, CHUNK, seed=2)
    runs = first.plan_write(CHUNK)
    for layer in range(first.num_layers):
        first.write(layer, k, v, runs)
    first.commit(runs, CHUNK, 0)
    assert fp8.k_descale is not None and fp8.k_descale[:, 0].all()  # written through the view
    assert not fp8.k_descale[:, 1].any()
    fp8.copy_slab(0, 1)
    assert torch.equal(fp8.k_descale[:, 1], fp8.k_descale[:, 0])
    assert torch.equal(fp8.k[:, 1].view(torch.uint8), fp8.k[:, 0].view(torch.uint8))
    forked = fp8.view(1)
    forked.copy_from(first)
    assert forked.layer_past(0, CHUNK * TOKENS).k_descale.data_ptr() == (
        fp8.k_descale[0, 1:2].data_ptr()
    )


def test_descales_must_match_the_storage() -> None:
    model = make_model()
    cache = make_fp8_cache(model)
    with pytest.raises(CacheShapeError, match="e4m3 cache needs k_descale"):
        ChunkKVCache(
            k=cache.k,
            v=cache.v,
            valid=cache.valid,
            sink_frames=1,
            window_frames=3,
            tokens_per_frame=TOKENS,
        )
    bf16 = make_model()
    plain = ChunkKVCache.allocate(
        bf16.config,
        batch=1,
        sink_frames=1,
        window_frames=3,
        tokens_per_frame=TOKENS,
        device="cpu",
        dtype=torch.float32,
    )
    with pytest.raises(CacheShapeError, match="cannot copy"):
        plain.copy_from(cache)


@torch.no_grad()
def test_batched_chunks_over_fp8_caches_match_each_alone() -> None:
    model = make_model()
    caches = [make_fp8_cache(model) for _ in range(2)]
    cross = model.cross_kv(torch.randn(1, 4, 20))
    xs = [latents(2 * CHUNK, seed=s) for s in (11, 12)]
    for cache, x in zip(caches, xs, strict=True):
        model.forward_chunk(x[:, :, :CHUNK], torch.zeros(1), cross, cache, 0, write_cache=True)
    last = [x[:, :, CHUNK:] for x in xs]
    alone = [
        model.forward_chunk(part, torch.full((1,), 500.0), cross, cache, CHUNK)
        for part, cache in zip(last, caches, strict=True)
    ]
    both = type(cross)(k=cross.k.expand(-1, 2, -1, -1, -1), v=cross.v.expand(-1, 2, -1, -1, -1))
    batched = model.forward_chunks(
        torch.cat(last), torch.full((2,), 500.0), both, caches, (CHUNK, CHUNK)
    )
    for i in range(2):
        assert rel_l2(batched[i : i + 1], alone[i]) < 1e-5


def test_an_instance_serves_its_slabs_in_e4m3_when_asked() -> None:
    from models.instance import InstanceError, load_instance
    from models.registry import get

    instance = load_instance(get("wan-tiny-random"), device="cpu")
    with pytest.raises(InstanceError, match="kv_cache 'int4' is not one of"):
        instance.configure(kv_cache="int4")
    instance.configure(kv_cache="fp8")
    assert instance.levers["kv_cache"] == "fp8" and instance.kv_dtype == E4M3
    profile = instance.card.default_profile
    buffer = instance.reserve_kv_slabs(profile, 2)
    assert buffer.k.dtype == E4M3 and buffer.k_descale is not None
    assert instance.kv_cache(instance.slab_geometry(profile), None).fp8
    with pytest.raises(InstanceError, match="before K/V slabs are reserved"):
        instance.configure(kv_cache="model")


@pytest.mark.gpu
@torch.no_grad()
def test_fa3s_fp8_kernel_reads_the_cache_as_the_dequantised_reference_does() -> None:
    from models.wan.kernels.attention import attend
    from models.wan.kv.fp8 import cached_attention, fa3_fp8_unsupported, quantize_with

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, p, n, h, d = 2, 3120, 1560, 12, 128

    def rand(*shape):
        return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16)

    q, k, v = rand(b, n, h, d), rand(b, n, h, d), rand(b, n, h, d)
    pk, pv = rand(b, p, h, d), rand(b, p, h, d)
    kd = (pk.float().abs().amax(dim=(1, 3)) * 4 / E4M3_MAX).contiguous()
    vd = (pv.float().abs().amax(dim=(1, 3)) * 4 / E4M3_MAX).contiguous()
    past = Fp8Past(quantize_with(pk, kd), quantize_with(pv, vd), kd, vd)
    reason = fa3_fp8_unsupported(q, None)
    if reason is not None:
        pytest.skip(reason)
    ours = cached_attention(q, k, v, past, None).float()
    full_k = torch.cat((dequantize(past.k, kd, torch.float32), k.float()), dim=1)
    full_v = torch.cat((dequantize(past.v, vd, torch.float32), v.float()), dim=1)
    ref = attend(q.float(), full_k, full_v)
    exact = attend(q.float(), torch.cat((pk, k), 1).float(), torch.cat((pv, v), 1).float())
    assert rel_l2(ours, ref) < 0.05  # Q's quantisation and the kernel's FP8 P V
    assert rel_l2(ours, exact) < 0.08  # all of it, against bf16 K/V
