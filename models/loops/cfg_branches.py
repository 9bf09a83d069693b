"""Classifier-free guidance with its two branches on two ranks (the ``cfg`` axis).

One process runs a CFG step as one DiT forward on a batch of 2 (conditional, unconditional).
Under ``cfg=2`` the two ranks of a ``cfg`` group hold the same weights and receive the same
step (``runtime/spmd.py``); each runs the forward of its own branch alone (batch 1: half the
FLOPs each) and one all-gather gives both ranks both predictions, in branch order, so each
combines ``v_u + s * (v_c - v_u)`` and steps the sampler exactly as one process would::

    rank cfg=0: v_c = dit(x, t, text)     --all-gather--> [v_c, v_u] -> the same update
    rank cfg=1: v_u = dit(x, t, negative) --all-gather--> [v_c, v_u] -> the same update

Set on ``DiffusionStepOp.branches`` (None: both branches in one batch). A step without CFG
(guidance 1) or with extensions' hooks (their branch states are per batch of 2) runs whole on
every rank: the same result, computed twice. With ``sp > 1`` too, each branch's forward runs
Ulysses over its own ``sp`` group. Numerics: two batch-1 forwards instead of one of batch 2,
so within float rounding of one process (tests/models/test_cfg_branches.py states it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["CfgBranches"]


class CfgBranches:
    """One rank's branch of a ``cfg`` group (``group``: the ``DeviceMesh["cfg"]`` group of 2
    ranks; index 0 runs the conditional branch, 1 the unconditional one)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        size = dist.get_world_size(group)
        if size != 2:
            raise ValueError(f"a cfg group has 2 ranks (one per branch), got {size}")
        self.group = group
        self.branch = dist.get_rank(group)

    def text(self, text: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """The prompt embedding my branch conditions on. [1, L, text_dim] -> the same"""
        return text if self.branch == 0 else negative

    def gather(self, v: torch.Tensor) -> torch.Tensor:
        """Both branches' predictions in branch order. v: [1, C, f, h, w] -> [2, C, f, h, w]"""
        parts = [torch.empty_like(v) for _ in range(2)]
        dist.all_gather(parts, v.contiguous(), group=self.group)
        return torch.cat(parts)
