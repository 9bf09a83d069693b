"""A resident, loaded model: a card's components bound to a device, and the loops that drive them.

``load_instance(card)`` validates the card before any weight loads, checks that the serving
precision is one the recipe allows, then builds the components (seeded random weights for
``weights="random"`` cards; a checkpoint directory laid out as the card's manifest says
otherwise) and the step ops. One instance serves every session and job of its card: it holds
weights and ops only, never per-request state.

Families other than Wan build their own components through a *component builder*
(``_COMPONENT_BUILDERS``: family -> module with ``build_components``); whatever it returns must
satisfy what the loops use: a ``WanDiT``-compatible DiT, a VAE-like codec
(``denormalize``/``decode_chunk``/``new_decoder_cache``/``decoder_cache_bytes``/
``decoder.slot_specs``) and a text encoder (``encode(texts)``, ``precision``, ``shape_sig``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

import torch

from models.card import KVUpdate, ModelCard, Profile
from models.loops.inputs import ACTION_DIM, AUDIO_DIM
from models.loops.ops import (
    ChunkDenoiseOp,
    DecodeOp,
    DiffusionStepOp,
    KVWriteOp,
    TextEmbedOp,
    TextEncodeOp,
)
from models.loops.registry import build_loop
from models.wan.attention import ATTENTION_BACKENDS, WanSelfAttention
from models.wan.config import WanDiTConfig
from models.wan.fp8 import quantize_linears
from models.wan.kv_cache import ChunkKVCache
from models.wan.kv_slabs import KVSlabBuffer, SlabGeometry
from models.wan.text_encoder import CachedTextEncoder, TextEmbeddingCache, UMT5TextEncoder
from models.wan.transformer import WanDiT, dit_flops
from models.wan.vae import WanVAE
from models.wan.vae_config import WanVAEConfig
from models.weights_digest import checkpoint_digest, random_digest

__all__ = ["InstanceError", "WanInstance", "load_instance"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class InstanceError(RuntimeError):
    """A card that cannot be instantiated here (names the card and the reason)."""


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
    ) -> tuple[Any, Any, Any]: ...


# family -> module providing ``build_components`` (a ComponentBuilder); imported on first use.
# Families not listed here are Wan-built (presets of models.wan, diffusers/original checkpoints).
_COMPONENT_BUILDERS: dict[str, str] = {"tinyworld": "models.tinyworld.components"}


def _component_builder(family: str) -> ComponentBuilder | None:
    module = _COMPONENT_BUILDERS.get(family)
    return None if module is None else importlib.import_module(module).build_components


class WanInstance:
    """A loaded Wan-family card (implements ``runtime.contract.ModelState`` and
    ``models.loops.model.LoopModel``).

    ``dit``/``vae``/``text`` are the components; the ``*_op`` attributes are the StepOps the
    loops put into their WorkPlans. Sizing helpers (``kv_slab_bytes``, ``peak_bytes``,
    ``chunk_flops``) serve admission before a session is admitted. Sessions' chunk-KV caches
    live in one preallocated ``KVSlabBuffer`` per geometry (``reserve_kv_slabs``).
    """

    def __init__(
        self,
        card: ModelCard,
        dit: WanDiT,
        vae: WanVAE,
        text: CachedTextEncoder,
        *,
        device: torch.device,
        precision: str,
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
        self._slab_buffers: dict[SlabGeometry, KVSlabBuffer] = {}
        self.components = {"dit": dit, "vae": vae, "text_encoder": text}
        self.text_encode_op = TextEncodeOp(text.encode, dit)
        self.text_embed_op = TextEmbedOp(text.encode)
        self.chunk_step_op = ChunkDenoiseOp(dit)
        self.kv_write_op = KVWriteOp(dit)
        self.decode_op = DecodeOp(vae)
        self.diffusion_step_op = DiffusionStepOp(dit)
        self._compiled = False
        self._fp8 = False
        # content hash of the loaded weights (models.weights_digest), set by load_instance
        self.weights_digest = ""

    def compile(
        self, *, attention: str = "auto", fp8: str | None = None, overlap_decode: bool = True
    ) -> None:
        """Optimise the step bodies for serving (GPU); measured in infra/bench/RESULTS.md.

        - ``torch.compile`` of every DiT block (one graph serves all of them: same code, same
          shapes; one more per K/V prefix length while a stream's cache fills) and of the VAE
          decoder, whose 3D convolution weights go channels-last first (cuDNN's fast layout once
          the norms around them are fused). The first chunks after this pay the compilation.
        - ``attention``: which SDPA kernels unmasked self-attention prefers
          (``models.wan.attention.ATTENTION_BACKENDS``: auto, flash, cudnn). "auto" picks cuDNN
          on the H200 with torch 2.11 (61 ms per 1.3B step; flash first: 81 ms).
        - ``fp8``: ``"row"`` or ``"tensor"``: the blocks' linear layers become
          ``models.wan.fp8.Fp8Linear`` (e4m3 weights and activations, row-wise or per-tensor
          scales). Opt-in: on the H200 it saved 1-2 ms of a 61-ms step (attention and
          elementwise work dominate) for a larger frame difference.
        - ``overlap_decode`` (default on): a session's VAE decode runs on a second CUDA stream
          beside the next plans (``DecodeOp``); the frames are bit-identical, they just arrive
          asynchronously (H200: 26.2 -> 27.3 FPS on the 1.3B card).

        Calling it again may change ``attention`` and ``overlap_decode``; compilation and FP8
        are one-way.
        """
        if attention not in ATTENTION_BACKENDS:
            raise InstanceError(
                f"attention {attention!r} is not one of {sorted(ATTENTION_BACKENDS)}"
            )
        for module in self.dit.modules():
            if isinstance(module, WanSelfAttention):
                module.backends = ATTENTION_BACKENDS[attention]
        self.decode_op.set_overlap(overlap_decode, self.device)
        if fp8 not in (None, "row", "tensor"):
            raise InstanceError(f"fp8 {fp8!r} is not one of None, 'row', 'tensor'")
        if fp8 is not None and not self._fp8:
            quantize_linears(
                self.dit, lambda name: name.startswith("blocks."), per_tensor=fp8 == "tensor"
            )
            self._fp8 = True
        if self._compiled:
            return
        for block in self.dit.blocks:
            block.compile()
        if hasattr(self.vae, "decoder") and isinstance(self.vae.decoder, torch.nn.Module):
            for module in self.vae.modules():
                if isinstance(module, torch.nn.Conv3d):
                    module.weight.data = module.weight.data.contiguous(
                        memory_format=torch.channels_last_3d
                    )
            self.vae.decoder.compile()
        self._compiled = True

    def batch_sessions(self, enabled: bool) -> None:
        """Let the engine run compatible denoising steps of several sessions as one DiT forward
        (``ChunkDenoiseOp``). Off by default: batched steps agree with solo ones only within a
        tolerance, and it pays only where one session's step leaves the GPU underused (measured
        per profile and N in infra/bench/RESULTS.md, ``dreamrt bench multisession``)."""
        self.chunk_step_op.batchable = enabled

    # ---------------------------------------------------------------------------------------
    # loops

    def loop(self, loop_id: str) -> Any:
        """The Loop serving the card's loop ``loop_id`` (``models.loops.registry.LOOPS`` by its
        kind); raises ``RecipeMismatchError`` if the card's recipe does not allow it at this
        instance's precision, ``InstanceError`` for a helper loop."""
        spec = self.card.check_serving(loop_id, self.precision)
        try:
            return build_loop(self, spec)
        except KeyError as exc:
            raise InstanceError(f"card {self.card.model_id!r}: {exc.args[0]}") from None

    def loop_for(self, capability: str) -> Any:
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
                self.dit.config, geometry, num_slabs=num_slabs, device=self.device, dtype=self.dtype
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
                self.dit.config,
                batch=1,
                sink_frames=geometry.sink_frames,
                window_frames=geometry.window_frames,
                tokens_per_frame=geometry.tokens_per_frame,
                device=self.device,
                dtype=self.dtype,
            )
        buffer = self._slab_buffers.get(geometry)
        if buffer is None:
            raise InstanceError(
                f"card {self.card.model_id!r}: no K/V slabs reserved for geometry "
                f"{geometry.key} (reserve_kv_slabs first)"
            )
        return buffer.cache(slab)

    def new_decoder_cache(self, latent_h: int, latent_w: int) -> Any:
        """A fresh per-stream VAE decoder cache (``DecoderCache``)."""
        return self.vae.new_decoder_cache(1, latent_h, latent_w)

    def _latent_hw(self, profile: Profile) -> tuple[int, int]:
        s = self.latent.spatial_stride
        return profile.height // s, profile.width // s

    def kv_slab_bytes(self, profile: Profile) -> int:
        """Bytes one session holds for its whole life: K/V cache, decoder cache, cached latents."""
        lh, lw = self._latent_hw(profile)
        sink, ring = self.kv_geometry(profile.chunk_latent_frames)
        kv = ChunkKVCache.bytes_for(
            self.dit.config, sink, ring, self.tokens_per_frame(lh, lw), self.dtype
        )
        dec = self.vae.decoder_cache_bytes(1, lh, lw, self.dtype)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        window = self.latent.channels * (sink + ring) * lh * lw * itemsize
        cross = 2 * self.dit.config.num_layers * self.text_len * self.dit.config.dim * itemsize
        return kv + dec + window + cross

    def peak_bytes(self, profile: Profile) -> int:
        """Activation high-water mark of one chunk step (an estimate: the largest attention
        score block plus a few token-wide buffers), for admission."""
        lh, lw = self._latent_hw(profile)
        sink, ring = self.kv_geometry(profile.chunk_latent_frames)
        t = self.tokens_per_frame(lh, lw)
        q, kv = profile.chunk_latent_frames * t, (sink + ring + profile.chunk_latent_frames) * t
        cfg = self.dit.config
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        scores = cfg.num_heads * q * kv * 4  # fp32 scores when no fused kernel is used
        tokens = 8 * q * max(cfg.dim, cfg.ffn_dim) * itemsize
        return scores + tokens

    def chunk_flops(self, profile: Profile) -> float:
        """FLOPs of one steady-state chunk: the denoise steps, the KV update (once: a card
        whose last step writes the cache has no separate pass) and the VAE decode."""
        lh, lw = self._latent_hw(profile)
        sink, ring = self.kv_geometry(profile.chunk_latent_frames)
        t = self.tokens_per_frame(lh, lw)
        q = profile.chunk_latent_frames * t
        per = dit_flops(self.dit.config, q, (sink + ring) * t + q, self.text_len)
        spec = self.card.loops.get("chunk_rollout")
        kv_passes = 0 if spec is not None and spec.kv_update is KVUpdate.LAST_STEP else 1
        return per * (profile.steps + kv_passes) + self.decode_flops(profile)

    def decode_flops(self, profile: Profile) -> float:
        """VAE-decode FLOPs of one steady-state chunk (0 for a codec that does not count them,
        e.g. pixel latents)."""
        count = getattr(self.vae, "decode_flops", None)
        return (
            0.0 if count is None else count(profile.chunk_latent_frames, *self._latent_hw(profile))
        )

    def chunk_seconds(self, profile: Profile) -> float:
        """Media seconds one steady-state chunk covers."""
        frames = self.latent.pixel_frames(profile.chunk_latent_frames, includes_first=False)
        return frames / profile.fps


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


def _randomize_hooks(dit: WanDiT, seed: int) -> None:
    """Random cards get non-zero action/audio hooks so inputs visibly change the output (real
    checkpoints start them at zero, an exact no-op, and train them)."""
    generator = torch.Generator().manual_seed(seed)
    for hook in (dit.action_embedding, dit.audio_embedding):
        if hook is None:
            continue
        for p in hook.parameters():
            p.data.copy_(torch.randn(p.shape, generator=generator) * 0.5)


def load_instance(
    card: ModelCard,
    *,
    device: str = "auto",
    precision: str | None = None,
    checkpoint_dir: str | Path | None = None,
    seed: int = 0,
    random_weights: bool = False,
    compile: bool = False,
) -> WanInstance:
    """Validate ``card`` and build its components (see module docstring).

    ``random_weights`` builds seeded random weights whatever the card's ``weights`` say - for
    benchmarks and smoke tests of an architecture whose checkpoint is not at hand.
    ``compile`` compiles the DiT blocks (``WanInstance.compile``).
    """
    card.validate()
    dev = _pick_device(device)
    prec = _pick_precision(card, dev, precision)
    card.check_serving(card.recipe.assumes_loop, prec)
    dtype = _DTYPES[prec]
    dit_spec = card.components["dit"]
    hooks = {
        "action_dim": ACTION_DIM if "action" in dit_spec.conditioning else 0,
        "audio_dim": AUDIO_DIM if "audio" in dit_spec.conditioning else 0,
    }
    builder = _component_builder(card.family)
    if builder is not None:
        dit, vae, encoder = builder(
            card,
            device=dev,
            dtype=dtype,
            seed=seed,
            random_weights=random_weights,
            checkpoint_dir=checkpoint_dir,
        )
    elif random_weights or card.weights.value == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with dev:  # initialise where the weights will live (a 1.3B DiT inits in ms on GPU)
                dit = WanDiT(WanDiTConfig.preset(dit_spec.preset).replace(**hooks))
                vae = WanVAE(WanVAEConfig.preset(card.components["vae"].preset))
        _randomize_hooks(dit, seed)
        encoder = UMT5TextEncoder.from_preset(
            card.components["text_encoder"].preset, seed=seed, device=dev, dtype=dtype
        )
    else:
        dit, vae, encoder = _load_checkpoint(card, checkpoint_dir, dev, dtype)
    dit = dit.to(device=dev).eval()
    _cast_dit(dit, dtype)
    vae = vae.to(device=dev, dtype=dtype).eval()
    text = CachedTextEncoder(
        encoder, TextEmbeddingCache(), model_id=card.model_id, weights_version=card.weights_version
    )
    instance = WanInstance(card, dit, vae, text, device=dev, precision=prec)
    instance.weights_digest = _weights_digest(card, seed, random_weights, checkpoint_dir)
    if compile:
        instance.compile()
    return instance


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
    entries = [e.path_hint for e in card.checkpoint.components.values()]
    return checkpoint_digest(Path(root), entries) if root is not None else ""


def _cast_dit(dit: WanDiT, dtype: torch.dtype) -> None:
    from models.wan.transformer import param_dtype

    for name, p in dit.named_parameters():
        p.data = p.data.to(param_dtype(name, dtype))


def _load_checkpoint(
    card: ModelCard, checkpoint_dir: str | Path | None, device: torch.device, dtype: torch.dtype
) -> tuple[WanDiT, WanVAE, UMT5TextEncoder]:
    from models.checkpoint import load_transformer, load_vae
    from models.wan.text_encoder import require_transformers

    if checkpoint_dir is None:
        raise InstanceError(
            f"card {card.model_id!r} has {card.weights.value} weights: pass the checkpoint "
            f"directory (components {sorted(card.checkpoint.components)})"
        )
    root = Path(checkpoint_dir)
    entries = card.checkpoint.components
    missing = [
        f"{c} ({e.path_hint})" for c, e in entries.items() if not (root / e.path_hint).exists()
    ]
    if missing:
        raise InstanceError(
            f"checkpoint {str(root)!r} for card {card.model_id!r} lacks: " + ", ".join(missing)
        )
    require_transformers()  # before gigabytes of DiT weights load, not after
    dit = load_transformer(root / entries["dit"].path_hint, device=device, dtype=dtype)
    vae = load_vae(root / entries["vae"].path_hint, device=device, dtype=dtype)
    encoder = UMT5TextEncoder.from_pretrained(
        root / entries["text_encoder"].path_hint,
        root / entries["tokenizer"].path_hint,
        text_len=dit.config.text_len,
        preset=card.components["text_encoder"].preset,
        device=device,
        dtype=dtype,
    )
    return dit, vae, encoder
