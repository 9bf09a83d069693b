"""Pixel space as tiny-world's "VAE": the DiT's latents are the frames themselves.

Latent = RGB in ``[-1, 1]``, one latent frame per video frame (temporal stride 1, spatial stride
1); the DiT's (1, 16, 16) patch embedding does the spatial compression. Decoding is a clamp, so
a 96x96 chunk decodes in microseconds on a CPU, and the codec holds no weights and keeps no
per-stream state: its decoder cache has no slots (only the ``frames_seen`` counter the loops
keep). It implements what ``models.loops`` asks of a VAE: ``normalize``/``denormalize``,
``decode_chunk``, ``new_decoder_cache``, ``decoder_cache_bytes`` and ``decoder.slot_specs``.
"""

from __future__ import annotations

import torch
from torch import nn

from models.wan.vae.cache import DecoderCache, SlotSpec

__all__ = ["CodecShapeError", "PixelCodec"]


class CodecShapeError(ValueError):
    """A latent tensor that is not [B, 3, f, H, W] (the message names the shape)."""


class _NoDecoderState(nn.Module):
    slot_specs: tuple[SlotSpec, ...] = ()


class PixelCodec(nn.Module):
    """Identity codec between RGB frames in ``[-1, 1]`` and DiT latents (module docstring)."""

    channels = 3

    def __init__(self) -> None:
        super().__init__()
        self.decoder = _NoDecoderState()

    def normalize(self, video: torch.Tensor) -> torch.Tensor:
        # video: [B, 3, F, H, W] in [-1, 1] -> latents, same shape
        return video

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        # z: [B, 3, f, H, W] -> same
        return z

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        # video: [B, 3, F, H, W] -> [B, 3, F, H, W]
        self._check(video)
        return video

    def decode_chunk(self, z: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """z: [B, 3, c, H, W] -> frames [B, 3, c, H, W] clamped to [-1, 1]; counts the frames."""
        self._check(z)
        cache.frames_seen += z.shape[2]
        return z.clamp(-1.0, 1.0)

    def new_decoder_cache(
        self,
        batch_size: int,
        latent_height: int,
        latent_width: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DecoderCache:
        return DecoderCache.allocate(
            (),
            [(latent_height, latent_width)],
            batch_size,
            device=device or "cpu",
            dtype=dtype or torch.float32,
        )

    def decoder_cache_bytes(
        self, batch_size: int, latent_height: int, latent_width: int, dtype: torch.dtype
    ) -> int:
        return 0

    def _check(self, z: torch.Tensor) -> None:
        if z.ndim != 5 or z.shape[1] != self.channels:
            raise CodecShapeError(f"expected [B, 3, f, H, W] frames, got {tuple(z.shape)}")
