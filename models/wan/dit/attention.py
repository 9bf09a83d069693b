"""Wan's two attentions: 3D-RoPE self-attention (optionally over cached K/V) and cross-attention.

Parameter names follow the original Wan checkpoints (``q``, ``k``, ``v``, ``o``, ``norm_q``,
``norm_k``); ``models/wan/dit/keymaps.py`` maps diffusers' names onto them. Q/K RMS-norm runs across
all heads (``qk_norm="rms_norm_across_heads"``) before the split into heads, as in Wan2.1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.wan.dit.rope import apply_rope
from models.wan.kernels.attention import ATTENTION_BACKENDS, AttentionBackend, attend
from models.wan.kv.fp8 import Fp8Past, cached_attention

__all__ = ["ATTENTION_BACKENDS", "WanCrossAttention", "WanSelfAttention", "attend"]

_SDPA = ATTENTION_BACKENDS["auto"]


class _Projections(nn.Module):
    def __init__(self, dim: int, num_heads: int, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = nn.RMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.norm_k = nn.RMSNorm(dim, eps=eps) if qk_norm else nn.Identity()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, N, dim] -> [B, N, H, D]
        return x.unflatten(-1, (self.num_heads, -1))


class WanSelfAttention(_Projections):
    """Self-attention of one block; returns this call's (post-RoPE) K and V for caching.

    ``past`` holds K/V of earlier tokens (already rotated at their own positions), prepended to
    this call's K/V, or an ``Fp8Past`` (an e4m3 cache, ``models/wan/kv/fp8.py``); ``mask``
    (True = attend) covers ``past`` tokens followed by this call's.
    ``kernel`` (set by ``WanInstance.compile``; ``models/wan/kernels/attention.py``) computes
    the attention; None is SDPA with PyTorch's kernel choice.
    """

    kernel: AttentionBackend | None = None
    # Ulysses over a process group (models/wan/dit/sequence_parallel.py); None: one process
    sequence_parallel: Any = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | Fp8Past | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, N, dim]; cos, sin: [N | B, N, D/2]; past: 2 x [B, P, H, D]; mask: [N | 1, P + N]
        # -> out [B, N, dim], k [B, N, H, D], v [B, N, H, D]
        kernel = self.kernel or _SDPA
        if self.sequence_parallel is not None:
            return self.sequence_parallel(self, x, cos, sin, past, mask, kernel)
        q = apply_rope(self._heads(self.norm_q(self.q(x))), cos, sin)
        k = apply_rope(self._heads(self.norm_k(self.k(x))), cos, sin)
        v = self._heads(self.v(x))
        if past is None:
            out = kernel(q, k, v, mask)
        elif isinstance(past, Fp8Past):
            out = cached_attention(q, k, v, past, mask)
        else:
            out = kernel(q, torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1), mask)
        return self.o(out), k, v


class WanCrossAttention(_Projections):
    """Attention from video tokens to the prompt; K/V are computed once per prompt (``kv``)."""

    def kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # context: [B, L, dim] (after the text embedding) -> k, v: [B, L, H, D]
        return self._heads(self.norm_k(self.k(context))), self._heads(self.v(context))

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # x: [B, N, dim]; k, v: [B, L, H, D] -> [B, N, dim]
        return self.o(attend(self._heads(self.norm_q(self.q(x))), k, v))
