"""ModelCard: what a model is, which loops serve it, and what its weights assume
(docs/architecture.md §7).

A card is pure data (no torch at import) and is checked twice:

- ``card.validate()`` runs before any weight loads and raises one ``CardError`` listing every
  inconsistency it finds (a recipe that assumes an unknown loop, a capability no loop serves,
  a manifest entry for a component the card does not declare, ...): ``card_problems``
  (``models.card.checks``, one function per concern).
- ``card.check_serving(loop_id, precision)`` runs when a loop is about to be bound to loaded
  weights and raises ``RecipeMismatchError`` naming both the requested loop/precision and the
  ones the recipe assumes. This is the teeth of ``RecipeSpec``: a 4-step distilled checkpoint
  cannot silently run under a 50-step sampler, nor a bf16 recipe under fp16.

The checks read a card through a protocol of its fields (``CheckedCard``), so their module
imports nothing of this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from models.card.checks import card_problems
from models.card.errors import CardError, ProfileError, RecipeMismatchError
from models.card.manifest import CheckpointManifest
from models.card.parallel import ParallelPlan
from models.card.profile import LatentSpec, Profile
from models.card.recipe import ParitySpec, PrecisionContract, RecipeSpec
from models.card.specs import CacheContract, ComponentSpec, LoopSpec, ScheduleSpec
from models.card.ui import CardUI
from models.card.vocabulary import (
    CAPABILITIES,
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
