"""Configuration of the TAEHV tiny streaming decoder (madebyollin's "Tiny AutoEncoder for Hunyuan
Video" architecture; ``taew2_1`` is its published decoder for Wan 2.1's 16-channel latents).

Geometry: three stages, each ``blocks_per_stage`` memory blocks at the stage's width, then an
optional 2x temporal grow and an optional 2x nearest-neighbour spatial upsample, then a 3x3
projection to the next width. ``taew2_1`` grows time in stages 1 and 2 (4x: one latent frame ->
4 frames) and space in all three (8x), like the Wan VAE; the stream's first 3 frames are
dropped so that ``f`` latent frames give ``1 + 4 (f - 1)`` frames, as the Wan VAE's do.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["TAEHVConfig", "TAEHVConfigError"]


class TAEHVConfigError(ValueError):
    """A TAEHV configuration that is inconsistent or names an unknown preset."""


@dataclass(frozen=True, slots=True)
class TAEHVConfig:
    """Hyper-parameters of the decoder. Immutable; validated on construction.

    ``widths``: channels of the three stages and of the final projection (``taew2_1``:
    256, 128, 64, 64). ``time_upscale[s]`` / ``space_upscale[s]``: whether stage ``s`` doubles
    the frame count / the grid. ``patch_size`` > 1 ends in a pixel shuffle (Wan 2.2's variant;
    1 for Wan 2.1).
    """

    latent_channels: int = 16
    widths: tuple[int, int, int, int] = (256, 128, 64, 64)
    blocks_per_stage: int = 3
    time_upscale: tuple[bool, bool, bool] = (False, True, True)
    space_upscale: tuple[bool, bool, bool] = (True, True, True)
    patch_size: int = 1
    image_channels: int = 3

    def __post_init__(self) -> None:
        for name in ("widths", "time_upscale", "space_upscale"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = []
        if len(self.widths) != 4 or min(self.widths) < 1:
            problems.append(f"widths {self.widths} must be 4 positive channel counts")
        for name in ("time_upscale", "space_upscale"):
            if len(getattr(self, name)) != 3:
                problems.append(f"{name} {getattr(self, name)} must name 3 stages")
        for name in ("latent_channels", "blocks_per_stage", "patch_size", "image_channels"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if problems:
            raise TAEHVConfigError("; ".join(problems))

    # ---------------------------------------------------------------------------------------
    # derived geometry

    @property
    def temporal_factor(self) -> int:
        """Frames per latent frame (4 for ``taew2_1``)."""
        return 2 ** sum(self.time_upscale)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent cell along H and W (8 for ``taew2_1``)."""
        return 2 ** sum(self.space_upscale) * self.patch_size

    @property
    def frames_to_trim(self) -> int:
        """Leading frames of a stream that are dropped (aligns frame 0 with the Wan VAE's)."""
        return self.temporal_factor - 1

    # ---------------------------------------------------------------------------------------
    # presets and serialisation

    @classmethod
    def preset(cls, name: str) -> TAEHVConfig:
        """``"taew2_1"`` (the published Wan 2.1 decoder) or ``"tiny"`` (CPU tests and the
        random-weight card: the same stages at a few channels)."""
        if name not in _PRESETS:
            raise TAEHVConfigError(f"unknown TAEHV preset {name!r}; known: {sorted(_PRESETS)}")
        return _PRESETS[name]

    def replace(self, **changes: Any) -> TAEHVConfig:
        return replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TAEHVConfig:
        try:
            fields = json.loads(text)
            return cls(**fields)
        except (TypeError, ValueError) as exc:
            raise TAEHVConfigError(f"not a TAEHV config: {text[:200]!r} ({exc})") from exc


_PRESETS = {
    "taew2_1": TAEHVConfig(),
    # 4-8 channels: a decoder that runs in milliseconds on one CPU core, for tests.
    "tiny": TAEHVConfig(widths=(8, 8, 4, 4), blocks_per_stage=1),
}
