"""The ModelCard and its parts: what a model is, which loops serve it, what its weights assume.

One noun a module: ``errors`` (the three errors), ``vocabulary`` (enums and the
capability/precision/input tables), ``specs`` (components, schedules, loops, caches), ``recipe``
(recipe, parity, precisions), ``manifest`` (the checkpoint manifest), ``profile`` (latent
geometry, serving profile), ``ui`` (example prompts and controls), ``parallel`` (the multi-GPU
plan), ``checks`` (what ``validate`` checks) and ``model`` (the card itself). Every name is
re-exported here, so ``from models.card import X`` is the one import callers need.
"""

from __future__ import annotations

from models.card.errors import CardError, ProfileError, RecipeMismatchError
from models.card.manifest import CheckpointManifest, ComponentEntry
from models.card.model import DECODER_KINDS, ModelCard
from models.card.parallel import ParallelPlan, ParallelPlanError
from models.card.profile import LatentSpec, Profile
from models.card.recipe import ParitySpec, PrecisionContract, RecipeSpec
from models.card.specs import CacheContract, ComponentSpec, LoopSpec, ScheduleSpec
from models.card.ui import CardUI, Control, ControlKind
from models.card.vocabulary import (
    CAPABILITIES,
    DENOISING_LOOPS,
    INPUT_KINDS,
    PRECISIONS,
    AttentionMode,
    CacheKind,
    CheckpointFormat,
    ComponentKind,
    KVUpdate,
    LoopKind,
    ParityLevel,
    WeightsKind,
)

__all__ = [
    "CAPABILITIES",
    "DECODER_KINDS",
    "DENOISING_LOOPS",
    "INPUT_KINDS",
    "PRECISIONS",
    "AttentionMode",
    "CacheContract",
    "CacheKind",
    "CardError",
    "CardUI",
    "CheckpointFormat",
    "CheckpointManifest",
    "ComponentEntry",
    "ComponentKind",
    "ComponentSpec",
    "Control",
    "ControlKind",
    "KVUpdate",
    "LatentSpec",
    "LoopKind",
    "LoopSpec",
    "ModelCard",
    "ParallelPlan",
    "ParallelPlanError",
    "ParityLevel",
    "ParitySpec",
    "PrecisionContract",
    "Profile",
    "ProfileError",
    "RecipeMismatchError",
    "RecipeSpec",
    "ScheduleSpec",
    "WeightsKind",
]
