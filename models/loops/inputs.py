"""Live inputs as model conditioning: keyboard/mouse -> action vector, PCM -> audio features.

Action vector of one chunk (``ACTION_DIM`` = 10)::

    [ w  a  s  d  space  shift  q  e | mouse_dx  mouse_dy ]
      keyboard one-hot (1 = held)      pixels per chunk, scaled by 1/MOUSE_SCALE, clipped to ±1

Arrow keys alias to WASD. Audio features of one latent frame (``AUDIO_DIM`` = 8): the frame's
16 kHz mono samples split into 8 equal sub-windows, each summarised by ``log1p(100 * rms)``, so
silence is 0 and a full-scale tone is about 4.3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "ACTION_DIM",
    "ACTION_KEYS",
    "AUDIO_DIM",
    "AUDIO_SAMPLE_RATE",
    "InputError",
    "action_vector",
    "audio_features",
    "normalize_keys",
]

ACTION_KEYS: tuple[str, ...] = ("w", "a", "s", "d", "space", "shift", "q", "e")
_ALIASES = {
    "arrowup": "w",
    "up": "w",
    "arrowleft": "a",
    "left": "a",
    "arrowdown": "s",
    "down": "s",
    "arrowright": "d",
    "right": "d",
    " ": "space",
}
MOUSE_SCALE = 100.0
ACTION_DIM = len(ACTION_KEYS) + 2
AUDIO_DIM = 8
AUDIO_SAMPLE_RATE = 16_000


class InputError(ValueError):
    """An input payload that cannot become conditioning (names the field and value)."""


def normalize_keys(keys: Sequence[str]) -> list[str]:
    """Lower-case, alias arrows to WASD, drop duplicates (order kept); unknown keys raise."""
    out: list[str] = []
    for key in keys:
        if not isinstance(key, str):
            raise InputError(f"action key {key!r} is not a string")
        name = _ALIASES.get(key.lower(), key.lower())
        if name not in ACTION_KEYS:
            raise InputError(f"unknown action key {key!r}; known: {list(ACTION_KEYS)} and arrows")
        if name not in out:
            out.append(name)
    return out


def action_vector(keys: Sequence[str], mouse: Sequence[float]) -> torch.Tensor:
    """-> float32 [ACTION_DIM] (see module docstring)."""
    if len(mouse) != 2 or not all(math.isfinite(float(m)) for m in mouse):
        raise InputError(f"mouse must be two finite numbers [dx, dy], got {list(mouse)}")
    vec = torch.zeros(ACTION_DIM, dtype=torch.float32)
    for key in normalize_keys(keys):
        vec[ACTION_KEYS.index(key)] = 1.0
    vec[-2] = max(-1.0, min(1.0, float(mouse[0]) / MOUSE_SCALE))
    vec[-1] = max(-1.0, min(1.0, float(mouse[1]) / MOUSE_SCALE))
    return vec


def audio_features(samples: torch.Tensor, num_frames: int) -> torch.Tensor:
    """16 kHz mono samples covering ``num_frames`` latent frames -> float32 [num_frames, AUDIO_DIM].

    samples: [n] float in [-1, 1]; it is split evenly over the frames (zero-padded at the end
    when short), each frame into AUDIO_DIM sub-windows.
    """
    if samples.ndim != 1:
        raise InputError(f"audio samples must be 1-D, got shape {tuple(samples.shape)}")
    parts = num_frames * AUDIO_DIM
    per = max(1, math.ceil(samples.numel() / parts)) if samples.numel() else 1
    padded = torch.zeros(parts * per, dtype=torch.float32)
    padded[: samples.numel()] = samples.float()[: parts * per]
    rms = padded.view(parts, per).pow(2).mean(dim=1).sqrt()
    return torch.log1p(100.0 * rms).view(num_frames, AUDIO_DIM)
