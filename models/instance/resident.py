"""A resident, loaded model: a card's components bound to a device, and the loops that drive them.

``load_instance(card)`` validates the card before any weight loads, checks that the serving
precision is one the recipe allows, then builds the components (seeded random weights for
``weights="random"`` cards; a checkpoint directory laid out as the card's manifest says
otherwise) and the step ops. One instance serves every session and job of its card: it holds
weights and ops only, never per-request state. The loops decode with the card's
``decoder_component``: the full Wan VAE, or a decode-only tiny streaming decoder (TAEHV,
``ComponentKind.DECODER``) when the card names one. The card's other decoder, if it lists one
(``ModelCard.decoders``: ``"full"`` / ``"tiny"``), is loaded beside it when its weights are
there (always with random weights), so one resident instance serves sessions of either
(``SessionRequest.decoder``); the instance's card lists only the decoders it loaded.

Every family builds its components through a *component builder* (Wan:
``models/wan/components.py``; others: ``_COMPONENT_BUILDERS``); whatever it returns must
satisfy what the loops use: a ``WanDiT``-compatible DiT, a VAE-like codec
(``denormalize``/``decode_chunk``/``new_decoder_cache``/``decoder_cache_bytes``/
``decoder.slot_specs``) and a text encoder (``encode(texts)``, ``precision``, ``shape_sig``).
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self

import torch
import torch.distributed as dist

from models.card import ModelCard, Profile
from models.checkpoint.digest import checkpoint_digest, random_digest
from models.compile_guard import CompileGuard
from models.instance.decoders import InstanceDecoders, with_loaded_decoders
from models.instance.errors import InstanceError
from models.instance.levers import InstanceLevers
from models.instance.sizing import InstanceSizing
from models.loops.chunk_rollout.restart import RegenerateWhenSooner, RestartPolicy
from models.loops.ops import (
    ChunkDenoiseOp,
    DecodeOp,
    DiffusionStepOp,
    KVWriteOp,
    LatentCodec,
    TextEmbedOp,
    TextEncodeOp,
)
from models.loops.registry import build_loop
from models.loops.rollout_group import group_loop
from models.lora import LoRAAdapters
from models.resident_weights import ResidentWeights
from models.wan.dit.transformer import WanDiT
from models.wan.kv.cache import ChunkKVCache
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry
from models.wan.text_encoder import CachedTextEncoder, TextEmbeddingCache, UMT5TextEncoder
from models.wan.vae.cache import DecoderCache
from runtime.contract import Loop

if TYPE_CHECKING:
    from models.programs.graph import Program

__all__ = ["InstanceError", "WanInstance", "load_instance"]

log = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ModuleCodec(LatentCodec, Protocol):
    """A codec as its builder returns it: a module still to be moved to the serving device."""

    def to(self, *, device: torch.device, dtype: torch.dtype) -> Self: ...

    def eval(self) -> Self: ...


class ComponentBuilder(Protocol):
    """Builds a card's (dit, vae, text_encoder) on ``device`` (text encoder in ``dtype``)."""

    def __call__(
        self,
        card: ModelCard,
        *,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        random_weights: bool,
        checkpoint_dir: str | Path | None,
    ) -> tuple[WanDiT, ModuleCodec, UMT5TextEncoder]: ...


class DecoderBuilder(Protocol):
    """Builds a card's other decoders (``build_decoders``): decoder option -> codec."""

    def __call__(
        self,
        card: ModelCard,
        *,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        random_weights: bool,
        checkpoint_dir: str | Path | None,
    ) -> dict[str, ModuleCodec]: ...


# family -> module providing ``build_components`` (a ComponentBuilder); imported on first use.
# Families not listed here are Wan-built (models/wan/components.py: presets of models.wan,
# diffusers/original checkpoints).
_COMPONENT_BUILDERS: dict[str, str] = {"tinyworld": "models.tinyworld.components"}


def _component_builder(family: str) -> ComponentBuilder:
    module = _COMPONENT_BUILDERS.get(family, "models.wan.components")
    return importlib.import_module(module).build_components


class WanInstance(InstanceSizing, InstanceDecoders, InstanceLevers):
    """A loaded Wan-family card (implements ``runtime.contract.ModelState`` and
    ``models.loops.model.LoopModel``).

    ``dit``/``vae``/``text`` are the components; the ``*_op`` attributes are the StepOps the
    loops put into their WorkPlans. Sizing helpers (``kv_slab_bytes``, ``peak_bytes``,
    ``chunk_flops``) serve admission before a session is admitted. Sessions' chunk-KV caches
    live in one preallocated ``KVSlabBuffer`` per geometry (``reserve_kv_slabs``). The serving
    levers (``configure``, ``compile``, ``seal``) are ``InstanceLevers``
    (``models/instance/levers.py``).
    """

    def __init__(
        self,
        card: ModelCard,
        dit: WanDiT,
        vae: LatentCodec,
        text: CachedTextEncoder,
        *,
        device: torch.device,
        precision: str,
        chunk_restart: RestartPolicy | None = None,
        extensions: dict[str, Any] | None = None,
        block_observers: tuple[Any, ...] = (),
        decoders: Mapping[str, LatentCodec] | None = None,
    ) -> None:
        self.card = card
        self.instance_id = f"{card.model_id}@{device}"
        self.dit = dit
        self.vae = vae
        self.text = text
        self.device = device
        self.precision = precision
        self.dtype = _DTYPES[precision]
        self.latent = card.latent
        self.text_len = dit.config.text_len
        self.dit_config = dit.config
        self.kv_config = dit.config  # a chunk-K/V cache's heads: all, or H/sp (shard_sequence)
        self.kv_dtype = self.dtype  # a chunk-K/V cache's storage: the model's, or e4m3
        self._slab_buffers: dict[SlabGeometry, KVSlabBuffer] = {}
        # ``vae``: the codec the loops decode with (the card's decoder_component: the full VAE or
        # a decode-only tiny decoder); components keys it by the card's own id for it
        self.components = {"dit": dit, card.decoder_component: vae, "text_encoder": text}
        # the card's other decoders a session may pick, by option ("full" / "tiny"), each with
        # its own op (ops of two codecs never batch together: their op objects differ)
        self._other_codecs = dict(decoders or {})
        self._other_decode_ops = {k: DecodeOp(c) for k, c in self._other_codecs.items()}
        for option, codec in self._other_codecs.items():
            self.components[card.decoder_component_for(option)] = codec
        self.text_encode_op = TextEncodeOp(text.encode, dit)
        self.text_embed_op = TextEmbedOp(text.encode)
        self.chunk_step_op = ChunkDenoiseOp(dit)
        self.kv_write_op = KVWriteOp(dit)
        self.decode_op = DecodeOp(vae)
        self.diffusion_step_op = DiffusionStepOp(dit)
        # when an input restarts the chunk in flight: a serving policy of the server's
        self.chunk_restart: RestartPolicy = (
            RegenerateWhenSooner() if chunk_restart is None else chunk_restart
        )
        self._compiled = False
        self._fp8 = False
        self._regions = []  # the precompiled regions (models.precompiled), set by compile
        self.compile_guard = CompileGuard()  # what compiles after ``seal`` (never, counted)
        self.levers: dict[str, Any] = {"attention": "auto", "overlap_decode": False}
        self.weights_digest = ""  # content hash (models.checkpoint.digest), set by load_instance
        self.weights = ResidentWeights(self)  # updates, sleep, wake
        self.adapters = LoRAAdapters(dit, device=device, dtype=self.dtype)  # models/lora.py
        # deploy-scope extensions (name -> default params; models/loops/extensions.py) and
        # observers of every block of a hooked step (runtime.traces): the server's choices
        self.extensions: dict[str, Any] = dict(extensions or {})
        self.block_observers: tuple[Any, ...] = tuple(block_observers)

    def shard_sequence(self, group: dist.ProcessGroup | None) -> None:
        """Ulysses over ``group`` (models/wan/dit/sequence_parallel.py); slabs get H/sp heads."""
        from models.wan.dit.sequence_parallel import enable, local_kv_config

        if self._slab_buffers:
            raise InstanceError("shard_sequence after K/V slabs were reserved")
        if self.kv_dtype == torch.float8_e4m3fn:
            raise InstanceError("an FP8 K/V cache is not built for sequence-parallel serving")
        self.kv_config = local_kv_config(self.dit.config, enable(self.dit, group).size)

    def rank_local_buffers(self) -> dict[str, torch.Tensor]:
        """What each rank holds its own of (``runtime/spmd.py``): the K/V slabs' k and v."""
        return {n: t for b in self._slab_buffers.values() for n, t in b.tensors().items()}

    def warmup_chunks(self, profile: Profile) -> int:
        """Chunks a warm-up session needs so every graph a stream uses exists afterwards: every
        K/V-prefix length while the cache fills, two chunks at steady state and, with CUDA
        graphs, one KV update into every ring position (the last chunk of a bounded stream has
        none)."""
        c = profile.chunk_latent_frames
        sink, ring = self.kv_geometry(c)
        fill = -(-(sink + ring) // c)
        positions = ring // math.gcd(ring, c) if self.dit.chunk_graphs is not None else 1
        return fill + max(2, positions + 1)

    def batch_sessions(self, enabled: bool) -> None:
        """Let the engine run compatible denoising steps of several sessions as one DiT forward
        (``ChunkDenoiseOp``). Off by default: batched steps agree with solo ones only within a
        tolerance, and it pays only where one session's step leaves the GPU underused (measured
        per profile and N in infra/bench/RESULTS.md, ``dreamrt bench multisession``). The
        server turns it on on a GPU unless ``--deterministic`` or ``--no-batch-sessions``."""
        self.chunk_step_op.batchable = enabled

    def batched_plan_kinds(self) -> frozenset[str]:
        """The plan kinds of a steady chunk the engine may run for several sessions as one
        call (admission prices them per batch, ``sessions.session_pricing.batch_pricing``)."""
        return frozenset({"chunk_step"}) if self.chunk_step_op.batchable else frozenset()

    # ---------------------------------------------------------------------------------------
    # loops

    def loop(self, loop_id: str) -> Loop[Any]:
        """The Loop serving the card's loop ``loop_id`` (``models.loops.registry.LOOPS`` by its
        kind); raises ``RecipeMismatchError`` if the card's recipe does not allow it at this
        instance's precision, ``InstanceError`` for a helper loop."""
        spec = self.card.check_serving(loop_id, self.precision)
        try:
            return build_loop(self, spec)
        except KeyError as exc:
            raise InstanceError(f"card {self.card.model_id!r}: {exc.args[0]}") from None

    def program_loop(self, program: Program) -> Loop[Any]:
        """The loop running ``program`` (a ``models.programs.graph.Program``) on this instance
        (``ProgramError`` if the card cannot run it)."""
        from models.programs.program_loop import ProgramLoop

        return ProgramLoop(self, program)

    def group_loop(self, capability: str) -> Loop[Any]:
        """``capability``'s loop for a rollout group's samples (``models.loops.rollout_group``)."""
        return group_loop(self, capability) or self.loop_for(capability)

    def loop_for(self, capability: str) -> Loop[Any]:
        """The Loop the card names for ``capability`` (e.g. ``"text_to_video"``: a causal card
        answers ``chunk_rollout``, a bidirectional one ``diffusion_denoise``)."""
        spec = self.card.loop_for(capability)
        if spec is None:
            raise InstanceError(
                f"card {self.card.model_id!r} has no loop for {capability!r} "
                f"(capabilities: {sorted(self.card.capabilities)})"
            )
        return self.loop(spec.loop_id)

    # ---------------------------------------------------------------------------------------
    # geometry and sizing

    def kv_geometry(self, chunk_latent_frames: int) -> tuple[int, int]:
        """(sink frames, ring frames) of a session's K/V cache. The card's window counts the
        chunk being generated, which attends to itself outside the cache."""
        contract = self.card.caches["chunk_kv"]
        ring = contract.window_latent_frames - chunk_latent_frames
        if ring < 1:
            raise InstanceError(
                f"card {self.card.model_id!r}: window of {contract.window_latent_frames} latent "
                f"frames leaves no room for history beyond a {chunk_latent_frames}-frame chunk"
            )
        return contract.sink_latent_frames, ring

    def tokens_per_frame(self, latent_h: int, latent_w: int) -> int:
        return self.dit.config.tokens_per_frame(latent_h, latent_w)

    def slab_geometry(self, profile: Profile) -> SlabGeometry:
        """The chunk-KV geometry of a session at ``profile`` (sessions of equal geometry share
        one slab buffer)."""
        sink, ring = self.kv_geometry(profile.chunk_latent_frames)
        lh, lw = self._latent_hw(profile)
        return SlabGeometry(sink, ring, self.tokens_per_frame(lh, lw))

    def reserve_kv_slabs(self, profile: Profile, num_slabs: int) -> KVSlabBuffer:
        """Preallocate (once) the K/V buffer of ``num_slabs`` sessions at ``profile``'s
        geometry; a second call for the same geometry returns the buffer it made."""
        geometry = self.slab_geometry(profile)
        buffer = self._slab_buffers.get(geometry)
        if buffer is None:
            buffer = KVSlabBuffer(
                self.kv_config,
                geometry,
                num_slabs=num_slabs,
                device=self.device,
                dtype=self.kv_dtype,
            )
            self._slab_buffers[geometry] = buffer
        return buffer

    def slab_buffer(self, geometry: SlabGeometry) -> KVSlabBuffer | None:
        return self._slab_buffers.get(geometry)

    def kv_cache(self, geometry: SlabGeometry, slab: int | None) -> ChunkKVCache:
        """A fresh chunk-KV cache: slab ``slab`` of the reserved buffer of ``geometry`` (a view),
        or with ``slab=None`` one with its own buffers (jobs, tests, benchmarks)."""
        if slab is None:
            return ChunkKVCache.allocate(
                self.kv_config,
                batch=1,
                sink_frames=geometry.sink_frames,
                window_frames=geometry.window_frames,
                tokens_per_frame=geometry.tokens_per_frame,
                device=self.device,
                dtype=self.kv_dtype,
            )
        buffer = self._slab_buffers.get(geometry)
        if buffer is None:
            raise InstanceError(
                f"card {self.card.model_id!r}: no K/V slabs reserved for geometry "
                f"{geometry.key} (reserve_kv_slabs first)"
            )
        return buffer.cache(slab)

    def new_decoder_cache(
        self, latent_h: int, latent_w: int, decoder: str | None = None
    ) -> DecoderCache:
        """A fresh per-stream decoder cache (``DecoderCache``) of ``decoder`` (None: the
        default)."""
        return self.codec_for(decoder).new_decoder_cache(1, latent_h, latent_w)


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InstanceError("device 'cuda' requested but CUDA is not available")
    return torch.device(device)


def _pick_precision(card: ModelCard, device: torch.device, precision: str | None) -> str:
    if precision is not None:
        return precision
    assumed = card.recipe.assumes_precision
    # CPUs run bf16 matmuls slowly and fp16 poorly: serve in fp32 there when the card allows.
    if device.type == "cpu" and "fp32" in card.precision.allowed:
        return "fp32"
    return assumed


def load_instance(
    card: ModelCard,
    *,
    device: str = "auto",
    precision: str | None = None,
    checkpoint_dir: str | Path | None = None,
    seed: int = 0,
    random_weights: bool = False,
    compile: bool = False,
    chunk_restart: RestartPolicy | None = None,
    extensions: dict[str, Any] | None = None,
    block_observers: tuple[Any, ...] = (),
) -> WanInstance:
    """Validate ``card`` and build its components (see module docstring).

    ``random_weights`` builds seeded random weights whatever the card's ``weights`` say - for
    benchmarks and smoke tests of an architecture whose checkpoint is not at hand.
    ``compile`` compiles the DiT blocks (``WanInstance.compile``). The serving choices of the
    caller: ``chunk_restart`` (when an input restarts the chunk in flight; None: regenerate
    when sooner), ``extensions`` (deploy-scope extensions, name -> default params,
    ``models.loops.extensions.deploy_extensions``) and ``block_observers`` (of every block of a
    hooked step, ``runtime.traces``).
    """
    card.validate()
    dev = _pick_device(device)
    prec = _pick_precision(card, dev, precision)
    card.check_serving(card.recipe.assumes_loop, prec)
    dtype = _DTYPES[prec]
    built: dict[str, Any] = {  # the arguments of the card's component and decoder builders
        "device": dev,
        "dtype": dtype,
        "seed": seed,
        "random_weights": random_weights,
        "checkpoint_dir": checkpoint_dir,
    }
    began = time.perf_counter()
    dit, vae, encoder = _component_builder(card.family)(card, **built)
    built_s = time.perf_counter() - began
    dit = dit.to(device=dev).eval()
    _cast_dit(dit, dtype)
    vae = vae.to(device=dev, dtype=dtype).eval()
    others = _decoder_builder(card.family)
    decoders = {
        option: codec.to(device=dev, dtype=dtype).eval()
        for option, codec in (others(card, **built) if others is not None else {}).items()
    }
    log.info(
        "loaded %s on %s in %.1f s (DiT, codec and text encoder %.1f s, %s weights)",
        card.model_id,
        dev,
        time.perf_counter() - began,
        built_s,
        "random" if random_weights or card.weights.value == "random" else "checkpoint",
    )
    card = with_loaded_decoders(card, decoders)
    text = CachedTextEncoder(
        encoder, TextEmbeddingCache(), model_id=card.model_id, weights_version=card.weights_version
    )
    instance = WanInstance(
        card,
        dit,
        vae,
        text,
        device=dev,
        precision=prec,
        chunk_restart=chunk_restart,
        extensions=extensions,
        block_observers=block_observers,
        decoders=decoders,
    )
    instance.weights_digest = _weights_digest(card, seed, random_weights, checkpoint_dir)
    text.weights_version = instance.weights_digest or card.weights_version
    if compile:
        instance.compile()
    return instance


def _decoder_builder(family: str) -> DecoderBuilder | None:
    """The family's builder of a card's other decoders (``build_decoders``), or None."""
    module = _COMPONENT_BUILDERS.get(family, "models.wan.components")
    return getattr(importlib.import_module(module), "build_decoders", None)


def _weights_digest(
    card: ModelCard, seed: int, random_weights: bool, checkpoint_dir: str | Path | None
) -> str:
    if random_weights or card.weights.value == "random":
        presets = {name: spec.preset for name, spec in card.components.items()}
        return random_digest(card.model_id, presets, seed)
    module = _COMPONENT_BUILDERS.get(card.family)
    root = checkpoint_dir
    if root is None and module is not None:  # a family that ships its weights
        root = getattr(importlib.import_module(module), "SHIPPED_DIR", None)
    # the files of the components the loops use and of every decoder loaded beside them (an
    # optional decoder whose files are absent is not on the loaded card)
    served = {c for spec in card.loops.values() for c in spec.components}
    served |= {card.decoder_component_for(option) for option in card.decoders}
    entries = [e.path_hint for key, e in card.checkpoint.components.items() if key in served]
    return checkpoint_digest(Path(root), entries) if root is not None else ""


def _cast_dit(dit: WanDiT, dtype: torch.dtype) -> None:
    from models.wan.dit.transformer import param_dtype

    for name, p in dit.named_parameters():
        p.data = p.data.to(param_dtype(name, dtype))
