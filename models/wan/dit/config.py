"""Wan2.1 DiT hyper-parameters: one frozen dataclass, named presets, and the two on-disk formats.

``WanDiTConfig`` is the single source of truth for building ``WanDiT``. It is read from
diffusers' ``WanTransformer3DModel`` config.json (``from_diffusers_config``) or from Wan's own
config.json (``from_original_config``: ``dim``, ``ffn_dim``, ``num_heads`` ...), and written back
in the original format (``to_original_config``) so a checkpoint we save describes itself.

Conditioning hooks (``action_dim``, ``audio_dim``) are ours, not Wan's: 0 means "no hook".
Their projections are zero-initialised, so a plain Wan checkpoint behaves exactly like Wan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigError", "PRESETS", "WanDiTConfig"]

QK_NORMS = (None, "rms_norm_across_heads")
T2V_MODEL_TYPES = ("t2v", "t2i")


class ConfigError(ValueError):
    """A config value this implementation cannot build (names the field and the value)."""


@dataclass(frozen=True, slots=True)
class WanDiTConfig:
    """Architecture of a Wan2.1 text-to-video DiT (plus optional action/audio hooks).

    ``patch_size`` is (t, h, w) in latent pixels; ``in_channels``/``out_channels`` are latent
    channels; ``text_dim`` is the text-encoder width (UMT5-XXL: 4096) and ``text_len`` the padded
    prompt length the checkpoint was trained with. ``action_dim`` is the width of one chunk's
    action vector (keyboard one-hot + mouse delta, e.g. 8 + 2), ``audio_dim`` the width of one
    latent frame's audio features; 0 disables the hook. Invalid combinations raise ``ConfigError``.
    """

    name: str = "custom"
    dim: int = 1536
    num_layers: int = 30
    num_heads: int = 12
    ffn_dim: int = 8960
    freq_dim: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    text_len: int = 512
    eps: float = 1e-6
    qk_norm: str | None = "rms_norm_across_heads"
    cross_attn_norm: bool = True
    rope_theta: float = 10000.0
    action_dim: int = 0
    audio_dim: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ConfigError(f"patch_size must be three positive ints, got {self.patch_size}")
        if self.num_heads < 1 or self.dim % self.num_heads != 0:
            raise ConfigError(f"dim={self.dim} is not divisible by num_heads={self.num_heads}")
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim={self.head_dim} must be even for 3D RoPE")
        if self.qk_norm not in QK_NORMS:
            raise ConfigError(f"qk_norm={self.qk_norm!r} is not one of {QK_NORMS}")
        for field_name in (
            "num_layers",
            "ffn_dim",
            "freq_dim",
            "in_channels",
            "out_channels",
            "text_dim",
        ):
            if getattr(self, field_name) < 1:
                raise ConfigError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.freq_dim % 2 != 0:
            raise ConfigError(f"freq_dim={self.freq_dim} must be even")
        if self.action_dim < 0 or self.audio_dim < 0:
            raise ConfigError(
                f"action_dim={self.action_dim} and audio_dim={self.audio_dim} must be >= 0"
            )

    # ---------------------------------------------------------------------------------------
    # derived sizes

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    def rope_split(self) -> tuple[int, int, int]:
        """Channels of one head given to the (frame, height, width) RoPE axes (Wan's split)."""
        hw = 2 * (self.head_dim // 6)
        return self.head_dim - 2 * hw, hw, hw

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        """Tokens one latent frame becomes (832x480 video -> 104x60 latent -> 1560 tokens)."""
        _, ph, pw = self.patch_size
        if latent_height % ph or latent_width % pw:
            raise ConfigError(
                f"latent size {latent_height}x{latent_width} is not divisible by patch {ph}x{pw}"
            )
        return (latent_height // ph) * (latent_width // pw)

    def replace(self, **changes: Any) -> WanDiTConfig:
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------------------------------
    # presets and on-disk formats

    @staticmethod
    def preset(name: str) -> WanDiTConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None

    @classmethod
    def from_diffusers_config(cls, cfg: Mapping[str, Any], name: str = "diffusers") -> WanDiTConfig:
        """Read diffusers' ``WanTransformer3DModel`` config.json (T2V only).

        ``qk_norm`` is always RMS-across-heads: diffusers builds and applies those norms even
        when its config says ``qk_norm=None``, so that is what its checkpoints compute.
        """
        for key in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
            if cfg.get(key) is not None:
                raise ConfigError(
                    f"{key}={cfg[key]!r}: image-conditioned Wan (I2V/FLF2V) is not supported"
                )
        heads = int(cfg.get("num_attention_heads", 40))
        return cls(
            name=name,
            dim=heads * int(cfg.get("attention_head_dim", 128)),
            num_layers=int(cfg.get("num_layers", 40)),
            num_heads=heads,
            ffn_dim=int(cfg.get("ffn_dim", 13824)),
            freq_dim=int(cfg.get("freq_dim", 256)),
            patch_size=tuple(cfg.get("patch_size", (1, 2, 2))),
            in_channels=int(cfg.get("in_channels", 16)),
            out_channels=int(cfg.get("out_channels") or cfg.get("in_channels", 16)),
            text_dim=int(cfg.get("text_dim", 4096)),
            eps=float(cfg.get("eps", 1e-6)),
            # diffusers' WanAttention applies its RMS q/k norms whatever ``qk_norm`` says
            qk_norm="rms_norm_across_heads",
            cross_attn_norm=bool(cfg.get("cross_attn_norm", True)),
            action_dim=int(cfg.get("action_dim", 0)),
            audio_dim=int(cfg.get("audio_dim", 0)),
        )

    def to_diffusers_config(self) -> dict[str, object]:
        """Constructor kwargs of diffusers' ``WanTransformer3DModel`` (hooks are not part of it)."""
        return {
            "patch_size": list(self.patch_size),
            "num_attention_heads": self.num_heads,
            "attention_head_dim": self.head_dim,
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "ffn_dim": self.ffn_dim,
            "num_layers": self.num_layers,
            "cross_attn_norm": self.cross_attn_norm,
            "qk_norm": self.qk_norm,
            "eps": self.eps,
        }

    @classmethod
    def from_original_config(cls, cfg: Mapping[str, Any], name: str = "original") -> WanDiTConfig:
        """Read Wan's own config.json (``WanModel``: dim, ffn_dim, num_heads, model_type ...)."""
        model_type = cfg.get("model_type", "t2v")
        if model_type not in T2V_MODEL_TYPES:
            raise ConfigError(f"model_type={model_type!r}: only {T2V_MODEL_TYPES} are supported")
        qk_norm = cfg.get("qk_norm", True)
        return cls(
            name=name,
            dim=int(cfg.get("dim", 2048)),
            num_layers=int(cfg.get("num_layers", 32)),
            num_heads=int(cfg.get("num_heads", 16)),
            ffn_dim=int(cfg.get("ffn_dim", 8192)),
            freq_dim=int(cfg.get("freq_dim", 256)),
            patch_size=tuple(cfg.get("patch_size", (1, 2, 2))),
            in_channels=int(cfg.get("in_dim", 16)),
            out_channels=int(cfg.get("out_dim", 16)),
            text_dim=int(cfg.get("text_dim", 4096)),
            text_len=int(cfg.get("text_len", 512)),
            eps=float(cfg.get("eps", 1e-6)),
            qk_norm="rms_norm_across_heads" if qk_norm else None,
            cross_attn_norm=bool(cfg.get("cross_attn_norm", True)),
            action_dim=int(cfg.get("action_dim", 0)),
            audio_dim=int(cfg.get("audio_dim", 0)),
        )

    def to_original_config(self) -> dict[str, object]:
        """Wan's config.json fields, plus our hook widths (readers that do not know them ignore)."""
        return {
            "model_type": "t2v",
            "patch_size": list(self.patch_size),
            "text_len": self.text_len,
            "in_dim": self.in_channels,
            "dim": self.dim,
            "ffn_dim": self.ffn_dim,
            "freq_dim": self.freq_dim,
            "text_dim": self.text_dim,
            "out_dim": self.out_channels,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "qk_norm": self.qk_norm is not None,
            "cross_attn_norm": self.cross_attn_norm,
            "eps": self.eps,
            "action_dim": self.action_dim,
            "audio_dim": self.audio_dim,
        }


PRESETS: dict[str, WanDiTConfig] = {
    # Wan2.1-T2V-1.3B: the backbone of Self-Forcing, CausVid, LongLive and Matrix-Game 2.0.
    "wan2.1-1.3b": WanDiTConfig(name="wan2.1-1.3b"),
    "wan2.1-14b": WanDiTConfig(
        name="wan2.1-14b", dim=5120, num_layers=40, num_heads=40, ffn_dim=13824
    ),
    # Small enough that a CPU forward takes milliseconds; the shapes still exercise every path.
    "tiny": WanDiTConfig(
        name="tiny",
        dim=64,
        num_layers=2,
        num_heads=2,
        ffn_dim=128,
        freq_dim=32,
        text_dim=32,
        text_len=16,
    ),
}
