"""Wan's 3D rotary position embedding, computed on the fly for any absolute position.

A head of ``head_dim`` channels is split into (frame, height, width) parts (``WanDiTConfig
.rope_split``); consecutive channel pairs (2i, 2i+1) of each part rotate by
``pos * theta**(-2i/d)``.
Angles are formed in float64 and only their cos/sin are rounded to float32, so a session at latent
frame 10^6 gets the same precision as one at frame 0 (Wan's own table stops at 1024 positions).
For positions < 1024 the values are bit-identical to diffusers' ``WanRotaryPosEmbed`` table.
"""

from __future__ import annotations

import torch

__all__ = ["apply_rope", "rope_cos_sin"]


def _axis_angles(
    channels: int, start: int, count: int, theta: float, device: torch.device
) -> torch.Tensor:
    # -> [count, channels // 2] float64 angles for positions start .. start + count - 1
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, channels, 2, dtype=torch.float64, device=device) / channels)
    )
    pos = torch.arange(start, start + count, dtype=torch.float64, device=device)
    return torch.outer(pos, inv_freq)


def rope_cos_sin(
    split: tuple[int, int, int],
    grid: tuple[int, int, int],
    frame_start: int,
    theta: float = 10000.0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the rotation for a token grid whose first frame is ``frame_start``.

    ``split`` is (frame, height, width) channels per head, ``grid`` the (frames, height, width)
    token grid after patching. Returns two float32 tensors ``[frames * height * width, D / 2]``
    in frame-major token order (the order of ``patch_embedding(x).flatten(2)``).
    """
    frames, height, width = grid
    dev = torch.device(device) if device is not None else torch.device("cpu")
    angles = (
        _axis_angles(split[0], frame_start, frames, theta, dev),  # [f, dt/2]
        _axis_angles(split[1], 0, height, theta, dev),  # [h, dh/2]
        _axis_angles(split[2], 0, width, theta, dev),  # [w, dw/2]
    )
    out = []
    for fn in (torch.cos, torch.sin):
        t, h, w = (fn(a).float() for a in angles)
        table = torch.cat(
            [
                t[:, None, None, :].expand(frames, height, width, -1),
                h[None, :, None, :].expand(frames, height, width, -1),
                w[None, None, :, :].expand(frames, height, width, -1),
            ],
            dim=-1,
        )  # [f, h, w, D/2]
        out.append(table.reshape(frames * height * width, -1))
    return out[0], out[1]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of ``x`` (computed in float32, returned in ``x``'s dtype).

    x: [B, N, H, D]; cos, sin: [N, D/2], or [B, N, D/2] (one position table per sample: a
    batch of sessions at different stream positions) -> [B, N, H, D]
    """
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, N, H, D/2, 2]
    x1, x2 = pairs[..., 0], pairs[..., 1]
    c = cos[None, :, None, :] if cos.ndim == 2 else cos[:, :, None, :]
    s = sin[None, :, None, :] if sin.ndim == 2 else sin[:, :, None, :]
    rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)  # [B, N, H, D/2, 2]
    return rotated.flatten(-2).type_as(x)
