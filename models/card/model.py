"""ModelCard: what a model is, which loops serve it, and what its weights assume
(docs/architecture.md §7), and the cross-reference checks ``validate`` runs.

A card is pure data (no torch at import) and is checked twice:

- ``card.validate()`` runs before any weight loads and raises one ``CardError`` listing every
  inconsistency it finds (a recipe that assumes an unknown loop, a capability no loop serves,
  a manifest entry for a component the card does not declare, ...): ``card_problems``, one
  function per concern, below the class.
- ``card.check_serving(loop_id, precision)`` runs when a loop is about to be bound to loaded
  weights and raises ``RecipeMismatchError`` naming both the requested loop/precision and the
  ones the recipe assumes. This is the teeth of ``RecipeSpec``: a 4-step distilled checkpoint
  cannot silently run under a 50-step sampler, nor a bf16 recipe under fp16.

The checks live with the class they check: they read every field of a card, and the card's
``validate`` runs them, so either module importing the other was a circle.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from models.card.errors import CardError, ProfileError, RecipeMismatchError
from models.card.manifest import CheckpointManifest
from models.card.parallel import ParallelPlan
from models.card.profile import LatentSpec, Profile
from models.card.recipe import ParitySpec, PrecisionContract, RecipeSpec
from models.card.specs import CacheContract, ComponentSpec, LoopSpec, ScheduleSpec
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
    coerce,
    frozen_mapping,
)

# a session's decoder option -> the component kind that decodes it
DECODER_KINDS: dict[str, ComponentKind] = {"full": ComponentKind.VAE, "tiny": ComponentKind.DECODER}

__all__ = ["DECODER_KINDS", "ModelCard", "card_problems"]


@dataclass(frozen=True, slots=True)
class ModelCard:
    """A model: its components, loops, capabilities, the recipe its weights come from, parity,
    caches, precision and checkpoint manifest, and what a user interface shows of it (``ui``:
    example prompts and controls). Immutable; mappings are read-only views.

    Construction coerces enum fields (a bad enum value raises ``CardError`` at once);
    ``validate()`` checks cross-references. ``weights`` says where weights come from:
    ``random`` cards generate noise and say so in their description.
    """

    model_id: str
    family: str
    description: str
    components: Mapping[str, ComponentSpec]
    loops: Mapping[str, LoopSpec]
    capabilities: frozenset[str]
    recipe: RecipeSpec
    parity: ParitySpec
    caches: Mapping[str, CacheContract]
    precision: PrecisionContract
    checkpoint: CheckpointManifest
    default_profile: Profile
    latent: LatentSpec
    weights: WeightsKind
    weights_version: str
    ui: CardUI = field(default_factory=CardUI)
    # how one instance spreads over a node's GPUs (models/card/parallel.py); --gpus overrides
    parallel: ParallelPlan = field(default_factory=ParallelPlan)
    # (width, height) sizes served compiled besides the default profile's: the warm-up compiles
    # each at the card's chunk size; a request at any other size runs eager (models/compiled_set.py)
    compiled_sizes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled_sizes", tuple(tuple(s) for s in self.compiled_sizes))
        for name in ("components", "loops", "caches"):
            object.__setattr__(self, name, frozen_mapping(getattr(self, name)))
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))
        object.__setattr__(self, "weights", coerce(WeightsKind, self.weights, "weights"))

    # ---------------------------------------------------------------------------------------
    # checks

    def validate(self) -> ModelCard:
        """Raise ``CardError`` listing every inconsistency; return ``self`` when there is none."""
        problems = card_problems(self)
        if problems:
            raise CardError(problems, self.model_id)
        return self

    def check_serving(
        self, loop_id: str, precision: str, schedule: ScheduleSpec | None = None
    ) -> LoopSpec:
        """Return the LoopSpec for ``loop_id`` if the recipe's weights are valid under it at
        ``precision`` (and, for a denoising loop, under ``schedule`` when the request overrides
        the card's); raise ``RecipeMismatchError`` otherwise.

        A denoising loop is valid when its sampler (attention mode + schedule) equals that of
        ``recipe.assumes_loop``; helper loops (VAE decode, text encode, KV recache) do not
        sample, so only the precision binds them.
        """
        r = self.recipe

        def mismatch(reason: str) -> RecipeMismatchError:
            return RecipeMismatchError(
                self.model_id,
                requested_loop=loop_id,
                requested_precision=precision,
                assumed_loop=r.assumes_loop,
                assumed_precision=r.assumes_precision,
                reason=reason,
            )

        spec = self.loops.get(loop_id)
        if spec is None:
            raise mismatch(f"the card has no loop {loop_id!r}; its loops: {sorted(self.loops)}")
        if precision not in self.precision.allowed:
            raise mismatch(
                f"precision {precision!r} is not among the card's allowed "
                f"{list(self.precision.allowed)}"
            )
        if spec.denoises:
            assumed = self._assumed_loop()
            requested = replace(spec, schedule=schedule) if schedule is not None else spec
            if requested.sampler() != assumed.sampler():
                raise mismatch(
                    f"requested {requested.describe()}, recipe {r.method!r} "
                    f"assumes {assumed.describe()}"
                )
        return spec

    @property
    def decoder_component(self) -> str:
        """The component the loops decode latents with: the one the card's ``vae_decode`` loop
        names - its full VAE, or a decode-only codec (``ComponentKind.DECODER``, e.g. a tiny
        streaming decoder). ``"vae"`` for a card without a decode loop."""
        for spec in self.loops.values():
            if spec.kind is LoopKind.VAE_DECODE and spec.components:
                return spec.components[0]
        return "vae"

    @property
    def decoders(self) -> tuple[str, ...]:
        """The decoders a session may pick (``SessionRequest.decoder``): ``"full"`` where the
        card has a full VAE, ``"tiny"`` where it has a decode-only codec (a tiny streaming
        decoder), in that order. A loaded instance's card lists only those it loaded."""
        kinds = {spec.kind for spec in self.components.values()}
        return tuple(name for name, kind in DECODER_KINDS.items() if kind in kinds)

    @property
    def default_decoder(self) -> str:
        """The decoder of a session that names none: the one ``decoder_component`` is."""
        spec = self.components.get(self.decoder_component)
        return "tiny" if spec is not None and spec.kind is ComponentKind.DECODER else "full"

    def decoder_component_for(self, decoder: str) -> str:
        """The component id of ``decoder`` (``"full"`` | ``"tiny"``): the default one's is
        ``decoder_component``; ``KeyError`` naming the card's decoders for one it lacks."""
        if decoder == self.default_decoder:
            return self.decoder_component
        kind = DECODER_KINDS.get(decoder)
        for key, spec in sorted(self.components.items()):
            if kind is not None and spec.kind is kind:
                return key
        raise KeyError(
            f"model {self.model_id!r} has no {decoder!r} decoder; its decoders: "
            f"{list(self.decoders)}"
        )

    def loop_for(self, capability: str) -> LoopSpec | None:
        """The denoising loop that serves ``capability`` under the recipe, or None.

        Prefers the recipe's assumed loop (a causal distilled card serves text-to-video with
        ``chunk_rollout``); otherwise the first sampler-compatible loop of a serving kind.
        """
        if capability not in self.capabilities or capability not in CAPABILITIES:
            return None
        kinds, needed_input = CAPABILITIES[capability]
        assumed = self._assumed_loop()
        candidates = [assumed] + [s for i, s in sorted(self.loops.items()) if i != assumed.loop_id]
        for spec in candidates:
            if (
                spec.kind in kinds
                and (not needed_input or needed_input in spec.inputs)
                and spec.sampler() == assumed.sampler()
            ):
                return spec
        return None

    def with_chunk_frames(self, chunk_latent_frames: int) -> ModelCard:
        """This card serving chunks of ``chunk_latent_frames`` latent frames (the latency mode:
        1 -> 4 video frames on a Wan VAE); validated (the K/V window must leave history)."""
        profile = replace(self.default_profile, chunk_latent_frames=chunk_latent_frames)
        return replace(self, default_profile=profile).validate()

    def resolve_profile(
        self, *, fps: int | None = None, width: int | None = None, height: int | None = None
    ) -> Profile:
        """The default profile with the given overrides; ``ProfileError`` names a bad field."""
        profile = replace(
            self.default_profile,
            **{
                k: v
                for k, v in (("fps", fps), ("width", width), ("height", height))
                if v is not None
            },
        )
        multiple = self.latent.pixel_multiple
        for name in ("width", "height"):
            value = getattr(profile, name)
            if value < multiple or value % multiple:
                raise ProfileError(
                    self.model_id, name, f"{value} must be a positive multiple of {multiple}"
                )
        if profile.fps < 1:
            raise ProfileError(self.model_id, "fps", f"{profile.fps} must be >= 1")
        return profile

    # ---------------------------------------------------------------------------------------
    # public forms

    def to_public(self) -> dict[str, object]:
        """The JSON-able description served by ``GET /v1/models``."""
        r = self.recipe
        return {
            "id": self.model_id,
            "family": self.family,
            "description": self.description,
            "capabilities": sorted(self.capabilities),
            "recipe": {
                "method": r.method,
                "parents": list(r.parents),
                "data_contract": r.data_contract,
                "assumes_loop": r.assumes_loop,
                "assumes_precision": r.assumes_precision,
                "consistency_required": r.consistency_required.value,
            },
            "default_profile": self.default_profile.as_dict(),
            "compiled_sizes": [list(size) for size in self.compiled_sizes],
            "weights": self.weights.value,
            "weights_version": self.weights_version,
            "loops": sorted(self.loops),
            "precision": {"allowed": list(self.precision.allowed)},
            "parity": {
                "level": self.parity.level.value,
                "tolerances": dict(self.parity.tolerances),
            },
            "components": {
                c: {"kind": s.kind.value, "preset": s.preset}
                for c, s in sorted(self.components.items())
            },
            "examples": list(self.ui.examples),
            "controls": [c.to_public() for c in self.ui.controls],
            "decoders": list(self.decoders),
            "default_decoder": self.default_decoder,
        }

    def summary_line(self) -> str:
        """One line for ``dreamrt models``."""
        p = self.default_profile
        r = self.recipe
        return (
            f"{self.model_id}  weights={self.weights.value}  "
            f"recipe={r.method}:{r.assumes_loop}@{r.assumes_precision}  "
            f"profile={p.width}x{p.height}@{p.fps}fps chunk={p.chunk_latent_frames} "
            f"steps={p.steps}  capabilities={','.join(sorted(self.capabilities))}"
        )

    # ---------------------------------------------------------------------------------------

    def _assumed_loop(self) -> LoopSpec:
        spec = self.loops.get(self.recipe.assumes_loop)
        if spec is None:  # only on a card that skipped validate()
            raise CardError(
                [
                    f"recipe.assumes_loop {self.recipe.assumes_loop!r} is not one of "
                    f"the card's loops {sorted(self.loops)}"
                ],
                self.model_id,
            )
        return spec


# -------------------------------------------------------------------------------------------
# the cross-reference checks ``validate`` runs: one function per concern, each returning the
# problems it found as sentences naming the field and what it should be


_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def card_problems(card: ModelCard) -> list[str]:
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


def _identity_problems(card: ModelCard) -> list[str]:
    found = []
    if not _MODEL_ID.match(card.model_id):
        found.append(f"model_id {card.model_id!r} must match {_MODEL_ID.pattern}")
    for name in ("family", "description", "weights_version"):
        if not getattr(card, name).strip():
            found.append(f"{name} is empty")
    if card.weights is WeightsKind.RANDOM and "random" not in card.description.lower():
        found.append("a random-weights card must say 'random' in its description")
    return found


def _component_problems(card: ModelCard) -> list[str]:
    found = []
    for key, spec in card.components.items():
        if key != spec.component_id:
            found.append(f"components[{key!r}] has component_id {spec.component_id!r}")
        if not spec.preset:
            found.append(f"component {key!r} names no preset")
        if spec.precision is not None and spec.precision not in PRECISIONS:
            found.append(f"component {key!r} pins unknown precision {spec.precision!r}")
    return found


def _loop_problems(card: ModelCard) -> list[str]:
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


def _decoder_problems(card: ModelCard) -> list[str]:
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


def _recipe_problems(card: ModelCard) -> list[str]:
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


def _capability_problems(card: ModelCard) -> list[str]:
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


def _cache_problems(card: ModelCard) -> list[str]:
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


def _manifest_problems(card: ModelCard) -> list[str]:
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


def _profile_problems(card: ModelCard) -> list[str]:
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
