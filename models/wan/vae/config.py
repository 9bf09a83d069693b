"""Configuration of the Wan2.1 causal video VAE (``AutoencoderKLWan``-compatible).

Geometry: ``2 ** (len(dim_mult) - 1)``x spatial compression (8x for Wan2.1) and
``2 ** sum(temperal_downsample)``x temporal compression (4x), with the first frame kept on its own:
``F = 1 + 4 * (f - 1)`` pixel frames for ``f`` latent frames.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["WAN21_LATENTS_MEAN", "WAN21_LATENTS_STD", "VAEConfigError", "WanVAEConfig"]

# Per-channel statistics of Wan2.1 latents; the DiT works on (z - mean) / std.
WAN21_LATENTS_MEAN: tuple[float, ...] = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD: tuple[float, ...] = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip

# diffusers config keys that carry no information for us (bookkeeping or training-only).
_IGNORED_DIFFUSERS_KEYS = frozenset({"dropout", "scale_factor_temporal", "scale_factor_spatial"})


class VAEConfigError(ValueError):
    """A VAE configuration that is inconsistent or uses a variant we do not implement."""


@dataclass(frozen=True, slots=True)
class WanVAEConfig:
    """Hyper-parameters of the Wan2.1 VAE. Immutable; ``validate()`` runs on construction.

    Names follow diffusers' ``AutoencoderKLWan`` config (including its ``temperal`` spelling) so
    that ``from_diffusers_config`` / ``to_diffusers_config`` are plain renames.
    """

    z_dim: int = 16
    base_dim: int = 96
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    in_channels: int = 3
    out_channels: int = 3
    latents_mean: tuple[float, ...] = field(default=WAN21_LATENTS_MEAN)
    latents_std: tuple[float, ...] = field(default=WAN21_LATENTS_STD)

    def __post_init__(self) -> None:
        self.validate()

    # ---------------------------------------------------------------------------------------
    # derived geometry

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent cell along H and W (8 for Wan2.1)."""
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        """Pixel frames per latent frame after the first (4 for Wan2.1)."""
        return 2 ** sum(self.temperal_downsample)

    def num_pixel_frames(self, num_latent_frames: int) -> int:
        """``F = 1 + temporal_factor * (f - 1)``; 0 for 0."""
        if num_latent_frames <= 0:
            return 0
        return 1 + self.temporal_factor * (num_latent_frames - 1)

    # ---------------------------------------------------------------------------------------
    # validation and construction

    def validate(self) -> None:
        """Raise ``VAEConfigError`` naming the offending field and value."""
        positive = {
            "z_dim": self.z_dim,
            "base_dim": self.base_dim,
            "num_res_blocks": self.num_res_blocks,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
        }
        for name, value in positive.items():
            if value < 1:
                raise VAEConfigError(f"{name} must be >= 1, got {value}")
        if len(self.dim_mult) < 1 or min(self.dim_mult) < 1:
            raise VAEConfigError(f"dim_mult must be non-empty positive ints, got {self.dim_mult}")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise VAEConfigError(
                f"temperal_downsample needs len(dim_mult) - 1 = {len(self.dim_mult) - 1} entries, "
                f"got {len(self.temperal_downsample)}: {self.temperal_downsample}"
            )
        for name in ("latents_mean", "latents_std"):
            values = getattr(self, name)
            if len(values) != self.z_dim:
                raise VAEConfigError(f"{name} needs z_dim = {self.z_dim} values, got {len(values)}")
        if min(self.latents_std) <= 0:
            raise VAEConfigError(f"latents_std must be > 0, got {self.latents_std}")

    @classmethod
    def preset(cls, name: str) -> WanVAEConfig:
        """``"wan2.1"`` (alias ``"wan2.1-vae"``: the real VAE) or ``"tiny"`` (CPU tests and the
        random-weight card)."""
        if name not in _PRESETS:
            raise VAEConfigError(f"unknown VAE preset {name!r}; known: {sorted(_PRESETS)}")
        return _PRESETS[name]

    @classmethod
    def from_diffusers_config(cls, config: Mapping[str, Any]) -> WanVAEConfig:
        """Build from an ``AutoencoderKLWan`` ``config.json`` dict.

        Raises ``VAEConfigError`` for variants we do not implement (Wan2.2's residual VAE,
        patchified input, a different decoder width, attention scales) and for unknown keys.
        """
        unsupported: list[str] = []
        if config.get("is_residual", False):
            unsupported.append("is_residual=True (Wan2.2 VAE)")
        if config.get("patch_size") is not None:
            unsupported.append(f"patch_size={config['patch_size']}")
        if list(config.get("attn_scales", [])):
            unsupported.append(f"attn_scales={config['attn_scales']}")
        # (the default from the field: on a slotted class ``cls.base_dim`` is the slot)
        base_dim = config.get("base_dim", cls.__dataclass_fields__["base_dim"].default)
        decoder_base_dim = config.get("decoder_base_dim")
        if decoder_base_dim is not None and decoder_base_dim != base_dim:
            unsupported.append(f"decoder_base_dim={decoder_base_dim} != base_dim={base_dim}")
        if unsupported:
            raise VAEConfigError("unsupported AutoencoderKLWan config: " + "; ".join(unsupported))
        known = {f for f in cls.__dataclass_fields__} | _IGNORED_DIFFUSERS_KEYS
        known |= {"is_residual", "patch_size", "attn_scales", "decoder_base_dim"}
        unknown = sorted(k for k in config if not k.startswith("_") and k not in known)
        if unknown:
            raise VAEConfigError(f"unknown AutoencoderKLWan config keys: {unknown}")
        kwargs: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            if name in config:
                value = config[name]
                kwargs[name] = tuple(value) if isinstance(value, list) else value
        return cls(**kwargs)

    def to_diffusers_config(self) -> dict[str, object]:
        """The kwargs of ``AutoencoderKLWan(**...)`` describing this architecture."""
        out = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def with_(self, **changes: Any) -> WanVAEConfig:
        """A copy with ``changes`` applied (validated)."""
        return replace(self, **changes)


_PRESETS: dict[str, WanVAEConfig] = {
    "wan2.1": WanVAEConfig(),
    "wan2.1-vae": WanVAEConfig(),  # the name the Wan cards use as the component's config_ref
    # Same geometry as Wan2.1 (z 16, 8x spatial, 4x temporal) at a width a laptop CPU decodes
    # in real time; used with random weights by the tiny card and tests.
    "tiny": WanVAEConfig(base_dim=8, dim_mult=(1, 2, 2, 2), num_res_blocks=1),
}
