"""The hooked bidirectional forward of the Wan DiT: where the extension hook points are.

``StepHooks`` is assembled once per configuration (a residual cache or none, the block
observers) when a loop starts (``models/loops/extensions.py``); a step without any hook does
not come here at all - ``DiffusionStepOp`` calls the plain ``WanDiT.forward``, so an unused
hook costs nothing per block. The hooked forward runs the same modules in the same order as
``WanDiT.forward`` (bit-identical when nothing is reused), plus:

    tokens --block 0..p-1--> h --probe--> decide per CFG branch (all must agree)
       reuse:   h + cached residual            (the remaining blocks do not run)
       compute: blocks p..L-1, keep residual = out - h per branch
    --head--> v

Each branch's cache is its own ``plugin_state`` entry (``"cond"``, ``"uncond"``: rows 0 and 1
of a CFG batch), passed in and handed back as plain data: nothing is kept on the module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from models.wan.dit.residual_caches import BranchCache, ResidualCache

__all__ = ["BRANCHES", "StepHookCall", "StepHooks"]

BRANCHES = ("cond", "uncond")  # row order of a CFG batch (DiffusionStepOp)


@dataclass(frozen=True, slots=True)
class StepHookCall:
    """What one step hands its hooks: who and where it is, and the interceptor's state
    (branch -> ``BranchCache.to_plain()``; the loop's ``plugin_state[name]["branches"]``)."""

    hooks: StepHooks
    name: str  # the interceptor's extension name ("" with observers only)
    loop_id: str
    step: int
    steps: int
    branches: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StepHooks:
    """A residual cache (at most one: they all claim ``dit.blocks``) and block observers."""

    cache: ResidualCache | None = None
    observers: tuple[Any, ...] = ()

    def forward(
        self, dit: Any, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, call: StepHookCall
    ) -> tuple[torch.Tensor, dict[str, Any], bool]:
        """-> (v [B, C, F, H, W], branch -> new cache state, whether cached work was reused).

        x: [B, C, F, H, W] (B = 1, or 2 for CFG: cond then uncond); t: [B]; text: [B, L, d]
        """
        grid = dit._check_latents(x, t)
        tokens = dit._embed_tokens(x, None, grid)
        e, e0 = dit._embed_time(t, None, grid[0])
        cross = dit.cross_kv(text)
        cos, sin = dit._rope(grid, (0,), tokens.device)
        names = BRANCHES[: x.shape[0]]
        keys = [(call.loop_id, call.step, name) for name in names]
        blocks = dit.blocks
        cache = self.cache
        first = cache.probe_blocks if cache is not None else len(blocks)
        h = self._blocks(blocks, range(first), tokens, e0, cos, sin, cross, keys)
        states = {name: BranchCache.from_plain(call.branches.get(name)) for name in names}
        reused = False
        if cache is not None:
            probe = cache.probe(dit, tokens, h, e0)  # [B, N, dim]
            rows = [probe[i : i + 1] for i in range(len(names))]
            distances = [
                cache.distance(states[n], rows[i], call.step, call.steps)
                for i, n in enumerate(names)
            ]
            reused = all(cache.wants(states[n], distances[i]) for i, n in enumerate(names))
            for i, n in enumerate(names):
                cache.record(states[n], rows[i], distances[i], reused)
            if reused:
                residual = torch.cat([_cached_residual(states[n]) for n in names])
                h = (h + residual).type_as(h)
            else:
                start = h
                h = self._blocks(blocks, range(first, len(blocks)), h, e0, cos, sin, cross, keys)
                for i, n in enumerate(names):
                    states[n].residual = h[i : i + 1] - start[i : i + 1]
            for n in names:
                if reused:
                    states[n].reused += 1
                else:
                    states[n].computed += 1
        v = dit._unpatchify(dit.head(h, e), grid)
        return v, {n: s.to_plain() for n, s in states.items()}, reused

    def _blocks(
        self,
        blocks: Any,
        indices: Sequence[int],
        h: torch.Tensor,
        e0: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cross: Any,
        keys: Sequence[tuple[str, int, str]],
    ) -> torch.Tensor:
        # h: [B, N, dim] -> [B, N, dim] after blocks[indices] (exactly WanDiT._run's calls)
        for index in indices:
            h, _, _ = blocks[index](h, e0, cos, sin, cross.k[index], cross.v[index], None, None)
            for observer in self.observers:
                for row, key in enumerate(keys):
                    observer.on_block(key, index, h[row : row + 1])
        return h


def _cached_residual(state: BranchCache) -> torch.Tensor:
    # a branch reuses only with a residual cached (its distance is None without one)
    assert state.residual is not None
    return state.residual
