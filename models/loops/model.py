"""What a loop needs from a loaded model: the ``LoopModel`` protocol.

Loops are written against this protocol, never against a concrete instance class, so
``models/instance/resident.py`` imports the loops (through ``models.loops.LOOPS``) and no loop
imports the instance. ``models.instance.WanInstance`` implements it for every Wan-architecture card
(including tiny-world, whose components have the same interfaces).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from models.card import LatentSpec, ModelCard, Profile
from models.loops.chunk_rollout.restart import RestartPolicy
from models.loops.ops import (
    ChunkDenoiseOp,
    DecodeOp,
    DiffusionStepOp,
    KVWriteOp,
    TextEmbedOp,
    TextEncodeOp,
)
from models.lora import LoRAAdapters
from models.wan.dit.config import WanDiTConfig
from models.wan.kv.cache import ChunkKVCache
from models.wan.kv.slabs import SlabGeometry
from models.wan.vae.cache import DecoderCache

__all__ = ["LoopModel"]


class LoopModel(Protocol):
    """A resident model as the loops use it (implements ``runtime.contract.ModelState``)."""

    card: ModelCard
    instance_id: str
    device: torch.device
    dtype: torch.dtype
    precision: str
    latent: LatentSpec
    text_len: int
    dit_config: WanDiTConfig
    components: Any
    # when a picture-changing input restarts the chunk in flight: a serving policy of the loaded
    # model, not of the card (``WanInstance``: ``RegenerateWhenSooner`` unless configured)
    chunk_restart: RestartPolicy
    # the content hash of the loaded weights (``models.checkpoint.digest``; ``""``: not computed,
    # as for weights built in place); the version a chunk's cross K/V and its records name
    weights_digest: str
    # the step bodies the loops put into their WorkPlans
    text_encode_op: TextEncodeOp
    text_embed_op: TextEmbedOp
    chunk_step_op: ChunkDenoiseOp
    kv_write_op: KVWriteOp
    decode_op: DecodeOp
    diffusion_step_op: DiffusionStepOp
    # the LoRA adapters a session's plans may run with (``models.lora``)
    adapters: LoRAAdapters

    @property
    def default_decoder(self) -> str:
        """The decoder of a stream that names none (``models.instance.decoders``)."""
        ...

    def decoder_options(self) -> tuple[str, ...]:
        """The decoders a stream may pick here (``"full"``, ``"tiny"``)."""
        ...

    def resolve_decoder(self, decoder: str | None) -> str:
        """``decoder`` (None: the default) if served here, else ``DecoderUnavailableError``."""
        ...

    def decode_op_for(self, decoder: str | None) -> DecodeOp:
        """The decode op of ``decoder`` (None: the default, ``decode_op``)."""
        ...

    def slab_geometry(self, profile: Profile) -> SlabGeometry:
        """The chunk-KV geometry of a session at ``profile``."""
        ...

    def kv_cache(self, geometry: SlabGeometry, slab: int | None) -> ChunkKVCache:
        """A fresh cache: a view of slab ``slab`` of the preallocated buffer of ``geometry``,
        or, with ``slab=None`` (jobs, tests), one with its own buffers."""
        ...

    def new_decoder_cache(
        self, latent_h: int, latent_w: int, decoder: str | None = None
    ) -> DecoderCache:
        """A fresh per-stream decoder cache of ``decoder`` (None: the model's default)."""
        ...

    def tokens_per_frame(self, latent_h: int, latent_w: int) -> int: ...
