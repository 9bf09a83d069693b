"""What conditions the DiT besides the video tokens: timestep, prompt, and the optional hooks.

- timestep: sinusoid (float32, cos-then-sin as diffusers' ``Timesteps(flip_sin_to_cos=True)``)
  -> ``time_embedding`` MLP -> ``e`` [B, dim]; ``time_projection`` turns ``e`` into the six
  per-block modulation vectors. The output head modulates with ``e`` itself.
- prompt: ``text_embedding`` MLP maps text-encoder features to ``dim`` (cross-attention context).
- action hook (``action_dim > 0``): ``action_embedding(action)`` [B, dim] is ADDED TO ``e``
  before ``time_projection``, so a chunk's keyboard/mouse input steers every block's modulation
  and the head's (conditioning "through the modulation").
- audio hook (``audio_dim > 0``): ``audio_embedding(audio)`` [B, f, dim] is ADDED TO EVERY TOKEN
  OF ITS LATENT FRAME right after the patch embedding.

Both hooks end in a zero-initialised linear layer: with zero weights they add exactly 0.0, so a
model loaded from a checkpoint without hook weights computes exactly what plain Wan computes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "HookEmbedding",
    "sinusoidal_embedding",
    "text_embedding",
    "time_embedding",
    "time_projection",
]


def sinusoidal_embedding(timestep: torch.Tensor, channels: int) -> torch.Tensor:
    """Transformer-style timestep features (max period 10^4), float32.

    timestep: [B] (any real dtype) -> [B, channels] laid out as [cos | sin]
    """
    half = channels // 2
    exponent = (
        -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
    )
    angles = timestep[:, None].float() * torch.exp(exponent)[None, :]  # [B, half]
    return torch.cat((torch.cos(angles), torch.sin(angles)), dim=-1)


def time_embedding(freq_dim: int, dim: int) -> nn.Sequential:
    # [B, freq_dim] -> [B, dim]
    return nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))


def time_projection(dim: int) -> nn.Sequential:
    # [B, dim] -> [B, 6 * dim]  (shift, scale, gate of self-attn; shift, scale, gate of FFN)
    return nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))


def text_embedding(text_dim: int, dim: int) -> nn.Sequential:
    # [B, L, text_dim] -> [B, L, dim]
    return nn.Sequential(nn.Linear(text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim))


class HookEmbedding(nn.Sequential):
    """Linear -> SiLU -> zero-initialised Linear: a conditioning input that starts as a no-op.

    x: [..., in_dim] -> [..., dim]. ``reset_parameters`` restores the no-op state (used by the
    loader when a checkpoint has no weights for the hook).
    """

    def __init__(self, in_dim: int, dim: int) -> None:
        first, last = nn.Linear(in_dim, dim), nn.Linear(dim, dim)  # (made in this order)
        super().__init__(first, nn.SiLU(), last)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def reset_parameters(self) -> None:
        first, last = self[0], self[2]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)  # (__init__'s)
        first.reset_parameters()
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
