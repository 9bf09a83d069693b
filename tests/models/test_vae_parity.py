"""C0 parity: our WanVAE vs diffusers' AutoencoderKLWan (CPU, fp32, random weights).

Each case builds a reference with randomised weights (norm gains and biases too), saves it with
``save_pretrained`` and loads it through ``load_vae``, so the loader is part of what is checked.
Relative error is ``max|ours - ref| / max|ref|``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLWan

from models.checkpoint.load import load_vae
from models.wan.vae.autoencoder import VAEShapeError, WanVAE, video_to_uint8
from models.wan.vae.config import WanVAEConfig


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread():
    """These tensors are tiny: OpenMP fork/join costs more than it saves (and far more when the
    2 CI cores are shared), so this module runs single-threaded and restores the setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


TOLERANCE = 1e-4

# (config, video to encode [B, 3, F, H, W], latents to decode [B, z, f, h, w])
CASES = {
    # Wan2.1 layout (4 stages, 2 res blocks, 4x temporal, 8x spatial) at an odd latent grid 5x7
    "wan21-layout": (
        WanVAEConfig(z_dim=4, base_dim=8, latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4),
        (1, 3, 9, 40, 56),
        (1, 4, 4, 5, 7),
    ),
    # 3 stages, 1 res block, temporal downsampling in the first stage only (2x), batch 2,
    # pixel sizes that are not multiples of the 4x spatial factor (36x44 -> 9x11)
    "three-stage": (
        WanVAEConfig(
            base_dim=12, dim_mult=(1, 2, 2), num_res_blocks=1, temperal_downsample=(True, False)
        ),
        (2, 3, 5, 36, 44),
        (2, 16, 3, 3, 5),
    ),
    # the tiny preset of the random-weight card
    "tiny-preset": (WanVAEConfig.preset("tiny"), (1, 3, 5, 24, 16), (1, 16, 3, 3, 2)),
}


def make_reference(config: WanVAEConfig, seed: int) -> AutoencoderKLWan:
    """An AutoencoderKLWan with every parameter random (gains near 1, biases non-zero)."""
    torch.manual_seed(seed)
    ref = AutoencoderKLWan(**config.to_diffusers_config()).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return ref


def load_ours(ref: AutoencoderKLWan, tmp_path: Path) -> WanVAE:
    ref.save_pretrained(tmp_path / "vae")
    return load_vae(tmp_path / "vae")


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path):
    config, video_shape, latent_shape = CASES[request.param]
    ref = make_reference(config, seed=len(request.param))
    return config, ref, load_ours(ref, tmp_path), video_shape, latent_shape


@torch.no_grad()
def test_encode_mode_matches_diffusers(case) -> None:
    config, ref, ours, video_shape, _ = case
    x = torch.rand(video_shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    expected = ref.encode(x).latent_dist.mode()
    got = ours.encode(x)
    b, _, f, h, w = video_shape
    s = config.spatial_factor
    latent = (b, config.z_dim, 1 + (f - 1) // config.temporal_factor, h // s, w // s)
    assert got.shape == expected.shape == latent
    assert rel_err(got, expected) <= TOLERANCE


@torch.no_grad()
def test_encode_sample_matches_diffusers_with_same_generator(case) -> None:
    _, ref, ours, video_shape, _ = case
    x = torch.rand(video_shape, generator=torch.Generator().manual_seed(2)) * 2 - 1
    expected = ref.encode(x).latent_dist.sample(generator=torch.Generator().manual_seed(7))
    got = ours.encode_sample(x, generator=torch.Generator().manual_seed(7))
    assert rel_err(got, expected) <= TOLERANCE
    assert rel_err(got, ours.encode(x)) > 1e-3  # it is a sample, not the mode


@torch.no_grad()
def test_decode_matches_diffusers(case) -> None:
    config, ref, ours, _, latent_shape = case
    z = torch.randn(latent_shape, generator=torch.Generator().manual_seed(3))
    expected = ref.decode(z).sample
    got = ours.decode(z)
    b, _, f, h, w = latent_shape
    s = config.spatial_factor
    assert got.shape == expected.shape == (b, 3, config.num_pixel_frames(f), h * s, w * s)
    # the comparison is meaningful only if the clamp to [-1, 1] did not flatten the output
    assert (expected.abs() < 0.999).float().mean().item() > 0.5
    assert rel_err(got, expected) <= TOLERANCE


@torch.no_grad()
def test_encode_rejects_frame_counts_the_vae_cannot_group() -> None:
    vae = WanVAE(WanVAEConfig.preset("tiny"))
    with pytest.raises(VAEShapeError, match="F = 1 \\+ 4k frames, got F = 6"):
        vae.encode(torch.zeros(1, 3, 6, 16, 16))
    with pytest.raises(VAEShapeError, match=r"\[B, 3, F, H, W\], got \(1, 4, 5, 16, 16\)"):
        vae.encode(torch.zeros(1, 4, 5, 16, 16))
    with pytest.raises(VAEShapeError, match=r"\[B, 16, f >= 1, h, w\], got \(1, 8, 2, 2, 2\)"):
        vae.decode(torch.zeros(1, 8, 2, 2, 2))


def test_normalize_is_the_wan_pipeline_latent_transform() -> None:
    config = WanVAEConfig.preset("tiny")
    assert config.latents_mean == WanVAEConfig.preset("wan2.1").latents_mean
    vae = WanVAE(config)
    z = torch.randn(2, 16, 3, 4, 5, dtype=torch.float64)
    mean = torch.tensor(config.latents_mean, dtype=torch.float64).view(1, 16, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(config.latents_std, dtype=torch.float64).view(1, 16, 1, 1, 1)
    # diffusers' WanPipeline: latents / (1 / std) + mean before vae.decode
    torch.testing.assert_close(vae.denormalize(z), z / inv_std + mean)
    torch.testing.assert_close(vae.normalize(vae.denormalize(z)), z)
    torch.testing.assert_close(vae.normalize(z), (z - mean) * inv_std)


def test_video_to_uint8_maps_range_and_layout() -> None:
    video = torch.zeros(3, 2, 2, 3)  # [3, n, H, W]
    video[0, 0, 0, 0] = -1.0
    video[1, 0, 0, 0] = 1.0
    video[2, 0, 0, 0] = 5.0  # clamped
    video[0, 1, 1, 2] = -3.0  # clamped
    video[1, 1, 1, 2] = 0.5
    out = video_to_uint8(video)
    assert out.dtype == torch.uint8 and out.shape == (2, 2, 3, 3)  # [n, H, W, 3]
    assert out[0, 0, 0].tolist() == [0, 255, 255]
    assert out[1, 1, 2].tolist() == [0, 191, 128]  # 1.5 * 127.5 = 191.25; 127.5 rounds to even
    assert out[0, 1, 1].tolist() == [128, 128, 128]
    with pytest.raises(VAEShapeError, match=r"\[3, n, H, W\]"):
        video_to_uint8(torch.zeros(1, 3, 2, 2, 2))
