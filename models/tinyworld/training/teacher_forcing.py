"""The trainer's forward: one chunk predicted against one clean context chunk, as the loop does.

``chunk_rollout`` with tiny-world's window (one cached chunk, no sinks) generates chunk k
against the K/V of chunk k - 1, which the KV-update pass wrote by running the clean chunk
k - 1 at t = 0 (attending to itself and its own window). The trainer reproduces a pair of
chunks in one pass over a doubled sequence::

    tokens:    [ context (c frames, t = 0) | target (c frames, noisy, t = sigma * 1000) ]
    RoPE:        positions 0 .. c-1           positions c .. 2c-1
    attention:   context -> context           target -> context (if the sample has one)
                                              target -> target

so the target's output equals the head output of ``forward_chunk`` after the KV update of the
context chunk (``tests/models/tinyworld/test_teacher_forcing.py``: the card's C1 parity). What
the pair leaves out is the context chunk's own window (in a stream its K/V also saw chunk
k - 2): the recipe's one approximation, chosen because a pair costs 288 tokens where a 4-chunk
clip costs 1152 on the CPU the recipe can run on. A sample without context (``has_context`` 0)
is a stream's first chunk. Action and audio hooks take on/off flags: "off" is the loop's
``None`` (the hook adds nothing), which differs from an all-zero vector.

Built from the DiT's public sub-modules (patch/time/action/audio/position embeddings, blocks,
head); the small pieces of ``WanDiT`` internals repeated here are pinned by that parity test.
"""

from __future__ import annotations

import torch

from models.tinyworld.prediction import PixelDiT
from models.wan.dit.conditioning import sinusoidal_embedding
from models.wan.dit.rope import rope_cos_sin

__all__ = ["TeacherForcingShapeError", "pair_mask", "pair_prediction"]


class TeacherForcingShapeError(ValueError):
    """Inputs whose shapes disagree (the message names them)."""


def pair_mask(has_context: torch.Tensor, tokens_per_chunk: int) -> torch.Tensor:
    """has_context: [B] 0/1 -> [B, 1, 2T, 2T] bool attention mask (True = attend)."""
    t = tokens_per_chunk
    target = torch.arange(2 * t, device=has_context.device) >= t
    q, k = target[:, None], target[None, :]
    base = q == k  # context <-> context, target <-> target
    cross = (q & ~k)[None] & has_context.bool()[:, None, None]  # target -> context
    return (base[None] | cross)[:, None]


def _hook(
    module: torch.nn.Module | None, x: torch.Tensor | None, on: torch.Tensor | None, name: str
) -> torch.Tensor | None:
    # x: [B, n, in]; on: [B, n] 0/1 -> [B, n, dim] masked hook output, or None without input
    if x is None:
        return None
    if module is None:
        raise TeacherForcingShapeError(f"{name} given but the DiT has no {name} hook")
    out = module(x.to(next(module.parameters()).dtype))  # its first linear's
    return out if on is None else out * on[..., None].to(out.dtype)


def pair_prediction(
    dit: PixelDiT,
    context: torch.Tensor,
    noisy: torch.Tensor,
    timestep: torch.Tensor,
    text: torch.Tensor,
    has_context: torch.Tensor,
    *,
    action: torch.Tensor | None = None,
    action_on: torch.Tensor | None = None,
    audio: torch.Tensor | None = None,
    audio_on: torch.Tensor | None = None,
) -> torch.Tensor:
    """The head's prediction (x0 for a ``PixelDiT``) for the target chunk.

    context, noisy: [B, C, c, H, W]; timestep: [B] (0..1000, the target's); text:
    [B, L, text_dim]; has_context: [B] 0/1; action: [B, 2, action_dim] (context's, target's
    chunk action), action_on: [B, 2]; audio: [B, 2c, audio_dim] per frame, audio_on: [B, 2]
    -> [B, C, c, H, W]
    """
    cfg = dit.config
    b, _, c, height, width = noisy.shape
    if context.shape != noisy.shape:
        raise TeacherForcingShapeError(
            f"context {tuple(context.shape)} and noisy {tuple(noisy.shape)} must match"
        )
    if timestep.shape != (b,) or has_context.shape != (b,):
        raise TeacherForcingShapeError(
            f"timestep {tuple(timestep.shape)} and has_context {tuple(has_context.shape)} "
            f"must be [B={b}]"
        )
    pt, ph, pw = cfg.patch_size
    grid = (2 * c // pt, height // ph, width // pw)
    per_frame = grid[1] * grid[2]

    # tokens: patch embedding (+ audio per frame) of context then target -> [B, 2T, dim]
    weight = dit.patch_embedding.weight
    both = torch.cat((context, noisy), dim=2).to(weight.dtype)  # [B, C, 2c, H, W]
    tokens = dit.patch_embedding(both).flatten(2).transpose(1, 2)
    frame_on = None if audio_on is None else audio_on.repeat_interleave(c, dim=1)
    sound = _hook(dit.audio_embedding, audio, frame_on, "audio")  # [B, 2c, dim]
    if sound is not None:
        tokens = (tokens.unflatten(1, (2 * c, per_frame)) + sound[:, :, None]).flatten(1, 2)
    tokens = tokens + dit.position_tokens(grid, tokens.device).to(tokens.dtype)

    # time (+ action) embedding per chunk -> e [B, 2, dim], e0 [B, 2, 6, dim]
    t = torch.stack((torch.zeros_like(timestep), timestep), dim=1).float()  # [B, 2]
    feats = sinusoidal_embedding(t.flatten(), cfg.freq_dim).unflatten(0, t.shape)
    e = dit.time_embedding(feats.to(dit.time_embedding[0].weight.dtype))
    act = _hook(dit.action_embedding, action, action_on, "action")  # [B, 2, dim]
    if act is not None:
        e = e + act
    e0 = dit.time_projection(e.to(dit.time_projection[1].weight.dtype)).unflatten(-1, (6, cfg.dim))
    e = e.repeat_interleave(c * per_frame, dim=1)  # [B, 2T, dim]
    e0 = e0.repeat_interleave(c * per_frame, dim=1)  # [B, 2T, 6, dim]

    cos, sin = rope_cos_sin(cfg.rope_split(), grid, 0, cfg.rope_theta, tokens.device)
    mask = pair_mask(has_context, c * per_frame)
    cross = dit.cross_kv(text)
    x = tokens
    for index, block in enumerate(dit.blocks):
        x, _, _ = block(x, e0, cos, sin, cross.k[index], cross.v[index], None, mask)
    half = x.shape[1] // 2
    y = dit.head(x[:, half:], e[:, half:])  # [B, T, C * pt * ph * pw]
    y = y.reshape(b, grid[0] // 2, grid[1], grid[2], pt, ph, pw, cfg.out_channels)
    y = y.permute(0, 7, 1, 4, 2, 5, 3, 6)  # [B, C, f, pt, h, ph, w, pw]
    return y.reshape(b, cfg.out_channels, c, height, width)
