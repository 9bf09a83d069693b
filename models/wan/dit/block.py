"""One Wan2.1 DiT block (self-attention, cross-attention, FFN under AdaLN modulation) and the
output head. Numerics follow diffusers: layer norms, modulation and residual updates in
float32, cast back to the model dtype. ``models/wan/dit/transformer.py`` stacks them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.wan.dit.attention import WanCrossAttention, WanSelfAttention
from models.wan.dit.config import WanDiTConfig
from models.wan.kv.fp8 import Fp8Past

__all__ = ["WanBlock", "WanHead", "block_dynamic"]


def _norm_fp32(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # x: [B, N, dim] -> float32 [B, N, dim]
    if isinstance(norm, nn.LayerNorm):
        weight = None if norm.weight is None else norm.weight.float()
        bias = None if norm.bias is None else norm.bias.float()
        return F.layer_norm(x.float(), norm.normalized_shape, weight, bias, norm.eps)
    return x.float()


class WanBlock(nn.Module):
    """Self-attention (3D RoPE) -> cross-attention to the prompt -> FFN, AdaLN-modulated."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        dim, eps = config.dim, config.eps
        qk_norm = config.qk_norm is not None
        self.norm1 = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.self_attn = WanSelfAttention(dim, config.num_heads, qk_norm, eps)
        self.norm3 = nn.LayerNorm(dim, eps) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = WanCrossAttention(dim, config.num_heads, qk_norm, eps)
        self.norm2 = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(config.ffn_dim, dim),
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | Fp8Past | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, N, dim]; e0: [B, 1 | N, 6, dim]; cos, sin: [N, D/2]; cross_k/v: [B, L, H, D]
        # -> x [B, N, dim], this call's self-attention k, v [B, N, H, D]
        mods = (self.modulation.float() + e0.float()).unbind(2)  # 6 x [B, 1 | N, dim]
        shift, scale, gate, c_shift, c_scale, c_gate = mods
        h = (_norm_fp32(self.norm1, x) * (1 + scale) + shift).type_as(x)
        attn, k, v = self.self_attn(h, cos, sin, past, mask)
        x = (x.float() + attn * gate).type_as(x)
        x = x + self.cross_attn(_norm_fp32(self.norm3, x).type_as(x), cross_k, cross_v)
        h = (_norm_fp32(self.norm2, x) * (1 + c_scale) + c_shift).type_as(x)
        x = (x.float() + self.ffn(h).float() * c_gate).type_as(x)
        return x, k, v


class WanHead(nn.Module):
    """Final modulated norm and the linear map back to patch pixels."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        dim = config.dim
        self.norm = nn.LayerNorm(dim, config.eps, elementwise_affine=False)
        self.head = nn.Linear(dim, config.out_channels * config.patch_volume)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # x: [B, N, dim]; e: [B, 1 | N, dim] -> [B, N, out_channels * patch_volume]
        shift, scale = (self.modulation.float() + e.float().unsqueeze(2)).unbind(2)
        return self.head((_norm_fp32(self.norm, x) * (1 + scale) + shift).type_as(x))


def block_dynamic(args: tuple[object, ...]) -> list[tuple[torch.Tensor, int]]:
    """The dimensions one compiled block graph keeps symbolic (``models.precompiled``), for
    ``WanBlock.forward``'s ``args`` (the block first):

    - the cached tokens a block call attends to, ``past``'s dim 1 (K and V), where it is read
      unmasked (a filled prefix: its length grows while a cache fills). A masked call reads the
      whole cache, a fixed length;
    - the batch, dim 0 of every batched input, where it is above one: several sessions' steps
      at one prefix length as one forward (``WanDiT.forward_chunks``), so one graph serves
      every batch size. Dynamo specialises a size of one, so a session alone keeps its own
      graph.
    """
    x, e0, cos, sin, cross_k, cross_v, past, mask = args[1:9]
    marks: list[tuple[torch.Tensor, int]] = []
    if mask is None:
        if isinstance(past, Fp8Past):
            marks += [(past.k, 1), (past.v, 1)]
        elif isinstance(past, tuple) and all(isinstance(t, torch.Tensor) for t in past):
            marks += [(t, 1) for t in past if isinstance(t, torch.Tensor)]
    if not isinstance(x, torch.Tensor) or x.shape[0] < 2:
        return marks
    batched: list[object] = [x, e0, cross_k, cross_v]
    batched += [t for t in (cos, sin) if isinstance(t, torch.Tensor) and t.ndim == 3]
    if isinstance(past, Fp8Past):
        batched += [past.k, past.v, past.k_descale, past.v_descale]
    elif isinstance(past, tuple):
        batched += list(past)
    marks += [(t, 0) for t in batched if isinstance(t, torch.Tensor) and t.shape[0] == x.shape[0]]
    return marks
