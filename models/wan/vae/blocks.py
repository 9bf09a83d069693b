"""Building blocks of the Wan2.1 VAE: causal 3D convs with an explicit cache, RMS norm, residual
and attention blocks, spatio-temporal up/down-samplers.

Shapes are ``[B, C, T, H, W]`` (channels first, time before space) unless a comment says
otherwise. Modules hold weights and their static slot index only; the per-stream history lives in
the ``CausalCache`` passed to ``forward``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.wan.vae.cache import CausalCache

__all__ = [
    "AttentionBlock",
    "CausalConv3d",
    "Downsample",
    "MidBlock",
    "RMSNorm",
    "ResidualBlock",
    "UpBlock",
    "Upsample",
]

NO_SLOT = -1

# ``row_split`` hooks (a ``models.wan.vae.split.RowBands``, set by ``split.enable`` on the
# decoder's modules; None = one process, the unchanged path): the modules that look across
# rows - 3x3 convs and the mid-block attention - fetch their neighbours' rows through it.


class CausalConv3d(nn.Conv3d):
    """A 3D conv that is causal in time: output frame t sees input frames t-k+1 .. t.

    The ``k - 1`` frames before the chunk come from the cache slot ``self.slot`` (zeros at the
    stream start, which equals Wan's zero padding); space is zero-padded symmetrically.
    ``slot`` is assigned once by the owning coder (``NO_SLOT`` for 1-frame kernels).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int, int]
    ) -> None:
        kt, kh, kw = (kernel_size,) * 3 if isinstance(kernel_size, int) else kernel_size
        super().__init__(in_channels, out_channels, (kt, kh, kw), padding=(0, kh // 2, kw // 2))
        self.history_frames = kt - 1
        self.slot = NO_SLOT
        self.row_split: Any = None

    def forward(  # type: ignore[override]  # a causal conv also takes the stream's cache
        self, x: torch.Tensor, cache: CausalCache
    ) -> torch.Tensor:
        # x: [B, C_in, T, H, W] -> [B, C_out, T, H, W]
        if self.history_frames == 0:
            return super().forward(x)
        history = cache.buffers[self.slot]  # [B, C_in, k-1, H, W]
        padded = torch.cat([history, x], dim=2)  # [B, C_in, k-1+T, H, W]
        history.copy_(padded[:, :, -self.history_frames :])
        if self.row_split is not None:  # a band of rows: the halo comes from the neighbours
            return self.row_split.conv(self, padded)
        return super().forward(padded)


class RMSNorm(nn.Module):
    """Wan's channel RMS norm: ``x / ||x||_C * sqrt(C) * gamma`` (L2-normalise over channels).

    ``video=True`` normalises ``[B, C, T, H, W]`` (gamma ``[C, 1, 1, 1]``), otherwise
    ``[N, C, H, W]`` (gamma ``[C, 1, 1]``). Half-precision inputs are normalised in fp32.
    """

    def __init__(self, dim: int, *, video: bool) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, 1, 1, 1) if video else torch.ones(dim, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, ...] -> same
        upcast = x.dtype in (torch.float16, torch.bfloat16)
        normed = F.normalize(x.float() if upcast else x, dim=1).to(x.dtype)
        return normed * self.scale * self.gamma


class ResidualBlock(nn.Module):
    """``shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))`` with causal 3-tap convs."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(in_dim, video=True)
        self.conv1 = CausalConv3d(in_dim, out_dim, 3)
        self.norm2 = RMSNorm(out_dim, video=True)
        self.conv2 = CausalConv3d(out_dim, out_dim, 3)
        self.conv_shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else None

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # x: [B, C_in, T, H, W] -> [B, C_out, T, H, W]
        skip = x if self.conv_shortcut is None else self.conv_shortcut(x, cache)
        h = self.conv1(F.silu(self.norm1(x)), cache)
        h = self.conv2(F.silu(self.norm2(h)), cache)
        return h + skip


class AttentionBlock(nn.Module):
    """Single-head self-attention over the H*W positions of each frame (no temporal mixing)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, video=False)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.row_split: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T, H, W] -> same
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)  # [BT, C, H, W]
        qkv = self.to_qkv(self.norm(frames))  # [BT, 3C, H, W]
        qkv = qkv.reshape(b * t, 1, 3 * c, h * w).transpose(2, 3)  # [BT, 1, HW, 3C]
        q, k, v = qkv.chunk(3, dim=-1)  # each [BT, 1, HW, C]
        if self.row_split is not None:  # my rows' queries attend to every rank's positions
            k, v = self.row_split.gather(k, dim=2), self.row_split.gather(v, dim=2)
        out = F.scaled_dot_product_attention(q, k, v)  # [BT, 1, HW, C]
        out = out.squeeze(1).transpose(1, 2).reshape(b * t, c, h, w)  # [BT, C, H, W]
        out = self.proj(out).reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4)
        return out + x


class MidBlock(nn.Module):
    """``resnet -> attention -> resnet`` at the coarsest resolution."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResidualBlock(dim, dim), ResidualBlock(dim, dim)])
        self.attentions = nn.ModuleList([AttentionBlock(dim)])

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # x: [B, C, T, H, W] -> same
        x = self.resnets[0](x, cache)
        x = self.attentions[0](x)
        return self.resnets[1](x, cache)


def _per_frame(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    # x: [B, C, T, H, W] -> [B, C', T, H', W'] applying a 2D op to every frame
    b, c, t, h, w = x.shape
    y = op(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))  # [BT, C', H', W']
    return y.reshape(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4)


class Upsample(nn.Module):
    """2x nearest-exact spatial upsampling + 3x3 conv (``dim -> dim // 2`` channels), optionally
    preceded by 2x temporal upsampling (a causal time conv producing two sub-frames per frame).

    The stream's first frame is not upsampled in time and is not part of the time conv's history
    (Wan: one first frame, then ``temporal_factor`` frames per latent frame).
    """

    def __init__(self, dim: int, *, temporal: bool) -> None:
        super().__init__()
        self.spatial_conv = nn.Conv2d(dim, dim // 2, 3, padding=1)
        self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1)) if temporal else None
        self.row_split: Any = None

    @staticmethod
    def _double_in_time(
        time_conv: CausalConv3d, x: torch.Tensor, cache: CausalCache
    ) -> torch.Tensor:
        # x: [B, C, T, H, W] -> [B, C, 2T, H, W]
        b, c, t, h, w = x.shape
        y = time_conv(x, cache).reshape(b, 2, c, t, h, w)  # sub-frame index first
        return y.permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # x: [B, C, T, H, W] -> [B, C // 2, T', 2H, 2W]; T' = 2T, or 1 + 2(T-1) for the first chunk
        time_conv = self.time_conv
        if time_conv is not None:
            if cache.frames_seen == 0:
                first, rest = x[:, :, :1], x[:, :, 1:]
                if rest.shape[2] > 0:
                    first = torch.cat([first, self._double_in_time(time_conv, rest, cache)], dim=2)
                x = first
            else:
                x = self._double_in_time(time_conv, x, cache)
        # nearest-exact at 2x copies values, so it is exact in any dtype
        conv = self.spatial_conv if self.row_split is None else self._split_conv
        return _per_frame(
            lambda f: conv(F.interpolate(f, scale_factor=2.0, mode="nearest-exact")), x
        )

    def _split_conv(self, f: torch.Tensor) -> torch.Tensor:
        return self.row_split.conv(self.spatial_conv, f)


class Downsample(nn.Module):
    """Stride-2 3x3 spatial conv (zero pad right/bottom by one, so ``H -> H // 2``), optionally
    followed by 2x temporal downsampling (a stride-2 3-tap time conv).

    In time the stream's first frame passes through unchanged and then also opens the first
    window: frames ``[x0, conv(x0,x1,x2), conv(x2,x3,x4), ...]``. The slot keeps the last input
    frame, the first tap of the next chunk's first window.
    """

    def __init__(self, dim: int, *, temporal: bool) -> None:
        super().__init__()
        self.spatial_conv = nn.Conv2d(dim, dim, 3, stride=2)
        self.time_conv = nn.Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1)) if temporal else None
        self.history_frames = 1
        self.slot = NO_SLOT

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # x: [B, C, T, H, W] -> [B, C, T', H // 2, W // 2]
        # T' = T / 2 mid-stream (T even), 1 + (T - 1) / 2 for the first chunk (T odd)
        x = _per_frame(lambda f: self.spatial_conv(F.pad(f, (0, 1, 0, 1))), x)
        if self.time_conv is None:
            return x
        history = cache.buffers[self.slot]  # [B, C, 1, h, w]
        if cache.frames_seen == 0:
            out = x[:, :, :1]
            if x.shape[2] >= 3:
                out = torch.cat([out, self.time_conv(x)], dim=2)
        else:
            out = self.time_conv(torch.cat([history, x], dim=2))
        history.copy_(x[:, :, -1:])
        return out


class UpBlock(nn.Module):
    """``num_res_blocks + 1`` residual blocks, then an optional ``Upsample``."""

    def __init__(
        self, in_dim: int, out_dim: int, num_res_blocks: int, *, upsample: bool, temporal: bool
    ) -> None:
        super().__init__()
        dims = [in_dim] + [out_dim] * (num_res_blocks + 1)
        self.resnets = nn.ModuleList(ResidualBlock(a, b) for a, b in pairwise(dims))
        self.upsampler = Upsample(out_dim, temporal=temporal) if upsample else None

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # x: [B, C_in, T, H, W] -> [B, C_out (// 2 if upsampling), T', H', W']
        for resnet in self.resnets:
            x = resnet(x, cache)
        return x if self.upsampler is None else self.upsampler(x, cache)
