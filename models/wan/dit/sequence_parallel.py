"""Ulysses sequence parallelism for the Wan DiT (DeepSpeed-Ulysses, arXiv:2309.14509).

Outside self-attention every layer of a block is per token, so each of the ``sp`` ranks of a
group keeps 1/sp of the chunk's tokens (contiguous, rank-major). Self-attention needs every
token, but its heads are independent: one all-to-all trades the token shard for a head shard
(each rank then holds every token of H/sp heads), attention runs locally, and a second
all-to-all trades back before the output projection::

    x [B, N/sp, dim] -> q, k, v [B, N/sp, H, D] --a2a--> [B, N, H/sp, D] -> RoPE, attend over
    cache (H/sp heads) + own keys -> [B, N, H/sp, D] --a2a--> [B, N/sp, H, D] -> o -> [B, N/sp, dim]

RoPE runs after the first all-to-all, on whole sequences with the unsharded tables (heads share
the tables), so positions never need slicing. The chunk-K/V cache is sharded by heads for the
same reason: the post-RoPE K/V a rank holds after the all-to-all are exactly its heads' slab of
every token, which is what later chunks attend to (``local_kv_config``: the cache's config
has H/sp heads of the same head_dim). Cross-attention and the FFN run on the token shard (the
prompt's K/V are replicated: small). The head's output is all-gathered before unpatchify, so
every rank returns the whole chunk and the loops, samplers and decode see no difference.

Two hooks on the DiT carry it, set by ``enable`` (None = single process, unchanged code path):
``WanDiT.sequence_parallel`` (shard tokens before the blocks, gather after the head) and
``WanSelfAttention.sequence_parallel`` (the attention above). Communication is
``torch.distributed`` (NCCL on GPUs, gloo on CPUs); nothing here is differentiable: inference.
Numerics: the same matmuls on fewer rows, so within float rounding of one process (the gloo
tests state the tolerance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from models.wan.dit.config import WanDiTConfig
from models.wan.dit.rope import apply_rope

__all__ = ["SequenceShards", "enable", "local_kv_config"]

Kernel = Callable[..., torch.Tensor]


class SequenceShards:
    """One rank's view of an ``sp`` group: token sharding, the all-to-alls and the gather.

    ``group`` is the process group of the ``sp`` axis (a ``DeviceMesh["sp"].get_group()``);
    ``size`` its world size, ``rank`` this process's index in it.
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    # -- tokens ----------------------------------------------------------------------------

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of dim 1. x: [B, N, ...] -> [B, N/sp, ...]; an x of
        one token per batch row along dim 1 (per-chunk conditioning) passes through."""
        if x.shape[1] == 1:
            return x
        tokens = x.shape[1]
        if tokens % self.size:
            raise ValueError(f"{tokens} tokens do not split over sp={self.size} ranks")
        shard = tokens // self.size
        return x[:, self.rank * shard : (self.rank + 1) * shard]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """All ranks' slices back in rank order. x: [B, N/sp, C] -> [B, N, C]"""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)

    # -- heads <-> tokens --------------------------------------------------------------------

    def tokens_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, N/sp, H, D] (all heads of my tokens) -> [B, N, H/sp, D] (my heads, all tokens)"""
        b, n, h, d = x.shape
        # [sp, B, N/sp, H/sp, D]: chunk j of the heads goes to rank j
        send = x.reshape(b, n, self.size, h // self.size, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = torch.empty_like(send)  # [sp, B, N/sp, H/sp, D]: token shard i from rank i
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 0, 2, 3, 4).reshape(b, self.size * n, h // self.size, d)

    def heads_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, N, H/sp, D] -> [B, N/sp, H, D] (the inverse of ``tokens_to_heads``)"""
        b, n, h, d = x.shape
        shard = n // self.size
        send = x.reshape(b, self.size, shard, h, d).transpose(0, 1).contiguous()
        recv = torch.empty_like(send)  # [sp, B, N/sp, H/sp, D]: head shard j from rank j
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, shard, self.size * h, d)


class UlyssesAttention:
    """``WanSelfAttention.sequence_parallel``: the attention of the module docstring.

    Called as ``hook(attn, x, cos, sin, past, mask, kernel)`` with ``attn`` the block's
    ``WanSelfAttention`` (its projections and norms) and ``kernel`` its attention backend;
    returns ``(out [B, N/sp, dim], k [B, N, H/sp, D], v [B, N, H/sp, D])`` - k, v are what this
    rank's head-sharded cache stores.
    """

    def __init__(self, shards: SequenceShards) -> None:
        self.shards = shards

    def __call__(
        self,
        attn: Any,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        kernel: Kernel,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, N/sp, dim]; cos, sin: [N | B, N, D/2]; past: 2 x [B, P, H/sp, D];
        # mask: [N | 1, P + N]
        s = self.shards
        q = s.tokens_to_heads(attn._heads(attn.norm_q(attn.q(x))))  # [B, N, H/sp, D]
        k = s.tokens_to_heads(attn._heads(attn.norm_k(attn.k(x))))
        v = s.tokens_to_heads(attn._heads(attn.v(x)))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is None:
            out = kernel(q, k, v, mask)  # [B, N, H/sp * D]
        else:
            out = kernel(q, torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1), mask)
        out = s.heads_to_tokens(out.unflatten(-1, (k.shape[2], -1))).flatten(2)  # [B, N/sp, dim]
        return attn.o(out), k, v


def local_kv_config(config: WanDiTConfig, sp: int) -> WanDiTConfig:
    """The config a rank's chunk-K/V cache is sized by: H/sp heads of the same head_dim."""
    if config.num_heads % sp:
        raise ValueError(f"sp={sp} does not divide {config.num_heads} heads")
    return config.replace(num_heads=config.num_heads // sp, dim=config.dim // sp)


def enable(dit: Any, group: dist.ProcessGroup | None) -> SequenceShards:
    """Make ``dit`` (a ``WanDiT``) run Ulysses over ``group``; returns the shards it uses.
    Every rank of the group must hold the same weights and call the DiT with the same inputs."""
    shards = SequenceShards(group)
    if dit.config.num_heads % shards.size:
        raise ValueError(f"sp={shards.size} does not divide {dit.config.num_heads} heads")
    dit.sequence_parallel = shards
    hook = UlyssesAttention(shards)
    for block in dit.blocks:
        block.self_attn.sequence_parallel = hook
    return shards
