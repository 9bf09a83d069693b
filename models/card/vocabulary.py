"""The closed vocabulary of model cards: the ``str`` enums, and the tables families extend.

Vocabulary that is closed (component, loop, cache kinds, weights provenance, parity levels,
checkpoint formats) is a ``str`` enum; vocabulary that families extend (capabilities,
precisions, live input kinds) is a table here, so a typo is still a ``CardError``. ``coerce``
turns a string into its enum member at construction, so a card part never holds a bare string.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from models.card.errors import CardError

__all__ = [
    "CAPABILITIES",
    "DENOISING_LOOPS",
    "INPUT_HOOKS",
    "INPUT_KINDS",
    "PRECISIONS",
    "AttentionMode",
    "CacheKind",
    "CheckpointFormat",
    "ComponentKind",
    "KVUpdate",
    "LoopKind",
    "ParityLevel",
    "WeightsKind",
    "coerce",
    "frozen_mapping",
]


class ComponentKind(str, enum.Enum):
    DIT = "dit"
    VAE = "vae"
    DECODER = "decoder"  # decode-only latent codec (a tiny streaming decoder): cannot encode
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
    TAEHV = "taehv"  # madebyollin's published TAEHV layout (decoder.N.*, encoder.N.*)


class ParityLevel(str, enum.Enum):
    """Consistency ladder (docs/architecture.md §7, the parity ladder); ordered, C0 weakest."""

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
CAPABILITIES: Mapping[str, tuple[frozenset[LoopKind], str]] = MappingProxyType(
    {
        "session.realtime": (frozenset({LoopKind.CHUNK_ROLLOUT}), ""),
        "text_to_video": (DENOISING_LOOPS, ""),
        "text_to_image": (DENOISING_LOOPS, ""),
        "prompt.switch": (frozenset({LoopKind.CHUNK_ROLLOUT}), "prompt"),
        "prompt.cut": (frozenset({LoopKind.CHUNK_ROLLOUT}), "cut"),
        "input.action": (frozenset({LoopKind.CHUNK_ROLLOUT}), "action"),
        "input.audio": (frozenset({LoopKind.CHUNK_ROLLOUT}), "audio"),
    }
)

# live inputs that need a conditioning hook on a component the loop uses
INPUT_HOOKS: Mapping[str, str] = MappingProxyType({"action": "action", "audio": "audio"})


E = TypeVar("E", bound=enum.Enum)


def coerce(enum_type: type[E], value: Any, what: str) -> E:
    """``enum_type(value)``; a value that is not one of its choices is a ``CardError``."""
    try:
        return enum_type(value)
    except ValueError:
        known = [m.value for m in enum_type]
        raise CardError([f"{what}={value!r} is not one of {known}"]) from None


def frozen_mapping(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy (cards are immutable, their mappings too)."""
    return MappingProxyType(dict(mapping))
