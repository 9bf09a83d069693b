"""tiny-world's DiT presets (Wan architecture, small): the served one and a test-sized one."""

from __future__ import annotations

from models.loops.inputs import ACTION_DIM, AUDIO_DIM
from models.tinyworld.geometry import LATENT
from models.wan.dit.config import ConfigError, WanDiTConfig

__all__ = ["DIT_PRESETS", "dit_preset"]

DIT_PRESETS: dict[str, WanDiTConfig] = {
    # 1.44 M parameters (5.8 MB fp32): 4 denoise steps + 1 KV update per 4-frame chunk take
    # ~0.1 s on one laptop core, and the recipe trains it on a CPU.
    "tinyworld-s": WanDiTConfig(
        name="tinyworld-s",
        dim=128,
        num_layers=4,
        num_heads=4,
        ffn_dim=512,
        freq_dim=64,
        patch_size=LATENT.patch,
        in_channels=3,
        out_channels=3,
        text_dim=64,
        text_len=8,
        action_dim=ACTION_DIM,
        audio_dim=AUDIO_DIM,
    ),
    # For unit tests: same shapes of every path, milliseconds per forward.
    "tinyworld-test": WanDiTConfig(
        name="tinyworld-test",
        dim=32,
        num_layers=2,
        num_heads=2,
        ffn_dim=64,
        freq_dim=16,
        patch_size=LATENT.patch,
        in_channels=3,
        out_channels=3,
        text_dim=16,
        text_len=8,
        action_dim=ACTION_DIM,
        audio_dim=AUDIO_DIM,
    ),
}


def dit_preset(name: str) -> WanDiTConfig:
    """The DiT config of a tiny-world preset; ``ConfigError`` names the known ones."""
    try:
        return DIT_PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tiny-world preset {name!r}; known: {sorted(DIT_PRESETS)}"
        ) from None
