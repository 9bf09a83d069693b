"""Wan's two attentions: 3D-RoPE self-attention (optionally over cached K/V) and cross-attention.

Parameter names follow the original Wan checkpoints (``q``, ``k``, ``v``, ``o``, ``norm_q``,
``norm_k``); ``models/wan/keymaps.py`` maps diffusers' names onto them. Q/K RMS-norm runs across
all heads (``qk_norm="rms_norm_across_heads"``) before the split into heads, as in Wan2.1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.wan.rope import apply_rope

__all__ = ["ATTENTION_BACKENDS", "WanCrossAttention", "WanSelfAttention", "attend"]

# ``attention`` choices of ``WanInstance.compile``: SDPA kernels tried first, in order, for
# self-attention ("auto": PyTorch's own choice, which was cuDNN's on the H200 with torch 2.11).
# Measured in infra/bench/RESULTS.md (issue 7).
ATTENTION_BACKENDS: dict[str, tuple[SDPBackend, ...] | None] = {
    "auto": None,
    "flash": (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH),
    "cudnn": (
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ),
}


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    backends: tuple[SDPBackend, ...] | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over heads; ``mask`` is True where a key may be attended.
    ``backends``: SDPA kernels to prefer, in order (``None``: PyTorch's choice).

    q: [B, Nq, H, D]; k, v: [B, Nk, H, D]; mask: broadcastable to [B, H, Nq, Nk] -> [B, Nq, H * D]
    """
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if backends is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, Nq, D]
    else:
        with sdpa_kernel(list(backends), set_priority=True):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2).type_as(q)


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
    this call's K/V; ``mask`` (True = attend) covers ``past`` tokens followed by this call's.
    ``backends`` (set by ``WanInstance.compile``) orders the SDPA kernels to try.
    """

    backends: tuple[SDPBackend, ...] | None = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, N, dim]; cos, sin: [N | B, N, D/2]; past: 2 x [B, P, H, D]; mask: [N | 1, P + N]
        # -> out [B, N, dim], k [B, N, H, D], v [B, N, H, D]
        q = apply_rope(self._heads(self.norm_q(self.q(x))), cos, sin)
        k = apply_rope(self._heads(self.norm_k(self.k(x))), cos, sin)
        v = self._heads(self.v(x))
        if past is None:
            out = attend(q, k, v, mask, self.backends)
        else:
            out = attend(
                q,
                torch.cat((past[0], k), dim=1),
                torch.cat((past[1], v), dim=1),
                mask,
                self.backends,
            )
        return self.o(out), k, v


class WanCrossAttention(_Projections):
    """Attention from video tokens to the prompt; K/V are computed once per prompt (``kv``)."""

    def kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # context: [B, L, dim] (after the text embedding) -> k, v: [B, L, H, D]
        return self._heads(self.norm_k(self.k(context))), self._heads(self.v(context))

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # x: [B, N, dim]; k, v: [B, L, H, D] -> [B, N, dim]
        return self.o(attend(self._heads(self.norm_q(self.q(x))), k, v))
