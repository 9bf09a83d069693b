"""The Wan2.1 video VAE, numerically equivalent to diffusers' ``AutoencoderKLWan``, with a
streaming decoder whose causal feature cache is an explicit per-session object.

    vae = WanVAE(WanVAEConfig.preset("wan2.1"))    # or models.checkpoint.load.load_vae(path)
    mean = vae.encode(video)       # = AutoencoderKLWan.encode(x).latent_dist.mode()
    video = vae.decode(mean)       # = AutoencoderKLWan.decode(z).sample

    cache = vae.new_decoder_cache(1, h, w)               # once per session: static buffers
    for z_chunk in stream:                               # e.g. 3 latent frames per chunk
        frames = vae.decode_chunk(z_chunk, cache)        # same frames as decode(all latents)
        rgb = video_to_uint8(frames[0])                  # [n, H, W, 3] uint8

Latents here are *unnormalised* (what diffusers' encode/decode take and return);
``normalize``/``denormalize`` convert to and from the DiT's latent space.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import cast

import torch
from torch import nn

from models.wan.vae.blocks import AttentionBlock, MidBlock, ResidualBlock, UpBlock
from models.wan.vae.cache import DecoderCache, EncoderCache
from models.wan.vae.coders import Decoder, Encoder
from models.wan.vae.config import WanVAEConfig

__all__ = ["VAEShapeError", "WanVAE", "conv_flops", "video_to_uint8"]


class VAEShapeError(ValueError):
    """An input whose shape the VAE cannot process; the message names expected and got."""


class WanVAE(nn.Module):
    """Wan2.1 causal video VAE (z 16, 4x temporal, 8x spatial compression).

    Holds weights only. Encoding allocates a transient encoder cache per call; streaming decode
    takes a caller-owned ``DecoderCache`` (one per session). Inputs are ``[B, C, T, H, W]``; pixel
    values are in ``[-1, 1]``. Shape errors raise ``VAEShapeError``; a cache that does not fit
    raises ``CacheMismatchError``. Outputs follow the weights' dtype and device.
    """

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quant_conv = nn.Conv3d(2 * config.z_dim, 2 * config.z_dim, 1)
        self.post_quant_conv = nn.Conv3d(config.z_dim, config.z_dim, 1)
        self.decoder = Decoder(config)

    # ---------------------------------------------------------------------------------------
    # encode

    def encode_moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and clamped log-variance, each ``[B, z_dim, f, H / 8, W / 8]``.

        ``x``: ``[B, in_channels, F, H, W]`` with ``F = 1 + 4k``. The clip is encoded as the first
        frame, then groups of 4 frames (bounded memory, the same grouping as diffusers).
        """
        cfg = self.config
        if x.ndim != 5 or x.shape[1] != cfg.in_channels:
            raise VAEShapeError(
                f"encode expects [B, {cfg.in_channels}, F, H, W], got {tuple(x.shape)}"
            )
        frames, step = x.shape[2], cfg.temporal_factor
        if frames < 1 or (frames - 1) % step:
            raise VAEShapeError(f"encode needs F = 1 + {step}k frames, got F = {frames}")
        weight = self.quant_conv.weight
        cache = EncoderCache.allocate(
            self.encoder.slot_specs,
            self.encoder.level_hw(x.shape[3], x.shape[4]),
            x.shape[0],
            device=weight.device,
            dtype=weight.dtype,
        )
        bounds = [0, 1, *range(1 + step, frames + 1, step)]
        chunks = []
        for a, b in pairwise(bounds):
            chunks.append(self.encoder(x[:, :, a:b], cache))
            cache.frames_seen += b - a  # the coders read it, their caller advances it
        moments = self.quant_conv(torch.cat(chunks, dim=2))  # [B, 2 z_dim, f, h, w]
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The posterior mode (= mean): ``[B, z_dim, f, H / 8, W / 8]``, unnormalised."""
        # x: [B, 3, F, H, W] -> [B, z_dim, f, h, w]
        return self.encode_moments(x)[0]

    def encode_sample(
        self, x: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A posterior sample ``mean + std * eps``; ``eps`` is drawn on the generator's device
        (CPU generators draw on the CPU), matching diffusers' ``latent_dist.sample(generator)``.
        """
        # x: [B, 3, F, H, W] -> [B, z_dim, f, h, w]
        mean, logvar = self.encode_moments(x)
        draw_device = generator.device if generator is not None else mean.device
        eps = torch.randn(mean.shape, generator=generator, device=draw_device, dtype=mean.dtype)
        return mean + torch.exp(0.5 * logvar) * eps.to(mean.device)

    # ---------------------------------------------------------------------------------------
    # decode

    def new_decoder_cache(
        self,
        batch_size: int,
        latent_height: int,
        latent_width: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DecoderCache:
        """A zeroed per-session decoder cache (defaults: the weights' device and dtype)."""
        weight = self.post_quant_conv.weight
        device = weight.device if device is None else device
        grid = (latent_height, latent_width)
        dtype = weight.dtype if dtype is None else dtype
        return DecoderCache.for_coder(self.decoder, batch_size, grid, device=device, dtype=dtype)

    def decoder_cache_bytes(
        self, batch_size: int, latent_height: int, latent_width: int, dtype: torch.dtype
    ) -> int:
        """Bytes ``new_decoder_cache`` would allocate (for admission), without allocating."""
        grid = (latent_height, latent_width)
        return DecoderCache.bytes_for_coder(self.decoder, batch_size, grid, dtype)

    def decode_chunk(self, z: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """Decode the next ``c`` latent frames of a stream, clamped to ``[-1, 1]``.

        Returns ``1 + 4 (c - 1)`` frames for the stream's first chunk and ``4c`` afterwards;
        concatenated over a stream they equal ``decode`` of all its latents. Rewrites ``cache``
        in place and advances ``cache.frames_seen`` by ``c``.
        """
        # z: [B, z_dim, c, h, w] -> [B, 3, n, 8h, 8w]
        cfg = self.config
        if z.ndim != 5 or z.shape[1] != cfg.z_dim or z.shape[2] < 1:
            raise VAEShapeError(
                f"decode expects [B, {cfg.z_dim}, f >= 1, h, w], got {tuple(z.shape)}"
            )
        cache.check_compatible(self.decoder.slot_specs, (z.shape[3], z.shape[4]), z.shape[0])
        frames = self.decoder(self.post_quant_conv(z), cache).clamp(-1.0, 1.0)
        # outside the (compiled) decoder: storing into the cache would break its graph
        cache.frames_seen += z.shape[2]
        return frames

    def decode_flops(
        self, latent_frames: int, latent_height: int, latent_width: int, *, first: bool = False
    ) -> float:
        """Multiply-add FLOPs (2 per MAC) of ``decode_chunk`` of ``latent_frames`` frames on a
        ``latent_height x latent_width`` grid: every convolution (causal history included in
        its taps, as the cache makes it) and the mid-block's per-frame attention; norms and
        activations are left out (memory-bound, a few % of the time). ``first``: the stream's
        first chunk (its first latent frame is not doubled in time). For the cost prior."""
        h, w = latent_height, latent_width
        frames = float(latent_frames)
        dec = self.decoder
        total = conv_flops(dec.conv_in, frames, h, w) + conv_flops(
            self.post_quant_conv, frames, h, w
        )
        total += _mid_flops(dec.mid_block, frames, h, w)
        for block in cast("Iterable[UpBlock]", dec.up_blocks):
            total += sum(_residual_flops(r, frames, h, w) for r in _residuals(block.resnets))
            up = block.upsampler
            if up is None:
                continue
            if up.time_conv is not None:  # a first chunk's first frame is not doubled
                total += conv_flops(up.time_conv, frames - first, h, w)
                frames = 2 * frames - first
            h, w = 2 * h, 2 * w
            total += conv_flops(up.spatial_conv, frames, h, w)
        return total + conv_flops(dec.conv_out, frames, h, w)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Decode a whole clip in one pass (one fresh cache, one chunk).

        ``[B, z_dim, f, h, w] -> [B, 3, 1 + 4(f - 1), 8h, 8w]``, clamped to ``[-1, 1]``.
        """
        cache = self.new_decoder_cache(z.shape[0], z.shape[3], z.shape[4])
        return self.decode_chunk(z, cache)

    # ---------------------------------------------------------------------------------------
    # latent space of the DiT

    def _latent_stats(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # -> mean, std, each [1, z_dim, 1, 1, 1] on z's device and dtype
        shape = (1, self.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.config.latents_mean, dtype=z.dtype, device=z.device)
        std = torch.tensor(self.config.latents_std, dtype=z.dtype, device=z.device)
        return mean.view(shape), std.view(shape)

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """VAE latents -> DiT latents: ``(z - latents_mean) / latents_std`` per channel."""
        # z: [B, z_dim, f, h, w] -> same
        mean, std = self._latent_stats(z)
        return (z - mean) / std

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """DiT latents -> VAE latents: ``z * latents_std + latents_mean`` per channel."""
        # z: [B, z_dim, f, h, w] -> same
        mean, std = self._latent_stats(z)
        return z * std + mean


def conv_flops(conv: nn.Conv3d | nn.Conv2d, frames: float, h: int, w: int) -> float:
    """A stride-1, size-preserving convolution over ``frames`` frames of ``h x w`` outputs."""
    taps = 1
    for k in conv.kernel_size:
        taps *= k
    macs_per_output = conv.in_channels // conv.groups * taps
    return 2.0 * macs_per_output * conv.out_channels * frames * h * w


def _residuals(blocks: nn.ModuleList) -> Iterable[ResidualBlock]:
    return cast("Iterable[ResidualBlock]", blocks)  # a ModuleList keeps no element type


def _residual_flops(block: ResidualBlock, frames: float, h: int, w: int) -> float:
    convs = (block.conv1, block.conv2, block.conv_shortcut)
    return sum(conv_flops(c, frames, h, w) for c in convs if c is not None)


def _mid_flops(mid: MidBlock, frames: float, h: int, w: int) -> float:
    total = sum(_residual_flops(r, frames, h, w) for r in _residuals(mid.resnets))
    for attn in cast("Iterable[AttentionBlock]", mid.attentions):
        dim, positions = attn.proj.in_channels, h * w
        total += conv_flops(attn.to_qkv, frames, h, w) + conv_flops(attn.proj, frames, h, w)
        total += 4.0 * positions * positions * dim * frames  # q k^T and (attn) v, per frame
    return total


def video_to_uint8(video: torch.Tensor) -> torch.Tensor:
    """Decoder output of one sample -> RGB frames ready for an encoder.

    ``video``: ``[3, n, H, W]`` in ``[-1, 1]`` (values outside are clamped) -> ``[n, H, W, 3]``
    uint8, on the input's device (move it with ``.cpu()`` where needed).
    """
    # video: [3, n, H, W] -> [n, H, W, 3]
    if video.ndim != 4 or video.shape[0] != 3:
        raise VAEShapeError(f"video_to_uint8 expects [3, n, H, W], got {tuple(video.shape)}")
    scaled = (video.float().clamp(-1.0, 1.0) + 1.0) * 127.5
    return scaled.round().to(torch.uint8).permute(1, 2, 3, 0).contiguous()
