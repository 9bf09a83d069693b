"""Residual caches of the Wan DiT's block stack: its two interceptors.

Both skip transformer blocks of a denoising step by adding the residual those blocks produced
at an earlier step, when a cheap *probe* says the step's input barely moved; they differ in
the probe and in the hook point (``runtime.extensions``):

- ``FirstBlockCache`` (FBCache-style, ``HookPoint.BLOCK``): runs block 0, probes with its
  residual ``r1 = h1 - h0``; if the relative L1 change of ``r1`` since the last fully computed
  step is below ``threshold``, blocks 1..L-1 are replaced by their cached residual.
- ``StepCache`` (TeaCache-style, ``HookPoint.STEP``): probes with block 0's AdaLN-modulated
  input (timestep-aware, computed before any block runs); it accumulates the relative L1
  change step over step and, while the sum stays below ``threshold``, replaces the whole stack
  by its cached residual (the sum restarts at every computed step).

Either one always computes a step with nothing cached and the schedule's last step (its
output is the sample). Threshold 0 never reuses: the output is bit-identical to the plain
forward. The policies are stateless; what they remember lives in the loop's
``plugin_state`` per CFG branch (``BranchCache``), moved in and out by
``models/wan/dit/step_hooks.py``. Deciding reads one float per branch from the device (a host
sync per step): the price of content-adaptive skipping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import torch
import torch.nn.functional as F

from runtime.contract import ExtensionSpec, HookPoint

__all__ = [
    "FIRST_BLOCK_CACHE",
    "STEP_CACHE",
    "CacheParams",
    "FirstBlockCache",
    "ResidualCache",
    "StepCache",
    "rel_l1",
]

# the loops whose steps these caches hook (many-step bidirectional jobs)
_LOOPS = ("diffusion_denoise",)


class CacheParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Deploy defaults and request overrides of a residual cache. ``threshold``: relative L1
    change below which cached work is reused (0: never, exact)."""

    enabled: bool = True
    threshold: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] = 0.0

    def altering_fields(self) -> list[str]:
        return [f"threshold={self.threshold:g}"] if self.threshold > 0 else []


FIRST_BLOCK_CACHE = ExtensionSpec(
    name="fbcache",
    version=1,
    hook=HookPoint.BLOCK,
    params=CacheParams,
    claims="dit.blocks",
    loops=_LOOPS,
    reuses_steps=True,
)
STEP_CACHE = ExtensionSpec(
    name="teacache",
    version=1,
    hook=HookPoint.STEP,
    params=CacheParams,
    claims="dit.blocks",
    loops=_LOOPS,
    reuses_steps=True,
    min_steps=20,
)


def rel_l1(new: torch.Tensor, old: torch.Tensor) -> float:
    """mean |new - old| / mean |old| (host float; one sync)."""
    # new, old: same shape
    diff = (new.float() - old.float()).abs().mean()
    return float(diff / old.float().abs().mean().clamp_min(1e-12))


@dataclass(slots=True)
class BranchCache:
    """What a cache remembers for one CFG branch of one loop (``plugin_state`` plain data)."""

    probe: torch.Tensor | None = None  # [1, N, dim] the probe it compares against
    residual: torch.Tensor | None = None  # [1, N, dim] output - input of the skipped blocks
    accumulated: float = 0.0
    reused: int = 0
    computed: int = 0

    def to_plain(self) -> dict[str, object]:
        return {
            "probe": self.probe,
            "residual": self.residual,
            "accumulated": self.accumulated,
            "reused": self.reused,
            "computed": self.computed,
        }

    @classmethod
    def from_plain(cls, plain: dict[str, Any] | None) -> BranchCache:
        return cls(**plain) if plain else cls()


class ResidualCache:
    """A residual-cache policy: ``probe_blocks`` blocks always run, ``probe`` is what it
    compares, ``distance`` says how far a branch's probe moved (None: nothing to reuse) and
    ``wants`` whether that is close enough; ``record`` keeps what the next step compares
    against once the branches decided together (a CFG batch reuses only if all branches do)."""

    spec: ExtensionSpec
    probe_blocks: int = 0

    def __init__(self, params: CacheParams) -> None:
        self.threshold = params.threshold

    def probe(self, dit: Any, tokens: torch.Tensor, h: torch.Tensor, e0: torch.Tensor) -> Any:
        raise NotImplementedError

    def distance(
        self, cache: BranchCache, probe: torch.Tensor, step: int, steps: int
    ) -> float | None:
        # a step with nothing cached, the last step and threshold 0 always compute
        if cache.residual is None or cache.probe is None or step >= steps - 1:
            return None
        return rel_l1(probe, cache.probe) if self.threshold > 0 else None

    def wants(self, cache: BranchCache, distance: float | None) -> bool:
        raise NotImplementedError

    def record(
        self, cache: BranchCache, probe: torch.Tensor, distance: float | None, reused: bool
    ) -> None:
        raise NotImplementedError


class FirstBlockCache(ResidualCache):
    spec = FIRST_BLOCK_CACHE
    probe_blocks = 1

    def probe(self, dit: Any, tokens: torch.Tensor, h: torch.Tensor, e0: torch.Tensor) -> Any:
        # tokens, h: [B, N, dim] before / after block 0 -> its residual [B, N, dim]
        return h - tokens

    def wants(self, cache: BranchCache, distance: float | None) -> bool:
        return distance is not None and distance < self.threshold

    def record(
        self, cache: BranchCache, probe: torch.Tensor, distance: float | None, reused: bool
    ) -> None:
        if not reused:  # compared against the last computed step's residual
            cache.probe = probe


class StepCache(ResidualCache):
    spec = STEP_CACHE
    probe_blocks = 0

    def probe(self, dit: Any, tokens: torch.Tensor, h: torch.Tensor, e0: torch.Tensor) -> Any:
        # block 0's modulated input: [B, N, dim] (float32)
        block = dit.blocks[0]
        shift, scale = (block.modulation.float() + e0.float()).unbind(2)[:2]
        norm = block.norm1
        normed = F.layer_norm(h.float(), norm.normalized_shape, None, None, norm.eps)
        return normed * (1 + scale) + shift

    def wants(self, cache: BranchCache, distance: float | None) -> bool:
        return distance is not None and cache.accumulated + distance < self.threshold

    def record(
        self, cache: BranchCache, probe: torch.Tensor, distance: float | None, reused: bool
    ) -> None:
        cache.probe = probe  # step over step, reused or not
        cache.accumulated = cache.accumulated + (distance or 0.0) if reused else 0.0
