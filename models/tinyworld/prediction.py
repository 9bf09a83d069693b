"""``PixelDiT``: the Wan DiT adapted to pixel latents (x0-prediction, absolute positions).

Two changes to ``WanDiT``, both needed because tiny-world's latents are the pixels themselves:

1. **x0-prediction.** The DiT reads pixels through a (1, 16, 16) patch, so one token carries 768
   pixel values in a 128-wide vector. A velocity target ``v = eps - x0`` holds the per-pixel
   noise, which cannot pass that bottleneck (a first run plateaued at a loss of 1 - 192/768 of
   the noise variance for a 192-wide model), while clean frames lie on a low-dimensional
   manifold and pass easily (the large-patch pixel-diffusion finding of "Back to Basics: Let
   Denoising Generative Models Denoise", 2025). The head outputs x0; the public forwards
   convert it into the velocity the loops and samplers expect::

       v = (x_t - x0_hat) / sigma,    sigma = timestep / 1000 (clamped to ``MIN_SIGMA``)

   so a loop's ``x0 = x_t - sigma * v`` recovers ``x0_hat`` exactly. At t = 0 (the KV-update
   pass, whose output is discarded) the clamp keeps the value finite.

2. **absolute positions.** Wan has only RoPE, which makes attention depend on relative offsets.
   A stream's first chunk starts from pure noise with nothing cached, so no token can tell where
   it is, and a model that must put the sprite at the centre and a terrain's texture in place
   outputs the flat mean instead. ``position_embedding`` (a zero-initialised ``HookEmbedding``
   of 2-D sin/cos features of each token's normalised (row, column)) adds where each token is;
   ``frame_embedding`` (likewise, of the frame's index inside its chunk) adds *when*: without
   it the frames of a chunk, all noise at the first step, rendered one displacement for all
   four frames instead of a motion. Both start as exact no-ops, so weights without them load
   and behave as before.

Parameters and checkpoint keys are ``WanDiT``'s plus ``position_embedding.*`` and
``frame_embedding.*``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from models.wan.dit.conditioning import HookEmbedding
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT

__all__ = ["FRAME_FEATURES", "MIN_SIGMA", "POSITION_FEATURES", "PixelDiT"]

MIN_SIGMA = 1e-3
POSITION_FEATURES = 32  # 8 frequencies x (sin, cos) x (row, column)
FRAME_FEATURES = 8  # 4 frequencies x (sin, cos) of the frame's index inside its chunk
_TIMESTEP_SCALE = 1000.0  # Wan's timestep = sigma * num_train_timesteps


def _position_features(grid: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    # grid (f, h, w) -> [f * h * w, POSITION_FEATURES], frame-major like the tokens
    f, h, w = grid
    rows = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) / h
    cols = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) / w
    freqs = math.pi * 2.0 ** torch.arange(
        POSITION_FEATURES // 4, device=device, dtype=torch.float32
    )
    r = rows[:, None] * freqs  # [h, 8]
    c = cols[:, None] * freqs  # [w, 8]
    rf = torch.cat((r.sin(), r.cos()), dim=1)[:, None, :].expand(h, w, -1)
    cf = torch.cat((c.sin(), c.cos()), dim=1)[None, :, :].expand(h, w, -1)
    per_frame = torch.cat((rf, cf), dim=2).reshape(h * w, POSITION_FEATURES)
    return per_frame.repeat(f, 1)


def _frame_features(frames: int, chunk_frames: int, device: torch.device) -> torch.Tensor:
    # -> [frames, FRAME_FEATURES] of each frame's index inside its chunk
    k = (torch.arange(frames, device=device) % chunk_frames).float()
    freqs = (math.pi / 8.0) * 2.0 ** torch.arange(
        FRAME_FEATURES // 2, device=device, dtype=torch.float32
    )
    angles = k[:, None] * freqs
    return torch.cat((angles.sin(), angles.cos()), dim=1)


class PixelDiT(WanDiT):
    """A WanDiT that predicts x0 and knows where and when (within its chunk of
    ``chunk_frames``) each token is (module docstring). Inputs must hold whole chunks."""

    def __init__(self, config: WanDiTConfig, chunk_frames: int) -> None:
        super().__init__(config)
        self.chunk_frames = chunk_frames
        self.position_embedding = HookEmbedding(POSITION_FEATURES, config.dim)
        self.frame_embedding = HookEmbedding(FRAME_FEATURES, config.dim)

    def position_tokens(self, grid: tuple[int, int, int], device: torch.device) -> torch.Tensor:
        """What the position and frame embeddings add to each token: grid (f, h, w) ->
        [f * h * w, dim], frame-major like the tokens."""
        dtype = next(self.position_embedding.parameters()).dtype  # its first linear's
        where = self.position_embedding(_position_features(grid, device).to(dtype))
        when = self.frame_embedding(
            _frame_features(grid[0], self.chunk_frames, device).to(dtype)
        )  # [f, dim]
        return where + when.repeat_interleave(grid[1] * grid[2], dim=0)

    def _embed_tokens(
        self, x: torch.Tensor, audio: torch.Tensor | None, grid: tuple[int, int, int]
    ) -> torch.Tensor:
        # x: [B, C, F, H, W] -> [B, N, dim]: Wan's tokens plus absolute positions
        tokens = super()._embed_tokens(x, audio, grid)
        return tokens + self.position_tokens(grid, tokens.device).to(tokens.dtype)

    @staticmethod
    def velocity(x: torch.Tensor, x0: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        """x, x0: [B, C, F, H, W]; timestep: [B] or [B, F] -> v [B, C, F, H, W] in x0's dtype."""
        sigma = (timestep.float() / _TIMESTEP_SCALE).clamp_min(MIN_SIGMA)
        sigma = sigma[:, None, :, None, None] if sigma.ndim == 2 else sigma.view(-1, 1, 1, 1, 1)
        return ((x.float() - x0.float()) / sigma).to(x0.dtype)

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        **hooks: torch.Tensor | None,
    ) -> torch.Tensor:
        x0 = super().forward(hidden_states, timestep, encoder_hidden_states, **hooks)
        return self.velocity(hidden_states, x0, timestep)

    def forward_block_causal(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        chunk_frames: int,
        **hooks: torch.Tensor | None,
    ) -> torch.Tensor:
        x0 = super().forward_block_causal(
            hidden_states, timestep, encoder_hidden_states, chunk_frames, **hooks
        )
        return self.velocity(hidden_states, x0, timestep)

    def forward_chunk(
        self, x: torch.Tensor, timestep: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        x0 = super().forward_chunk(x, timestep, *args, **kwargs)
        return self.velocity(x, x0, timestep)

    def predict_x0(
        self, x: torch.Tensor, timestep: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """The raw head output of ``forward_chunk`` (x0 estimate), same arguments."""
        return super().forward_chunk(x, timestep, *args, **kwargs)
