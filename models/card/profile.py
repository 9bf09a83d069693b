"""A card's geometry: the latent layout its VAE and DiT patch imply, and the serving profile.

``ModelCard.resolve_profile`` applies a request's overrides to the default ``Profile`` and checks
them against ``LatentSpec.pixel_multiple``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LatentSpec", "Profile"]


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
        return (height // self.spatial_stride // self.patch[1]) * (
            width // self.spatial_stride // self.patch[2]
        )

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
        return {
            "fps": self.fps,
            "width": self.width,
            "height": self.height,
            "chunk_latent_frames": self.chunk_latent_frames,
            "steps": self.steps,
        }
