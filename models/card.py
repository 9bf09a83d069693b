"""ModelCard: what a model is, which loops serve it, and what its weights assume (seed §4, §9).

A card is pure data (no torch at import) and is checked twice:

- ``card.validate()`` runs before any weight loads and raises one ``CardError`` listing every
  inconsistency it finds (a recipe that assumes an unknown loop, a capability no loop serves,
  a manifest entry for a component the card does not declare, ...).
- ``card.check_serving(loop_id, precision)`` runs when a loop is about to be bound to loaded
  weights and raises ``RecipeMismatchError`` naming both the requested loop/precision and the
  ones the recipe assumes. This is the teeth of ``RecipeSpec``: a 4-step distilled checkpoint
  cannot silently run under a 50-step sampler, nor a bf16 recipe under fp16.

Vocabulary that is closed (component, loop, cache kinds, weights provenance, parity levels,
checkpoint formats) is a ``str`` enum; vocabulary that families extend (capabilities,
precisions, live input kinds) is a table in this module, so a typo is still a ``CardError``.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

__all__ = [
    "CAPABILITIES", "INPUT_KINDS", "PRECISIONS", "AttentionMode", "CacheContract", "CacheKind",
    "CardError", "CheckpointFormat", "CheckpointManifest", "ComponentEntry", "ComponentKind",
    "ComponentSpec", "KVUpdate", "LatentSpec", "LoopKind", "LoopSpec", "ModelCard", "ParityLevel",
    "ParitySpec", "PrecisionContract", "Profile", "ProfileError", "RecipeMismatchError",
    "RecipeSpec", "ScheduleSpec", "WeightsKind",
]


class CardError(ValueError):
    """A card is inconsistent; ``problems`` lists every finding, the message joins them."""

    def __init__(self, problems: list[str] | tuple[str, ...], model_id: str = "") -> None:
        self.model_id = model_id
        self.problems = tuple(problems)
        where = f"model card {model_id!r}" if model_id else "model card part"
        super().__init__(f"{where} is invalid: " + "; ".join(self.problems))


class RecipeMismatchError(ValueError):
    """A card was asked to serve under a loop or precision its recipe does not assume."""

    def __init__(self, model_id: str, *, requested_loop: str, requested_precision: str,
                 assumed_loop: str, assumed_precision: str, reason: str) -> None:
        self.model_id = model_id
        self.requested_loop = requested_loop
        self.requested_precision = requested_precision
        self.assumed_loop = assumed_loop
        self.assumed_precision = assumed_precision
        self.reason = reason
        super().__init__(
            f"model {model_id!r} cannot be served under loop {requested_loop!r} at "
            f"{requested_precision!r}: its recipe assumes loop {assumed_loop!r} at "
            f"{assumed_precision!r} ({reason})"
        )


class ProfileError(ValueError):
    """A requested profile field is invalid for the card (``field`` names it)."""

    def __init__(self, model_id: str, field_name: str, message: str) -> None:
        self.model_id = model_id
        self.field = field_name
        super().__init__(f"model {model_id!r}: {field_name}: {message}")


# --------------------------------------------------------------------------------------------
# Vocabulary


class ComponentKind(str, enum.Enum):
    DIT = "dit"
    VAE = "vae"
    TEXT_ENCODER = "text_encoder"
    TOKENIZER = "tokenizer"


class LoopKind(str, enum.Enum):
    CHUNK_ROLLOUT = "chunk_rollout"  # causal, chunked, KV-cached: sessions
    DIFFUSION_DENOISE = "diffusion_denoise"  # whole clip at once: jobs
    KV_RECACHE = "kv_recache"  # recompute the KV window under a new prompt
    VAE_DECODE = "vae_decode"
    TEXT_ENCODE = "text_encode"


DENOISING_LOOPS = frozenset({LoopKind.CHUNK_ROLLOUT, LoopKind.DIFFUSION_DENOISE})


class AttentionMode(str, enum.Enum):
    BIDIRECTIONAL = "bidirectional"
    CHUNK_CAUSAL = "chunk_causal"


class KVUpdate(str, enum.Enum):
    """How a chunk's K/V reaches the cache of a chunk-causal loop (the recipe trained with it).

    CLEAN: an extra DiT pass over the finished chunk at t = 0 (Self-Forcing, CausVid,
    LongLive). LAST_STEP: the last denoising step writes the K/V of its own input (noisy at the
    last sigma): one forward less per chunk, a different context for the next chunk.
    """

    CLEAN = "clean"
    LAST_STEP = "last_step"


class CacheKind(str, enum.Enum):
    CHUNK_KV = "chunk_kv"  # per session: rolling window + sink frames
    FEATURE = "feature"  # shared: content-hash keyed (text embeddings)
    DECODER_FEATURE = "decoder_feature"  # per session: causal VAE decoder state


class WeightsKind(str, enum.Enum):
    RANDOM = "random"  # seeded init, no checkpoint: tests and development, shows noise
    TRAINED = "trained"  # shipped with the repository
    EXTERNAL = "external"  # trained, supplied by the operator (no downloads here)


class CheckpointFormat(str, enum.Enum):
    DIFFUSERS = "diffusers"
    ORIGINAL = "original"


class ParityLevel(str, enum.Enum):
    """Consistency ladder (seed §9.2); ordered, C0 weakest."""

    C0 = "C0"  # component parity
    C1 = "C1"  # loop parity, fixed seed
    C2 = "C2"  # behavioural identity (train forward == serve forward)
    C3 = "C3"  # distribution parity
    C4 = "C4"  # artifact quality

    @property
    def rank(self) -> int:
        return int(self.value[1:])


PRECISIONS = frozenset({"fp32", "bf16", "fp16", "fp8_e4m3", "nvfp4"})
INPUT_KINDS = frozenset({"prompt", "cut", "action", "audio"})

# capability -> (loop kinds that can serve it, live input such a loop must absorb or "")
CAPABILITIES: Mapping[str, tuple[frozenset[LoopKind], str]] = MappingProxyType({
    "session.realtime": (frozenset({LoopKind.CHUNK_ROLLOUT}), ""),
    "text_to_video": (DENOISING_LOOPS, ""),
    "text_to_image": (DENOISING_LOOPS, ""),
    "prompt.switch": (frozenset({LoopKind.CHUNK_ROLLOUT}), "prompt"),
    "prompt.cut": (frozenset({LoopKind.CHUNK_ROLLOUT}), "cut"),
    "input.action": (frozenset({LoopKind.CHUNK_ROLLOUT}), "action"),
    "input.audio": (frozenset({LoopKind.CHUNK_ROLLOUT}), "audio"),
})

# live inputs that need a conditioning hook on a component the loop uses
_INPUT_HOOKS = {"action": "action", "audio": "audio"}
_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def _coerce(enum_type: type[enum.Enum], value: Any, what: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        known = [m.value for m in enum_type]
        raise CardError([f"{what}={value!r} is not one of {known}"]) from None


def _freeze(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


# --------------------------------------------------------------------------------------------
# Parts of a card


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
        object.__setattr__(self, "kind", _coerce(ComponentKind, self.kind, "component kind"))
        object.__setattr__(self, "conditioning", frozenset(self.conditioning))


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """Denoising schedule: nominal ``timesteps`` on the ``num_train_timesteps`` grid, highest
    first; the sampler applies ``flow_shift``. ``guidance_scale`` 1.0 means no CFG (distilled
    recipes bake guidance into the weights)."""

    timesteps: tuple[int, ...]
    flow_shift: float
    num_train_timesteps: int = 1000
    guidance_scale: float = 1.0

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
        object.__setattr__(self, "kind", _coerce(LoopKind, self.kind, "loop kind"))
        object.__setattr__(self, "kv_update", _coerce(KVUpdate, self.kv_update, "kv_update"))
        if self.attention is not None:
            object.__setattr__(self, "attention",
                               _coerce(AttentionMode, self.attention, "attention"))
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
        return (f"{self.loop_id} ({att}, timesteps {list(s.timesteps)}, shift {s.flow_shift:g}, "
                f"cfg {s.guidance_scale:g})")


@dataclass(frozen=True, slots=True)
class RecipeSpec:
    """What produced the weights (seed §4.2). ``assumes_loop`` is the loop id whose sampler the
    weights require; ``assumes_precision`` the precision the recipe baked in;
    ``consistency_required`` the lowest parity level under which its outputs are valid."""

    method: str
    parents: tuple[str, ...]
    data_contract: str
    assumes_loop: str
    assumes_precision: str
    consistency_required: ParityLevel
    training_command: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(self.parents))
        object.__setattr__(self, "consistency_required",
                           _coerce(ParityLevel, self.consistency_required, "consistency_required"))


@dataclass(frozen=True, slots=True)
class ParitySpec:
    """The parity level the card's implementation is tested to, and the tolerances (max relative
    error per named check, e.g. ``"dit_vs_reference"``) its tests hold."""

    level: ParityLevel
    tolerances: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", _coerce(ParityLevel, self.level, "parity level"))
        object.__setattr__(self, "tolerances", _freeze(self.tolerances))


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
        object.__setattr__(self, "kind", _coerce(CacheKind, self.kind, "cache kind"))

    @property
    def capacity_latent_frames(self) -> int:
        return self.window_latent_frames + self.sink_latent_frames


@dataclass(frozen=True, slots=True)
class PrecisionContract:
    """Precisions the card may be served under; each must keep the recipe's outputs valid
    (e.g. fp32 widens a bf16 recipe; fp16 does not)."""

    allowed: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", tuple(self.allowed))


@dataclass(frozen=True, slots=True)
class ComponentEntry:
    """Where one component's weights live under the checkpoint root, in which format, and for
    which tasks (capabilities) it is required or merely optional."""

    path_hint: str
    format: CheckpointFormat
    required_for: frozenset[str] = frozenset()
    optional_for: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", _coerce(CheckpointFormat, self.format, "format"))
        object.__setattr__(self, "required_for", frozenset(self.required_for))
        object.__setattr__(self, "optional_for", frozenset(self.optional_for))


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    """Explicit components of a checkpoint (no name-detector guessing)."""

    components: Mapping[str, ComponentEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", _freeze(self.components))

    def required_for(self, task: str) -> tuple[str, ...]:
        """Component ids that must be present to run ``task``."""
        return tuple(sorted(c for c, e in self.components.items() if task in e.required_for))


@dataclass(frozen=True, slots=True)
class LatentSpec:
    """Latent geometry: channels, VAE strides and the DiT patch (t, h, w)."""

    channels: int
    temporal_stride: int
    spatial_stride: int
    patch: tuple[int, int, int]

    @property
    def pixel_multiple(self) -> int:
        """Width and height must be multiples of this (VAE stride x DiT patch)."""
        return self.spatial_stride * max(self.patch[1], self.patch[2])

    def tokens_per_latent_frame(self, width: int, height: int) -> int:
        return ((height // self.spatial_stride // self.patch[1])
                * (width // self.spatial_stride // self.patch[2]))

    def pixel_frames(self, latent_frames: int, *, includes_first: bool) -> int:
        """Video frames a causal VAE decodes from ``latent_frames``; the stream's first latent
        frame decodes to one frame, every later one to ``temporal_stride`` frames."""
        if includes_first and latent_frames > 0:
            return 1 + (latent_frames - 1) * self.temporal_stride
        return latent_frames * self.temporal_stride


@dataclass(frozen=True, slots=True)
class Profile:
    """Serving geometry: ``fps`` frames per second, pixel ``width``/``height``, latent frames
    per chunk, denoising ``steps``."""

    fps: int
    width: int
    height: int
    chunk_latent_frames: int
    steps: int

    def as_dict(self) -> dict[str, int]:
        return {"fps": self.fps, "width": self.width, "height": self.height,
                "chunk_latent_frames": self.chunk_latent_frames, "steps": self.steps}


# --------------------------------------------------------------------------------------------
# The card


@dataclass(frozen=True, slots=True)
class ModelCard:
    """A model: its components, loops, capabilities, the recipe its weights come from, parity,
    caches, precision and checkpoint manifest. Immutable; mappings are read-only views.

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

    def __post_init__(self) -> None:
        for name in ("components", "loops", "caches"):
            object.__setattr__(self, name, _freeze(getattr(self, name)))
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))
        object.__setattr__(self, "weights", _coerce(WeightsKind, self.weights, "weights"))

    # ---------------------------------------------------------------------------------------
    # checks

    def validate(self) -> ModelCard:
        """Raise ``CardError`` listing every inconsistency; return ``self`` when there is none."""
        problems = [
            *self._identity_problems(), *self._component_problems(), *self._loop_problems(),
            *self._recipe_problems(), *self._capability_problems(), *self._cache_problems(),
            *self._manifest_problems(), *self._profile_problems(),
        ]
        if problems:
            raise CardError(problems, self.model_id)
        return self

    def check_serving(self, loop_id: str, precision: str,
                      schedule: ScheduleSpec | None = None) -> LoopSpec:
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
                self.model_id, requested_loop=loop_id, requested_precision=precision,
                assumed_loop=r.assumes_loop, assumed_precision=r.assumes_precision, reason=reason)

        spec = self.loops.get(loop_id)
        if spec is None:
            raise mismatch(f"the card has no loop {loop_id!r}; its loops: {sorted(self.loops)}")
        if precision not in self.precision.allowed:
            raise mismatch(f"precision {precision!r} is not among the card's allowed "
                           f"{list(self.precision.allowed)}")
        if spec.denoises:
            assumed = self._assumed_loop()
            requested = replace(spec, schedule=schedule) if schedule is not None else spec
            if requested.sampler() != assumed.sampler():
                raise mismatch(f"requested {requested.describe()}, recipe {r.method!r} "
                               f"assumes {assumed.describe()}")
        return spec

    def loop_for(self, capability: str) -> LoopSpec | None:
        """The denoising loop that serves ``capability`` under the recipe, or None.

        Prefers the recipe's assumed loop (a causal distilled card serves text-to-video with
        ``chunk_rollout``); otherwise the first sampler-compatible loop of a serving kind.
        """
        if capability not in self.capabilities or capability not in CAPABILITIES:
            return None
        kinds, needed_input = CAPABILITIES[capability]
        assumed = self._assumed_loop()
        candidates = [assumed] + [s for i, s in sorted(self.loops.items())
                                  if i != assumed.loop_id]
        for spec in candidates:
            if (spec.kind in kinds and (not needed_input or needed_input in spec.inputs)
                    and spec.sampler() == assumed.sampler()):
                return spec
        return None

    def resolve_profile(self, *, fps: int | None = None, width: int | None = None,
                        height: int | None = None) -> Profile:
        """The default profile with the given overrides; ``ProfileError`` names a bad field."""
        profile = replace(self.default_profile, **{
            k: v for k, v in (("fps", fps), ("width", width), ("height", height))
            if v is not None})
        multiple = self.latent.pixel_multiple
        for name in ("width", "height"):
            value = getattr(profile, name)
            if value < multiple or value % multiple:
                raise ProfileError(self.model_id, name,
                                   f"{value} must be a positive multiple of {multiple}")
        if profile.fps < 1:
            raise ProfileError(self.model_id, "fps", f"{profile.fps} must be >= 1")
        return profile

    # ---------------------------------------------------------------------------------------
    # public forms

    def to_public(self) -> dict[str, Any]:
        """The JSON-able description served by ``GET /v1/models``."""
        r = self.recipe
        return {
            "id": self.model_id,
            "family": self.family,
            "description": self.description,
            "capabilities": sorted(self.capabilities),
            "recipe": {
                "method": r.method, "parents": list(r.parents),
                "data_contract": r.data_contract, "assumes_loop": r.assumes_loop,
                "assumes_precision": r.assumes_precision,
                "consistency_required": r.consistency_required.value,
            },
            "default_profile": self.default_profile.as_dict(),
            "weights": self.weights.value,
            "weights_version": self.weights_version,
            "loops": sorted(self.loops),
            "precision": {"allowed": list(self.precision.allowed)},
            "parity": {"level": self.parity.level.value,
                       "tolerances": dict(self.parity.tolerances)},
            "components": {c: {"kind": s.kind.value, "preset": s.preset}
                           for c, s in sorted(self.components.items())},
        }

    def summary_line(self) -> str:
        """One line for ``dreamrt models``."""
        p = self.default_profile
        r = self.recipe
        return (f"{self.model_id}  weights={self.weights.value}  "
                f"recipe={r.method}:{r.assumes_loop}@{r.assumes_precision}  "
                f"profile={p.width}x{p.height}@{p.fps}fps chunk={p.chunk_latent_frames} "
                f"steps={p.steps}  capabilities={','.join(sorted(self.capabilities))}")

    # ---------------------------------------------------------------------------------------
    # validation, one concern each

    def _assumed_loop(self) -> LoopSpec:
        spec = self.loops.get(self.recipe.assumes_loop)
        if spec is None:  # only on a card that skipped validate()
            raise CardError([f"recipe.assumes_loop {self.recipe.assumes_loop!r} is not one of "
                             f"the card's loops {sorted(self.loops)}"], self.model_id)
        return spec

    def _identity_problems(self) -> list[str]:
        found = []
        if not _MODEL_ID.match(self.model_id):
            found.append(f"model_id {self.model_id!r} must match {_MODEL_ID.pattern}")
        for name in ("family", "description", "weights_version"):
            if not getattr(self, name).strip():
                found.append(f"{name} is empty")
        if self.weights is WeightsKind.RANDOM and "random" not in self.description.lower():
            found.append("a random-weights card must say 'random' in its description")
        return found

    def _component_problems(self) -> list[str]:
        found = []
        for key, spec in self.components.items():
            if key != spec.component_id:
                found.append(f"components[{key!r}] has component_id {spec.component_id!r}")
            if not spec.preset:
                found.append(f"component {key!r} names no preset")
            if spec.precision is not None and spec.precision not in PRECISIONS:
                found.append(f"component {key!r} pins unknown precision {spec.precision!r}")
        return found

    def _loop_problems(self) -> list[str]:
        found = []
        for key, spec in self.loops.items():
            where = f"loop {key!r}"
            if key != spec.loop_id:
                found.append(f"loops[{key!r}] has loop_id {spec.loop_id!r}")
            if spec.denoises:
                if spec.schedule is None or spec.attention is None:
                    found.append(f"{where} denoises but declares no schedule and attention")
                else:
                    found.extend(f"{where}: {p}" for p in spec.schedule.problems())
                if (spec.kind is LoopKind.CHUNK_ROLLOUT
                        and spec.attention is not AttentionMode.CHUNK_CAUSAL):
                    found.append(f"{where} is a chunk_rollout but its attention is "
                                 f"{spec.attention.value}, not chunk_causal")
            elif spec.schedule is not None or spec.attention is not None:
                found.append(f"{where} ({spec.kind.value}) does not denoise but has a schedule")
            for c in spec.components:
                if c not in self.components:
                    found.append(f"{where} needs component {c!r}, which the card lacks")
            for u in spec.uses:
                if u not in self.loops:
                    found.append(f"{where} uses loop {u!r}, which the card lacks")
            for i in sorted(spec.inputs - INPUT_KINDS):
                found.append(f"{where} absorbs unknown input {i!r}; known: {sorted(INPUT_KINDS)}")
            for i in sorted(spec.inputs & _INPUT_HOOKS.keys()):
                hooked = any(_INPUT_HOOKS[i] in self.components[c].conditioning
                             for c in spec.components if c in self.components)
                if not hooked:
                    found.append(f"{where} absorbs {i!r} but none of its components "
                                 f"{list(spec.components)} has a {_INPUT_HOOKS[i]!r} hook")
        return found

    def _recipe_problems(self) -> list[str]:
        r = self.recipe
        found = []
        if not r.method:
            found.append("recipe.method is empty")
        assumed = self.loops.get(r.assumes_loop)
        if assumed is None:
            found.append(f"recipe.assumes_loop {r.assumes_loop!r} is not one of the card's "
                         f"loops {sorted(self.loops)}")
        elif not assumed.denoises:
            found.append(f"recipe.assumes_loop {r.assumes_loop!r} is a {assumed.kind.value} "
                         f"loop; a recipe assumes a denoising loop")
        elif assumed.schedule is not None and assumed.schedule.steps != self.default_profile.steps:
            found.append(f"default_profile.steps={self.default_profile.steps} but loop "
                         f"{r.assumes_loop!r} has {assumed.schedule.steps} timesteps")
        for name in self.precision.allowed:
            if name not in PRECISIONS:
                found.append(f"precision {name!r} is unknown; known: {sorted(PRECISIONS)}")
        if not self.precision.allowed:
            found.append("precision.allowed is empty")
        if r.assumes_precision not in self.precision.allowed:
            found.append(f"recipe.assumes_precision {r.assumes_precision!r} is not in "
                         f"precision.allowed {list(self.precision.allowed)}")
        if self.parity.level.rank < r.consistency_required.rank:
            found.append(f"parity level {self.parity.level.value} is below the recipe's "
                         f"consistency_required {r.consistency_required.value}")
        for name, tol in self.parity.tolerances.items():
            if not (math.isfinite(tol) and tol > 0):
                found.append(f"parity tolerance {name!r}={tol} must be finite and > 0")
        return found

    def _capability_problems(self) -> list[str]:
        found = []
        servable = self.recipe.assumes_loop in self.loops  # else _recipe_problems reports it
        for cap in sorted(self.capabilities):
            if cap not in CAPABILITIES:
                found.append(f"capability {cap!r} is unknown; known: {sorted(CAPABILITIES)}")
            elif servable and self.loop_for(cap) is None:
                kinds, needed_input = CAPABILITIES[cap]
                extra = f" absorbing {needed_input!r}" if needed_input else ""
                found.append(f"capability {cap!r} has no loop that serves it (needs one of "
                             f"{sorted(k.value for k in kinds)}{extra}, with the recipe's sampler)")
        return found

    def _cache_problems(self) -> list[str]:
        found = []
        chunk = self.default_profile.chunk_latent_frames
        for key, c in self.caches.items():
            where = f"cache {key!r}"
            if c.component not in self.components:
                found.append(f"{where} belongs to component {c.component!r}, which the card lacks")
            if c.kind is CacheKind.CHUNK_KV:
                if c.window_latent_frames < chunk:
                    found.append(f"{where}: window_latent_frames={c.window_latent_frames} cannot "
                                 f"hold one chunk of {chunk} latent frames")
                if c.sink_latent_frames < 0:
                    found.append(f"{where}: sink_latent_frames={c.sink_latent_frames} < 0")
            elif c.window_latent_frames or c.sink_latent_frames:
                found.append(f"{where} ({c.kind.value}) has KV window/sink frames")
        return found

    def _manifest_problems(self) -> list[str]:
        found = []
        entries = self.checkpoint.components
        for key, e in entries.items():
            where = f"checkpoint component {key!r}"
            if key not in self.components:
                found.append(f"{where} is not among the card's components "
                             f"{sorted(self.components)}")
            if not e.path_hint:
                found.append(f"{where} has no path_hint")
            for task in sorted((e.required_for | e.optional_for) - self.capabilities):
                found.append(f"{where} names task {task!r}, which is not a capability")
            if e.required_for & e.optional_for:
                found.append(f"{where} is both required and optional for "
                             f"{sorted(e.required_for & e.optional_for)}")
            if not (e.required_for or e.optional_for):
                found.append(f"{where} is neither required nor optional for any task")
        if self.weights is not WeightsKind.RANDOM:
            for key in sorted(set(self.components) - set(entries)):
                found.append(f"component {key!r} has {self.weights.value} weights but no "
                             f"checkpoint manifest entry")
        return found

    def _profile_problems(self) -> list[str]:
        p = self.default_profile
        found = [f"default_profile.{n}={getattr(p, n)} must be >= 1"
                 for n in ("fps", "width", "height", "chunk_latent_frames", "steps")
                 if getattr(p, n) < 1]
        multiple = self.latent.pixel_multiple
        for name in ("width", "height"):
            if getattr(p, name) % multiple:
                found.append(f"default_profile.{name}={getattr(p, name)} is not a multiple of "
                             f"{multiple} (VAE stride x patch)")
        return found
