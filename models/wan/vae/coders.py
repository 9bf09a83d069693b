"""The two halves of the Wan2.1 VAE: a causal 3D encoder and decoder over an explicit cache.

Both coders are stateless: a forward consumes one chunk of frames and reads and rewrites the slots
of the ``CausalCache`` it is given; it reads ``cache.frames_seen`` but leaves advancing it to the
caller (``WanVAE.encode_moments`` / ``decode_chunk``): the compiled decoder then traces as one
graph, where storing into the cache (a ``msgspec.Struct``, which Dynamo does not trace) broke it
in two and made Dynamo trace every shape twice. Each coder numbers its causal
slots once at construction (``slot_specs``) and maps spatial levels to grid sizes
(``level_hw``), which is everything a cache needs to be allocated up front with static shapes.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from models.wan.vae.blocks import (
    CausalConv3d,
    Downsample,
    MidBlock,
    ResidualBlock,
    RMSNorm,
    UpBlock,
)
from models.wan.vae.cache import CausalCache, SlotSpec
from models.wan.vae.config import WanVAEConfig

__all__ = ["Decoder", "Encoder"]


class _SlotNumbering:
    """Hands out slot indices in construction order and records each slot's spec."""

    def __init__(self) -> None:
        self.specs: list[SlotSpec] = []

    def claim(self, owner: CausalConv3d | Downsample, channels: int, level: int) -> None:
        owner.slot = len(self.specs)
        self.specs.append(SlotSpec(channels, owner.history_frames, level))

    def claim_convs(self, module: nn.Module, level: int) -> None:
        """Every causal conv with history inside ``module`` (time convs of upsamplers included)."""
        for conv in module.modules():
            if isinstance(conv, CausalConv3d) and conv.history_frames > 0:
                self.claim(conv, conv.in_channels, level)


class Encoder(nn.Module):
    """Pixels ``[B, 3, T, H, W]`` -> moments ``[B, 2 * z_dim, t, H // 8, W // 8]``.

    ``down_blocks`` is one flat list (residual blocks, then a ``Downsample`` after every stage
    but the last), as in Wan's original layout. Level ``i`` is the pixel grid halved ``i`` times.
    """

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        dims = [config.base_dim * m for m in (1, *config.dim_mult)]
        last_stage = len(config.dim_mult) - 1
        numbering = _SlotNumbering()

        self.conv_in = CausalConv3d(config.in_channels, dims[0], 3)
        numbering.claim_convs(self.conv_in, 0)
        blocks: list[nn.Module] = []
        for stage, (in_dim, out_dim) in enumerate(pairwise(dims)):
            for _ in range(config.num_res_blocks):
                block = ResidualBlock(in_dim, out_dim)
                numbering.claim_convs(block, stage)
                blocks.append(block)
                in_dim = out_dim
            if stage != last_stage:
                down = Downsample(out_dim, temporal=config.temperal_downsample[stage])
                if down.time_conv is not None:
                    numbering.claim(down, out_dim, stage + 1)  # after the spatial stride
                blocks.append(down)
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = MidBlock(dims[-1])
        numbering.claim_convs(self.mid_block, last_stage)
        self.norm_out = RMSNorm(dims[-1], video=True)
        self.conv_out = CausalConv3d(dims[-1], 2 * config.z_dim, 3)
        numbering.claim_convs(self.conv_out, last_stage)

        self.num_levels = last_stage + 1
        self.slot_specs: tuple[SlotSpec, ...] = tuple(numbering.specs)

    def level_hw(self, height: int, width: int) -> list[tuple[int, int]]:
        """Grid of every level for a ``height x width`` input (each stride-2 conv floors)."""
        sizes = [(height, width)]
        for _ in range(self.num_levels - 1):
            h, w = sizes[-1]
            sizes.append((h // 2, w // 2))
        return sizes

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # x: [B, C_in, T, H, W] -> [B, 2 * z_dim, t, H / 8, W / 8]
        # T = 1 + 4k for the first chunk (t = 1 + k), T = 4k mid-stream (t = k)
        x = self.conv_in(x, cache)
        for block in self.down_blocks:
            x = block(x, cache)
        x = self.mid_block(x, cache)
        return self.conv_out(F.silu(self.norm_out(x)), cache)


class Decoder(nn.Module):
    """Latents ``[B, z_dim, t, h, w]`` -> pixels ``[B, 3, T, 8h, 8w]`` (before clamping).

    ``up_blocks[i]`` runs at level ``i`` (the latent grid times ``2 ** i``); every block but the
    last ends in an ``Upsample`` that halves the channels, hence the halved input widths.
    """

    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        mults = (config.dim_mult[-1], *reversed(config.dim_mult))
        dims = [config.base_dim * m for m in mults]
        temporal_up = tuple(reversed(config.temperal_downsample))
        last_stage = len(config.dim_mult) - 1
        numbering = _SlotNumbering()

        self.conv_in = CausalConv3d(config.z_dim, dims[0], 3)
        numbering.claim_convs(self.conv_in, 0)
        self.mid_block = MidBlock(dims[0])
        numbering.claim_convs(self.mid_block, 0)
        blocks: list[UpBlock] = []
        for stage, (in_dim, out_dim) in enumerate(pairwise(dims)):
            upsample = stage != last_stage
            block = UpBlock(
                in_dim // 2 if stage > 0 else in_dim,
                out_dim,
                config.num_res_blocks,
                upsample=upsample,
                temporal=upsample and temporal_up[stage],
            )
            numbering.claim_convs(block, stage)  # the time conv runs before the 2x upsample
            blocks.append(block)
        self.up_blocks = nn.ModuleList(blocks)
        self.norm_out = RMSNorm(dims[-1], video=True)
        self.conv_out = CausalConv3d(dims[-1], config.out_channels, 3)
        numbering.claim_convs(self.conv_out, last_stage)

        self.num_levels = last_stage + 1
        self.slot_specs: tuple[SlotSpec, ...] = tuple(numbering.specs)

    def level_hw(self, height: int, width: int) -> list[tuple[int, int]]:
        """Grid of every level for a ``height x width`` latent grid."""
        return [(height * 2**level, width * 2**level) for level in range(self.num_levels)]

    def forward(self, z: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        # z: [B, z_dim, t, h, w] -> [B, C_out, T, 8h, 8w]
        # T = 1 + 4(t - 1) for the stream's first chunk, T = 4t afterwards
        x = self.conv_in(z, cache)
        x = self.mid_block(x, cache)
        for block in self.up_blocks:
            x = block(x, cache)
        return self.conv_out(F.silu(self.norm_out(x)), cache)
