"""Streaming decode: decode_chunk over any chunking == decode of all latents; the DecoderCache is
per stream (interleaved streams, forks, resets, snapshots) and static (written in place)."""

from __future__ import annotations

import pytest
import torch

from models.wan.vae.autoencoder import VAEShapeError, WanVAE
from models.wan.vae.cache import CacheMismatchError, DecoderCache
from models.wan.vae.config import WanVAEConfig
from runtime.contract import LoopState
from runtime.snapshot import restore_state, snapshot_state


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread():
    """These tensors are tiny: OpenMP fork/join costs more than it saves (and far more when the
    2 CI cores are shared), so this module runs single-threaded and restores the setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


TOLERANCE = 1e-5
LATENT_HW = (2, 3)
STREAM_CONFIG = WanVAEConfig.preset("tiny")  # what the random-weight card streams with


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def make_vae(config: WanVAEConfig | None = None, seed: int = 0) -> WanVAE:
    torch.manual_seed(seed)
    vae = WanVAE(config or STREAM_CONFIG).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return vae


def latents(num_frames: int, seed: int, batch: int = 1, z_dim: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, z_dim, num_frames, *LATENT_HW, generator=g)


def decode_stream(vae: WanVAE, z: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    cache = vae.new_decoder_cache(z.shape[0], *LATENT_HW)
    out, start = [], 0
    for size in sizes:
        out.append(vae.decode_chunk(z[:, :, start : start + size], cache))
        start += size
    assert cache.frames_seen == z.shape[2] == start
    return out


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    return make_vae()


@pytest.mark.parametrize(
    "sizes",
    [[1] * 5, [1, 3, 3], [3, 3, 1], [2, 3], [5]],
    ids=lambda s: "-".join(map(str, s)),
)
@torch.no_grad()
def test_chunked_decode_equals_full_decode(vae: WanVAE, sizes: list[int]) -> None:
    z = latents(sum(sizes), seed=1)
    full = vae.decode(z)
    chunks = decode_stream(vae, z, sizes)
    # the first chunk of c latents yields 1 + 4(c - 1) frames, every later one 4c
    assert [c.shape[2] for c in chunks] == [1 + 4 * (sizes[0] - 1)] + [4 * s for s in sizes[1:]]
    assert full.shape == (1, 3, 1 + 4 * (sum(sizes) - 1), 16, 24)
    assert rel_err(torch.cat(chunks, dim=2), full) <= TOLERANCE


@torch.no_grad()
def test_chunked_decode_equals_diffusers_full_decode() -> None:
    from diffusers import AutoencoderKLWan  # here, so the rest of the file runs where it is absent

    config = WanVAEConfig(z_dim=4, base_dim=4, num_res_blocks=1,
                          latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4)  # fmt: skip
    ours = make_vae(config, seed=3)
    ref = AutoencoderKLWan(**config.to_diffusers_config()).eval()
    diffusers_names = {  # ours -> diffusers (the two renames of the key table)
        ".upsampler.spatial_conv.": ".upsamplers.0.resample.1.",
        ".upsampler.time_conv.": ".upsamplers.0.time_conv.",
        ".spatial_conv.": ".resample.1.",
    }
    state = {}
    for name, tensor in ours.state_dict().items():
        for mine, theirs in diffusers_names.items():
            name = name.replace(mine, theirs)
        state[name] = tensor
    ref.load_state_dict(state, strict=True)
    z = latents(7, seed=4, z_dim=4)
    expected = ref.decode(z).sample
    assert rel_err(torch.cat(decode_stream(ours, z, [1, 3, 3]), dim=2), expected) <= 1e-4


@torch.no_grad()
def test_interleaved_streams_with_two_caches_equal_each_alone(vae: WanVAE) -> None:
    za, zb = latents(7, seed=5), latents(7, seed=6)
    alone_a = decode_stream(vae, za, [1, 3, 3])
    alone_b = decode_stream(vae, zb, [3, 3, 1])
    cache_a, cache_b = vae.new_decoder_cache(1, *LATENT_HW), vae.new_decoder_cache(1, *LATENT_HW)
    a_bounds, b_bounds = [(0, 1), (1, 4), (4, 7)], [(0, 3), (3, 6), (6, 7)]
    inter_a, inter_b = [], []
    for (a0, a1), (b0, b1) in zip(a_bounds, b_bounds, strict=True):
        inter_b.append(vae.decode_chunk(zb[:, :, b0:b1], cache_b))
        inter_a.append(vae.decode_chunk(za[:, :, a0:a1], cache_a))
    for got, expected in zip(inter_a + inter_b, alone_a + alone_b, strict=True):
        assert torch.equal(got, expected)


@torch.no_grad()
def test_batched_stream_equals_streams_decoded_one_by_one(vae: WanVAE) -> None:
    z = torch.cat([latents(4, seed=7), latents(4, seed=8)])
    batched = torch.cat(decode_stream(vae, z, [1, 3]), dim=2)
    single = [torch.cat(decode_stream(vae, z[i : i + 1], [1, 3]), dim=2) for i in range(2)]
    assert rel_err(batched, torch.cat(single)) <= TOLERANCE


@torch.no_grad()
def test_clone_forks_an_independent_stream(vae: WanVAE) -> None:
    z = latents(7, seed=9)
    uninterrupted = decode_stream(vae, z, [1, 3, 3])
    other = latents(3, seed=10)

    cache = vae.new_decoder_cache(1, *LATENT_HW)
    first = vae.decode_chunk(z[:, :, :1], cache)
    fork = cache.clone()
    assert fork.frames_seen == cache.frames_seen == 1
    pairs = zip(fork.buffers, cache.buffers, strict=True)
    assert all(f.data_ptr() != c.data_ptr() for f, c in pairs)
    branch = vae.decode_chunk(other, fork)  # the fork goes elsewhere ...
    rest = [vae.decode_chunk(z[:, :, 1:4], cache), vae.decode_chunk(z[:, :, 4:7], cache)]
    # ... and the original stream is untouched
    for got, expected in zip([first, *rest], uninterrupted, strict=True):
        assert torch.equal(got, expected)
    assert not torch.equal(branch, rest[0])


@torch.no_grad()
def test_cache_is_static_and_written_in_place(vae: WanVAE) -> None:
    cache = vae.new_decoder_cache(1, *LATENT_HW)
    pointers = [b.data_ptr() for b in cache.buffers]
    shapes = [b.shape for b in cache.buffers]
    assert all(int(b.count_nonzero()) == 0 for b in cache.buffers)
    z = latents(7, seed=11)
    for start, stop in [(0, 1), (1, 4), (4, 7)]:
        vae.decode_chunk(z[:, :, start:stop], cache)
        assert [b.data_ptr() for b in cache.buffers] == pointers
        assert [b.shape for b in cache.buffers] == shapes
    assert all(int(b.count_nonzero()) > 0 for b in cache.buffers)
    assert cache.nbytes == sum(b.numel() * 4 for b in cache.buffers)
    assert cache.nbytes == vae.decoder_cache_bytes(1, *LATENT_HW, torch.float32)
    assert vae.decoder_cache_bytes(2, *LATENT_HW, torch.bfloat16) == cache.nbytes


@torch.no_grad()
def test_reset_and_copy_restart_and_fork_in_place(vae: WanVAE) -> None:
    z = latents(4, seed=12)
    expected = decode_stream(vae, z, [1, 3])
    cache = vae.new_decoder_cache(1, *LATENT_HW)
    vae.decode_chunk(latents(2, seed=13), cache)
    cache.reset()
    assert cache.frames_seen == 0
    assert torch.equal(vae.decode_chunk(z[:, :, :1], cache), expected[0])
    pooled = vae.new_decoder_cache(1, *LATENT_HW)
    vae.decode_chunk(latents(3, seed=14), pooled)  # stale contents, overwritten by copy_
    pooled.copy_(cache)
    assert torch.equal(vae.decode_chunk(z[:, :, 1:4], pooled), expected[1])


class _HoldsDecoder(LoopState, kw_only=True):
    decoder: DecoderCache


@torch.no_grad()
def test_a_loop_state_snapshot_restores_a_stream(vae: WanVAE) -> None:
    z = latents(7, seed=15)
    expected = decode_stream(vae, z, [1, 3, 3])
    cache = vae.new_decoder_cache(1, *LATENT_HW)
    vae.decode_chunk(z[:, :, :1], cache)
    vae.decode_chunk(z[:, :, 1:4], cache)
    blob = snapshot_state(_HoldsDecoder(decoder=cache))  # the cache is loop state as it is
    vae.decode_chunk(latents(3, seed=16), cache)  # the live cache moves on
    restored = restore_state(blob, _HoldsDecoder).decoder
    assert isinstance(restored, DecoderCache) and restored.frames_seen == 4
    assert restored.grid_hw == LATENT_HW
    assert torch.equal(vae.decode_chunk(z[:, :, 4:7], restored), expected[2])


@torch.no_grad()
def test_mismatched_cache_or_latents_raise(vae: WanVAE) -> None:
    cache = vae.new_decoder_cache(1, *LATENT_HW)
    with pytest.raises(CacheMismatchError, match=r"batch 1 at grid \(2, 3\), used with batch 1 "
                       r"at grid \(4, 3\)"):  # fmt: skip
        vae.decode_chunk(torch.zeros(1, 16, 1, 4, 3), cache)
    with pytest.raises(CacheMismatchError, match="used with batch 2"):
        vae.decode_chunk(torch.zeros(2, 16, 1, *LATENT_HW), cache)
    other = make_vae(STREAM_CONFIG.with_(num_res_blocks=2))
    with pytest.raises(CacheMismatchError, match="laid out for another coder"):
        other.decode_chunk(torch.zeros(1, 16, 1, *LATENT_HW), cache)
    with pytest.raises(VAEShapeError, match="f >= 1"):
        vae.decode_chunk(torch.zeros(1, 16, 0, *LATENT_HW), cache)
    assert cache.frames_seen == 0 and all(int(b.count_nonzero()) == 0 for b in cache.buffers)


def test_wan21_decoder_cache_size_at_832x480() -> None:
    # what admission budgets per realtime session (bf16, 104 x 60 latent grid)
    with torch.device("meta"):
        vae = WanVAE(WanVAEConfig.preset("wan2.1"))
    size_bytes = vae.decoder_cache_bytes(1, 60, 104, torch.bfloat16)
    assert 1.7 * 2**30 < size_bytes < 1.8 * 2**30
    assert len(vae.decoder.slot_specs) == 32


@pytest.fixture
def exact_fp32_convs():
    """cuDNN runs fp32 convs in TF32 by default; chunk shapes then round differently (~2e-3)."""
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = previous


@pytest.mark.gpu
@torch.no_grad()
def test_chunked_decode_equals_full_decode_on_cuda(exact_fp32_convs: None) -> None:
    z = latents(7, seed=17).to("cuda")
    vae = make_vae().to("cuda")
    full = vae.decode(z)
    assert rel_err(torch.cat(decode_stream(vae, z, [1, 3, 3]), dim=2), full) <= 1e-5
    vae_bf16 = make_vae().to("cuda", torch.bfloat16)
    full_bf16 = vae_bf16.decode(z.bfloat16())
    chunked_bf16 = torch.cat(decode_stream(vae_bf16, z.bfloat16(), [1, 3, 3]), dim=2)
    assert chunked_bf16.dtype == torch.bfloat16
    assert rel_err(chunked_bf16.float(), full_bf16.float()) <= 2e-2
    assert rel_err(chunked_bf16.float(), full) <= 5e-2


@pytest.mark.parametrize("frames_seen", [0, 3])
def test_the_decoder_traces_as_one_graph_and_leaves_the_count_to_its_caller(frames_seen) -> None:
    """What ``--compile`` compiles (``vae.decoder``) has no graph break at a stream's first chunk
    or a later one: advancing ``frames_seen`` inside it (a store into a ``msgspec.Struct``) broke
    its graph in two, and Dynamo traced every shape twice (a restart warm-up from the compile
    cache spent 15 s of its 23 s in Dynamo's tracing). ``decode_chunk`` advances it instead."""
    vae = make_vae()
    z = latents(3, seed=5)
    cache = vae.new_decoder_cache(1, *LATENT_HW)
    cache.frames_seen = frames_seen
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(vae.decoder)(vae.post_quant_conv(z), cache)
    finally:
        torch._dynamo.reset()
    # (``graph_break_count`` stays 0 for a break before the last statement: read the reasons)
    assert explained.break_reasons == [] and explained.graph_count == 1, explained.break_reasons
    assert cache.frames_seen == frames_seen  # the decoder reads the count, never writes it
    vae.decode_chunk(z, cache)
    assert cache.frames_seen == frames_seen + 3
