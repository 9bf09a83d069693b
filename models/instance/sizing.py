"""What one session of an instance costs: its bytes, its FLOPs, its media seconds and the plans a
steady chunk runs - the numbers admission and the cost model price it from.

A mixin of ``WanInstance`` (``models/instance/resident.py``): it reads the instance's card, DiT
config, latent codec, K/V layout and dtype, and holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.card import KVUpdate, LatentSpec, ModelCard, Profile
from models.loops.chunk_rollout.plans import steady_chunk_plans
from models.loops.ops import LatentCodec
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT, dit_flops
from models.wan.kv.cache import ChunkKVCache

__all__ = ["InstanceSizing"]


class InstanceSizing:
    """Sizing and cost of a session of ``profile`` (see the module docstring)."""

    # what it reads of the instance
    card: ModelCard
    latent: LatentSpec
    dit: WanDiT
    vae: LatentCodec  # the default latent codec
    dtype: torch.dtype
    text_len: int
    kv_config: WanDiTConfig
    kv_dtype: torch.dtype
    kv_geometry: Callable[[int], tuple[int, int]]
    tokens_per_frame: Callable[[int, int], int]
    codec_for: Callable[[str | None], LatentCodec]

    def _latent_hw(self, profile: Profile) -> tuple[int, int]:
        s = self.latent.spatial_stride
        return profile.height // s, profile.width // s

    def kv_slab_bytes(self, profile: Profile) -> int:
        """Bytes one session holds for its whole life: K/V cache, decoder cache, cached latents."""
        lh, lw = self._latent_hw(profile)
        sink, ring = self.kv_geometry(profile.chunk_latent_frames)
        kv = ChunkKVCache.bytes_for(
            self.kv_config, sink, ring, self.tokens_per_frame(lh, lw), self.kv_dtype
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

    def chunk_flops(self, profile: Profile, decoder: str | None = None) -> float:
        """FLOPs of one steady-state chunk: the denoise steps, the KV update (once: a card
        whose last step writes the cache has no separate pass) and the decode (``decoder``;
        None: the default one)."""
        lh, lw = self._latent_hw(profile)
        sink, ring = self.kv_geometry(profile.chunk_latent_frames)
        t = self.tokens_per_frame(lh, lw)
        q = profile.chunk_latent_frames * t
        per = dit_flops(self.dit.config, q, (sink + ring) * t + q, self.text_len)
        spec = self.card.loops.get("chunk_rollout")
        kv_passes = 0 if spec is not None and spec.kv_update is KVUpdate.LAST_STEP else 1
        return per * (profile.steps + kv_passes) + self.decode_flops(profile, decoder)

    def steady_chunk_plans(
        self, profile: Profile, decoder: str | None = None
    ) -> tuple[tuple[str, str, int], ...]:
        """(plan kind, shape signature, count) of one steady-state chunk of a session of
        ``profile`` decoding with ``decoder`` (None: the default;
        ``models.loops.chunk_rollout.plans.steady_chunk_plans``): what the cost model's calibration
        prices a session's compute share from."""
        lh, lw = self._latent_hw(profile)
        spec = self.card.loops.get("chunk_rollout")
        fold = spec is not None and spec.kv_update is KVUpdate.LAST_STEP
        other = decoder if decoder and decoder != self.card.default_decoder else ""
        plans = steady_chunk_plans(
            profile.chunk_latent_frames, lh, lw, steps=profile.steps, fold=fold, decoder=other
        )
        return tuple((kind.value, sig, n) for kind, sig, n in plans)

    def decode_flops(self, profile: Profile, decoder: str | None = None) -> float:
        """Decode FLOPs of one steady-state chunk with ``decoder`` (None: the default; 0 for a
        codec that does not count them, e.g. pixel latents)."""
        codec = self.vae if decoder is None else self.codec_for(decoder)
        count = getattr(codec, "decode_flops", None)
        return (
            0.0 if count is None else count(profile.chunk_latent_frames, *self._latent_hw(profile))
        )

    def chunk_seconds(self, profile: Profile) -> float:
        """Media seconds one steady-state chunk covers."""
        frames = self.latent.pixel_frames(profile.chunk_latent_frames, includes_first=False)
        return frames / profile.fps
