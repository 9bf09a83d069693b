"""The runtime parts of a model card: components, denoising schedules, loops and caches.

What the card's loops are made of and how they sample; pure data, checked by
``ModelCard.validate()`` (cross-references) and at construction (enum fields).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.card.vocabulary import (
    DENOISING_LOOPS,
    AttentionMode,
    CacheKind,
    ComponentKind,
    KVUpdate,
    LoopKind,
    coerce,
)

__all__ = ["CacheContract", "ComponentSpec", "LoopSpec", "ScheduleSpec"]


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    """One loadable part. ``preset`` names the family's architecture preset (e.g. the DiT's
    ``"wan2.1-1.3b"``); ``precision`` pins a precision (``None``: the serving precision);
    ``conditioning`` lists the live-input hooks the component implements (``"action"``, ...)."""

    component_id: str
    kind: ComponentKind
    preset: str
    precision: str | None = None
    conditioning: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", coerce(ComponentKind, self.kind, "component kind"))
        object.__setattr__(self, "conditioning", frozenset(self.conditioning))


# The fewest schedule steps a card may allow step skipping on.
MIN_SKIPPING_STEPS = 20


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """Denoising schedule: nominal ``timesteps`` on the ``num_train_timesteps`` grid, highest
    first; the sampler applies ``flow_shift``. ``guidance_scale`` 1.0 means no CFG (distilled
    recipes bake guidance into the weights). ``step_skipping``: interceptors that reuse work
    across steps (step/block caches, ``runtime.extensions``) may run; a card says so only for a
    many-step schedule it was measured on (off for few-step distilled schedules, where every
    step moves the sample a long way)."""

    timesteps: tuple[int, ...]
    flow_shift: float
    num_train_timesteps: int = 1000
    guidance_scale: float = 1.0
    step_skipping: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "timesteps", tuple(int(t) for t in self.timesteps))

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def problems(self) -> list[str]:
        found = []
        ts = self.timesteps
        if not ts:
            found.append("schedule has no timesteps")
        if any(not 0 < t <= self.num_train_timesteps for t in ts):
            found.append(f"timesteps {list(ts)} must lie in (0, {self.num_train_timesteps}]")
        if any(a <= b for a, b in zip(ts, ts[1:], strict=False)):
            found.append(f"timesteps {list(ts)} must strictly decrease")
        if not (math.isfinite(self.flow_shift) and self.flow_shift > 0):
            found.append(f"flow_shift={self.flow_shift} must be finite and > 0")
        if not (math.isfinite(self.guidance_scale) and self.guidance_scale >= 1.0):
            found.append(f"guidance_scale={self.guidance_scale} must be finite and >= 1")
        if self.step_skipping and len(ts) < MIN_SKIPPING_STEPS:
            found.append(
                f"step_skipping on a {len(ts)}-step schedule (allowed from "
                f"{MIN_SKIPPING_STEPS} steps: a few-step schedule has no step to spare)"
            )
        return found


@dataclass(frozen=True, slots=True)
class LoopSpec:
    """A loop the card can run. Denoising loops (``chunk_rollout``, ``diffusion_denoise``) carry
    a ``schedule`` and an ``attention`` mode; ``components`` are the component ids it needs,
    ``inputs`` the live input kinds it absorbs, ``uses`` the helper loops it delegates to.
    ``kv_update`` (chunk-causal loops) says how a chunk's K/V is cached (``KVUpdate``)."""

    loop_id: str
    kind: LoopKind
    schedule: ScheduleSpec | None = None
    attention: AttentionMode | None = None
    components: tuple[str, ...] = ()
    inputs: frozenset[str] = frozenset()
    uses: tuple[str, ...] = ()
    kv_update: KVUpdate = KVUpdate.CLEAN

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", coerce(LoopKind, self.kind, "loop kind"))
        object.__setattr__(self, "kv_update", coerce(KVUpdate, self.kv_update, "kv_update"))
        if self.attention is not None:
            object.__setattr__(
                self, "attention", coerce(AttentionMode, self.attention, "attention")
            )
        object.__setattr__(self, "components", tuple(self.components))
        object.__setattr__(self, "inputs", frozenset(self.inputs))
        object.__setattr__(self, "uses", tuple(self.uses))

    @property
    def denoises(self) -> bool:
        return self.kind in DENOISING_LOOPS

    def sampler(self) -> tuple[AttentionMode | None, ScheduleSpec | None]:
        """What a recipe's weights are sensitive to: attention mode and schedule."""
        return (self.attention, self.schedule)

    def describe(self) -> str:
        if self.schedule is None:
            return f"{self.loop_id} ({self.kind.value})"
        att = self.attention.value if self.attention else "?"
        s = self.schedule
        return (
            f"{self.loop_id} ({att}, timesteps {list(s.timesteps)}, shift {s.flow_shift:g}, "
            f"cfg {s.guidance_scale:g})"
        )


@dataclass(frozen=True, slots=True)
class CacheContract:
    """A cache the card's loops use. For ``chunk_kv``: the most recent
    ``window_latent_frames`` (including the chunk being generated) plus the first
    ``sink_latent_frames`` of the stream are kept; capacity is their sum, so a session runs
    for hours in bounded memory::

        [ sink | ...evicted... | window (rolling, written by index) ]
    """

    kind: CacheKind
    component: str
    window_latent_frames: int = 0
    sink_latent_frames: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", coerce(CacheKind, self.kind, "cache kind"))

    @property
    def capacity_latent_frames(self) -> int:
        return self.window_latent_frames + self.sink_latent_frames
