"""The cross-reference checks ``ModelCard.validate`` runs (``models.card.model``): one function
per concern, each returning the problems it found as sentences naming the field and what it
should be (a recipe that assumes an unknown loop, a capability no loop serves, a manifest
entry for a component the card does not declare, ...).

They read a card through ``CheckedCard``, the fields they look at: the card's module imports
this one (``validate``), so this one names no class of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Protocol

from models.card.manifest import CheckpointManifest
from models.card.profile import LatentSpec, Profile
from models.card.recipe import ParitySpec, PrecisionContract, RecipeSpec
from models.card.specs import CacheContract, ComponentSpec, LoopSpec
from models.card.ui import CardUI
from models.card.vocabulary import (
    CAPABILITIES,
    INPUT_HOOKS,
    INPUT_KINDS,
    PRECISIONS,
    AttentionMode,
    CacheKind,
    ComponentKind,
    LoopKind,
    WeightsKind,
)

__all__ = ["CheckedCard", "card_problems"]


class CheckedCard(Protocol):
    """The fields of a ``ModelCard`` the checks read."""

    @property
    def model_id(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def components(self) -> Mapping[str, ComponentSpec]: ...
    @property
    def loops(self) -> Mapping[str, LoopSpec]: ...
    @property
    def capabilities(self) -> frozenset[str]: ...
    @property
    def recipe(self) -> RecipeSpec: ...
    @property
    def parity(self) -> ParitySpec: ...
    @property
    def caches(self) -> Mapping[str, CacheContract]: ...
    @property
    def precision(self) -> PrecisionContract: ...
    @property
    def checkpoint(self) -> CheckpointManifest: ...
    @property
    def default_profile(self) -> Profile: ...
    @property
    def latent(self) -> LatentSpec: ...
    @property
    def weights(self) -> WeightsKind: ...
    @property
    def ui(self) -> CardUI: ...
    @property
    def compiled_sizes(self) -> tuple[tuple[int, int], ...]: ...

    def loop_for(self, capability: str) -> LoopSpec | None: ...


_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def card_problems(card: CheckedCard) -> list[str]:
    """Every inconsistency of ``card`` (its UI's included), in a stable order."""
    return [
        *_identity_problems(card),
        *_component_problems(card),
        *_loop_problems(card),
        *_decoder_problems(card),
        *_recipe_problems(card),
        *_capability_problems(card),
        *_cache_problems(card),
        *_manifest_problems(card),
        *_profile_problems(card),
        *card.ui.problems(card.capabilities),
    ]


def _identity_problems(card: CheckedCard) -> list[str]:
    found = []
    if not _MODEL_ID.match(card.model_id):
        found.append(f"model_id {card.model_id!r} must match {_MODEL_ID.pattern}")
    for name in ("family", "description", "weights_version"):
        if not getattr(card, name).strip():
            found.append(f"{name} is empty")
    if card.weights is WeightsKind.RANDOM and "random" not in card.description.lower():
        found.append("a random-weights card must say 'random' in its description")
    return found


def _component_problems(card: CheckedCard) -> list[str]:
    found = []
    for key, spec in card.components.items():
        if key != spec.component_id:
            found.append(f"components[{key!r}] has component_id {spec.component_id!r}")
        if not spec.preset:
            found.append(f"component {key!r} names no preset")
        if spec.precision is not None and spec.precision not in PRECISIONS:
            found.append(f"component {key!r} pins unknown precision {spec.precision!r}")
    return found


def _loop_problems(card: CheckedCard) -> list[str]:
    found = []
    for key, spec in card.loops.items():
        where = f"loop {key!r}"
        if key != spec.loop_id:
            found.append(f"loops[{key!r}] has loop_id {spec.loop_id!r}")
        if spec.denoises:
            if spec.schedule is None or spec.attention is None:
                found.append(f"{where} denoises but declares no schedule and attention")
            else:
                found.extend(f"{where}: {p}" for p in spec.schedule.problems())
            if spec.kind is LoopKind.CHUNK_ROLLOUT and spec.attention not in (
                None,  # (said above)
                AttentionMode.CHUNK_CAUSAL,
            ):
                found.append(
                    f"{where} is a chunk_rollout but its attention is "
                    f"{spec.attention.value}, not chunk_causal"
                )
        elif spec.schedule is not None or spec.attention is not None:
            found.append(f"{where} ({spec.kind.value}) does not denoise but has a schedule")
        for c in spec.components:
            if c not in card.components:
                found.append(f"{where} needs component {c!r}, which the card lacks")
        for u in spec.uses:
            if u not in card.loops:
                found.append(f"{where} uses loop {u!r}, which the card lacks")
        for i in sorted(spec.inputs - INPUT_KINDS):
            found.append(f"{where} absorbs unknown input {i!r}; known: {sorted(INPUT_KINDS)}")
        for i in sorted(spec.inputs & INPUT_HOOKS.keys()):
            hooked = any(
                INPUT_HOOKS[i] in card.components[c].conditioning
                for c in spec.components
                if c in card.components
            )
            if not hooked:
                found.append(
                    f"{where} absorbs {i!r} but none of its components "
                    f"{list(spec.components)} has a {INPUT_HOOKS[i]!r} hook"
                )
    return found


def _decoder_problems(card: CheckedCard) -> list[str]:
    found = []
    codecs = (ComponentKind.VAE, ComponentKind.DECODER)
    for key, spec in card.loops.items():
        if spec.kind is not LoopKind.VAE_DECODE:
            continue
        if len(spec.components) != 1:
            found.append(f"loop {key!r} must name the one component it decodes with")
        elif (c := card.components.get(spec.components[0])) and c.kind not in codecs:
            found.append(
                f"loop {key!r} decodes with {c.component_id!r}, a {c.kind.value}, "
                f"not a vae or decoder"
            )
    return found


def _recipe_problems(card: CheckedCard) -> list[str]:
    r = card.recipe
    found = []
    if not r.method:
        found.append("recipe.method is empty")
    assumed = card.loops.get(r.assumes_loop)
    if assumed is None:
        found.append(
            f"recipe.assumes_loop {r.assumes_loop!r} is not one of the card's "
            f"loops {sorted(card.loops)}"
        )
    elif not assumed.denoises:
        found.append(
            f"recipe.assumes_loop {r.assumes_loop!r} is a {assumed.kind.value} "
            f"loop; a recipe assumes a denoising loop"
        )
    elif assumed.schedule is not None and assumed.schedule.steps != card.default_profile.steps:
        found.append(
            f"default_profile.steps={card.default_profile.steps} but loop "
            f"{r.assumes_loop!r} has {assumed.schedule.steps} timesteps"
        )
    for name in card.precision.allowed:
        if name not in PRECISIONS:
            found.append(f"precision {name!r} is unknown; known: {sorted(PRECISIONS)}")
    if not card.precision.allowed:
        found.append("precision.allowed is empty")
    if r.assumes_precision not in card.precision.allowed:
        found.append(
            f"recipe.assumes_precision {r.assumes_precision!r} is not in "
            f"precision.allowed {list(card.precision.allowed)}"
        )
    if card.parity.level.rank < r.consistency_required.rank:
        found.append(
            f"parity level {card.parity.level.value} is below the recipe's "
            f"consistency_required {r.consistency_required.value}"
        )
    for name, tol in card.parity.tolerances.items():
        if not (math.isfinite(tol) and tol > 0):
            found.append(f"parity tolerance {name!r}={tol} must be finite and > 0")
    return found


def _capability_problems(card: CheckedCard) -> list[str]:
    found = []
    servable = card.recipe.assumes_loop in card.loops  # else _recipe_problems reports it
    for cap in sorted(card.capabilities):
        if cap not in CAPABILITIES:
            found.append(f"capability {cap!r} is unknown; known: {sorted(CAPABILITIES)}")
        elif servable and card.loop_for(cap) is None:
            kinds, needed_input = CAPABILITIES[cap]
            extra = f" absorbing {needed_input!r}" if needed_input else ""
            found.append(
                f"capability {cap!r} has no loop that serves it (needs one of "
                f"{sorted(k.value for k in kinds)}{extra}, with the recipe's sampler)"
            )
    return found


def _cache_problems(card: CheckedCard) -> list[str]:
    found = []
    chunk = card.default_profile.chunk_latent_frames
    for key, c in card.caches.items():
        where = f"cache {key!r}"
        if c.component not in card.components:
            found.append(f"{where} belongs to component {c.component!r}, which the card lacks")
        if c.kind is CacheKind.CHUNK_KV:
            if c.window_latent_frames < chunk:
                found.append(
                    f"{where}: window_latent_frames={c.window_latent_frames} cannot "
                    f"hold one chunk of {chunk} latent frames"
                )
            if c.sink_latent_frames < 0:
                found.append(f"{where}: sink_latent_frames={c.sink_latent_frames} < 0")
        elif c.window_latent_frames or c.sink_latent_frames:
            found.append(f"{where} ({c.kind.value}) has KV window/sink frames")
    return found


def _manifest_problems(card: CheckedCard) -> list[str]:
    found = []
    entries = card.checkpoint.components
    for key, e in entries.items():
        where = f"checkpoint component {key!r}"
        if key not in card.components:
            found.append(f"{where} is not among the card's components {sorted(card.components)}")
        if not e.path_hint:
            found.append(f"{where} has no path_hint")
        for task in sorted((e.required_for | e.optional_for) - card.capabilities):
            found.append(f"{where} names task {task!r}, which is not a capability")
        if e.required_for & e.optional_for:
            found.append(
                f"{where} is both required and optional for "
                f"{sorted(e.required_for & e.optional_for)}"
            )
        if not (e.required_for or e.optional_for):
            found.append(f"{where} is neither required nor optional for any task")
    if card.weights is not WeightsKind.RANDOM:
        for key in sorted(set(card.components) - set(entries)):
            found.append(
                f"component {key!r} has {card.weights.value} weights but no "
                f"checkpoint manifest entry"
            )
    return found


def _profile_problems(card: CheckedCard) -> list[str]:
    p = card.default_profile
    found = [
        f"default_profile.{n}={getattr(p, n)} must be >= 1"
        for n in ("fps", "width", "height", "chunk_latent_frames", "steps")
        if getattr(p, n) < 1
    ]
    multiple = card.latent.pixel_multiple
    for name in ("width", "height"):
        if getattr(p, name) % multiple:
            found.append(
                f"default_profile.{name}={getattr(p, name)} is not a multiple of "
                f"{multiple} (VAE stride x patch)"
            )
    for width, height in card.compiled_sizes:
        if min(width, height) < multiple or width % multiple or height % multiple:
            found.append(
                f"compiled_sizes entry {width}x{height} is not a positive multiple of "
                f"{multiple} (VAE stride x patch)"
            )
    return found
