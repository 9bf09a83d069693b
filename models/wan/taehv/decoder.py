"""TAEHV: a tiny streaming decoder for Wan 2.1 latents (the architecture of madebyollin's
"Tiny AutoEncoder for Hunyuan Video"; ``taew2_1`` is its published Wan 2.1 decoder), as a
latent codec the loops decode with in place of the full Wan VAE.

    dec = TAEHVDecoder(TAEHVConfig.preset("taew2_1"))   # or models.wan.taehv.checkpoint.load_taehv
    cache = dec.new_decoder_cache(1, h, w)              # once per session: static buffers
    for z_chunk in stream:                              # DiT latents, e.g. 3 frames per chunk
        frames = dec.decode_chunk(z_chunk, cache)       # [1, 3, n, 8h, 8w] in [-1, 1]

The network works on 2D frames with time folded into the batch. Its only temporal coupling is
the *memory block*: each sees its own input at the previous frame (zeros before a stream's
first), so a stream's state is one frame of each memory block's input::

    latents [B, 16, t, h, w] -> tanh clamp -> conv 3x3 -> relu
      stage 0  (h, w)    256 ch: 3 x MemBlock, 1x1 "time grow" (x1), 2x nearest, conv 3x3 -> 128
      stage 1  (2h, 2w)  128 ch: 3 x MemBlock, 1x1 time grow x2 (frames double), 2x, conv -> 64
      stage 2  (4h, 4w)   64 ch: 3 x MemBlock, 1x1 time grow x2, 2x, conv -> 64
    relu -> conv 3x3 -> 3 channels in [0, 1] at (8h, 8w), 4t frames; a stream's first 3 dropped

A time grow turns ``C * s`` channels of one frame into ``s`` frames of ``C`` (frame ``j`` =
channels ``[j C, (j + 1) C)``). Because the memory blocks only look one frame back at their own
input, decoding a stream chunk by chunk with the cache equals decoding it in one pass (the
cache holds exactly the frame the next chunk's first frame would have seen).

Latent scale: TAEHV decodes the latents the DiT produces as they are (no per-channel mean/std;
madebyollin: "TAEHV encodes / decodes exactly what diffusion models use"). ``denormalize`` is
therefore the identity, where the Wan VAE's maps DiT latents to its own scale. Pixels come out in
``[0, 1]`` and are returned in ``[-1, 1]`` like the Wan VAE's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from models.wan.taehv.config import TAEHVConfig
from models.wan.vae.autoencoder import VAEShapeError, conv_flops
from models.wan.vae.cache import DecoderCache, SlotSpec

__all__ = ["MemBlock", "TAEHVDecoder", "TAEHVNet", "TAEHVStage"]


def _conv3x3(n_in: int, n_out: int, *, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class MemBlock(nn.Module):
    """``y_t = relu(conv3(relu(conv2(relu(conv1([x_t, x_{t-1}])))) + x_t)``; ``x_{t-1}`` is this
    block's input at the previous frame of the stream."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(2 * channels, channels)
        self.conv2 = _conv3x3(channels, channels)
        self.conv3 = _conv3x3(channels, channels)

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        # x, past: [N, C, H, W] -> [N, C, H, W]
        h = F.relu(self.conv1(torch.cat((x, past), dim=1)))
        h = F.relu(self.conv2(h))
        return F.relu(self.conv3(h) + x)


class TAEHVStage(nn.Module):
    """Memory blocks at one width, then time grow, spatial upsample and a projection."""

    def __init__(
        self, width: int, out_width: int, blocks: int, time_stride: int, space_up: bool
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MemBlock(width) for _ in range(blocks))
        self.time_grow = nn.Conv2d(width, width * time_stride, 1, bias=False)
        self.proj = _conv3x3(width, out_width, bias=False)
        self.time_stride = time_stride
        self.space_up = space_up

    def forward(self, x: torch.Tensor, batch: int, memory: list[torch.Tensor]) -> torch.Tensor:
        # x: [B*T, C, H, W] frames in (b, t) order -> [B*T*s, C_out, uH, uW]
        # memory[k]: [B, C, 1, H, W] block k's input at the stream's previous frame (in place)
        for block, last in zip(self.blocks, memory, strict=True):
            x = block(x, _previous_frames(x, batch, last))
        channels, height, width = x.shape[1], x.shape[2], x.shape[3]
        # A 1x1 conv commutes with nearest-neighbour upsampling (both act per pixel), so the
        # grow runs on the small grid: the same values as the published order, 4x cheaper.
        x = self.time_grow(x).reshape(-1, channels, height, width)  # frame j = channel block j
        if self.space_up:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.proj(x)


def _previous_frames(x: torch.Tensor, batch: int, last: torch.Tensor) -> torch.Tensor:
    """Each frame's predecessor in its stream (``last`` before the chunk's first), then ``last``
    <- the chunk's final frame, in place."""
    # x: [B*T, C, H, W]; last: [B, C, 1, H, W] -> [B*T, C, H, W]
    frames = x.view(batch, -1, *x.shape[1:])  # [B, T, C, H, W]
    past = torch.cat((last.transpose(1, 2), frames[:, :-1]), dim=1).reshape(x.shape)
    last.copy_(frames[:, -1:].detach().transpose(1, 2))  # state, not part of a training graph
    return past


def _stages(net: TAEHVNet) -> Iterable[TAEHVStage]:
    return cast("Iterable[TAEHVStage]", net.stages)  # a ModuleList keeps no element type


class TAEHVNet(nn.Module):
    """Latents ``[B, z, t, h, w]`` -> raw frames ``[B * t * r, 3, 8h, 8w]`` in (b, frame)
    order, before clamping (``r`` = frames per latent frame); advances ``memory`` in place."""

    def __init__(self, config: TAEHVConfig) -> None:
        super().__init__()
        w = config.widths
        self.conv_in = _conv3x3(config.latent_channels, w[0])
        self.stages = nn.ModuleList(
            TAEHVStage(
                w[s],
                w[s + 1],
                config.blocks_per_stage,
                2 if config.time_upscale[s] else 1,
                config.space_upscale[s],
            )
            for s in range(3)
        )
        self.conv_out = _conv3x3(w[3], config.image_channels * config.patch_size**2)
        self.patch_size = config.patch_size
        levels = [0]
        for up in config.space_upscale:
            levels.append(levels[-1] + int(up))
        self.num_levels = levels[-1] + 1
        # one slot per memory block: one frame of its input, at its stage's grid level
        self.slot_specs: tuple[SlotSpec, ...] = tuple(
            SlotSpec(w[s], 1, levels[s]) for s in range(3) for _ in range(config.blocks_per_stage)
        )

    def level_hw(self, height: int, width: int) -> list[tuple[int, int]]:
        """Grid of every level for a ``height x width`` latent grid."""
        return [(height * 2**level, width * 2**level) for level in range(self.num_levels)]

    def forward(self, z: torch.Tensor, memory: list[torch.Tensor]) -> torch.Tensor:
        # z: [B, z, t, h, w] -> [B*t*r, 3, 8h, 8w]
        batch, channels, frames, height, width = z.shape
        x = z.transpose(1, 2).reshape(batch * frames, channels, height, width)
        x = F.relu(self.conv_in(torch.tanh(x / 3.0) * 3.0))  # soft clamp to (-3, 3)
        start = 0
        for stage in _stages(self):
            count = len(stage.blocks)
            x = stage(x, batch, memory[start : start + count])
            start += count
        x = self.conv_out(F.relu(x))
        return F.pixel_shuffle(x, self.patch_size) if self.patch_size > 1 else x


class TAEHVDecoder(nn.Module):
    """A decode-only latent codec for the loops (``DecodeOp``): the interface of ``WanVAE``'s
    decoding side (``denormalize``, ``decode_chunk``, ``new_decoder_cache``,
    ``decoder_cache_bytes``, ``decode_flops``, ``decoder.slot_specs``).

    Holds weights only; a stream's state is a caller-owned ``DecoderCache`` (one frame per
    memory block), so it is loop state and snapshots like the Wan decoder's. Shape errors raise
    ``VAEShapeError``; a cache laid out for another decoder or grid raises
    ``CacheMismatchError``. Outputs follow the weights' dtype and device.
    """

    def __init__(self, config: TAEHVConfig) -> None:
        super().__init__()
        self.config = config
        self.decoder = TAEHVNet(config)

    # ---------------------------------------------------------------------------------------
    # the DiT's latent space

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """The identity: TAEHV works on the DiT's latents as they are (module docstring)."""
        return z

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """The identity: TAEHV works on the DiT's latents as they are (module docstring)."""
        return z

    # ---------------------------------------------------------------------------------------
    # streams

    def new_decoder_cache(
        self,
        batch_size: int,
        latent_height: int,
        latent_width: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DecoderCache:
        """A zeroed per-session cache (defaults: the weights' device and dtype)."""
        weight = self.decoder.conv_in.weight
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

    def decode_chunk(
        self, z: torch.Tensor, cache: DecoderCache, *, clamp: bool = True
    ) -> torch.Tensor:
        """Decode the next ``c`` latent frames of a stream -> ``[B, 3, n, 8h, 8w]`` in [-1, 1].

        ``n = 1 + 4 (c - 1)`` for the stream's first chunk (its first 3 frames are dropped) and
        ``4c`` afterwards; concatenated over a stream they equal ``decode`` of all its latents.
        Rewrites ``cache`` in place and advances ``cache.frames_seen`` by ``c``. ``clamp=False``
        (training) leaves values outside [-1, 1] as they are, so their gradients survive.
        """
        # z: [B, z, c, h, w] -> [B, 3, n, 8h, 8w]
        cfg = self.config
        if z.ndim != 5 or z.shape[1] != cfg.latent_channels or z.shape[2] < 1:
            raise VAEShapeError(
                f"decode expects [B, {cfg.latent_channels}, f >= 1, h, w], got {tuple(z.shape)}"
            )
        batch, frames = z.shape[0], z.shape[2]
        cache.check_compatible(self.decoder.slot_specs, (z.shape[3], z.shape[4]), batch)
        raw = self.decoder(z, cache.buffers)  # [B*n', 3, H, W] in ~[0, 1]
        video = raw.view(batch, -1, *raw.shape[1:])  # [B, n', 3, H, W]
        if cache.frames_seen == 0:
            video = video[:, cfg.frames_to_trim :]
        cache.frames_seen += frames
        if clamp:
            video = video.clamp(0.0, 1.0)
        return (video * 2.0 - 1.0).transpose(1, 2)

    def decode(self, z: torch.Tensor, *, clamp: bool = True) -> torch.Tensor:
        """Decode a whole clip in one pass: ``[B, z, f, h, w] -> [B, 3, 1 + 4(f - 1), 8h, 8w]``."""
        cache = self.new_decoder_cache(z.shape[0], z.shape[3], z.shape[4])
        return self.decode_chunk(z, cache, clamp=clamp)

    def decode_flops(
        self, latent_frames: int, latent_height: int, latent_width: int, *, first: bool = False
    ) -> float:
        """Multiply-add FLOPs (2 per MAC) of ``decode_chunk`` of ``latent_frames`` frames on a
        ``latent_height x latent_width`` grid: every convolution; activations, the clamp and the
        upsampling are left out (memory-bound). ``first`` changes nothing: the trimmed frames of
        a stream's first chunk are computed too. For the cost prior."""
        net = self.decoder
        h, w, frames = latent_height, latent_width, float(latent_frames)
        total = conv_flops(net.conv_in, frames, h, w)
        for stage in _stages(net):
            for block in cast("Iterable[MemBlock]", stage.blocks):
                total += sum(conv_flops(c, frames, h, w) for c in (block.conv1, block.conv2))
                total += conv_flops(block.conv3, frames, h, w)
            total += conv_flops(stage.time_grow, frames, h, w)
            frames *= stage.time_stride
            if stage.space_up:
                h, w = 2 * h, 2 * w
            total += conv_flops(stage.proj, frames, h, w)
        return total + conv_flops(net.conv_out, frames, h, w)
