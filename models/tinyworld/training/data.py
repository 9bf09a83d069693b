"""Training clips of the tiny world, rendered on the fly on the training device.

A clip is K chunks of c frames of one stream, with what the loop would have latched per chunk::

    start state | chunk 0 | chunk 1 | ... | chunk K-1
                             ^ prompt switch at a random boundary (30 % of clips): new look,
                               same motion

- start state: ``fresh_p`` of clips start a stream (at rest near the centre, as the World
  does); the rest start mid-stream, anywhere in the arena, moving (``moving_p`` of them, up to
  1.2 x terminal speed in a random direction) or at rest.
- keys per chunk: a chunk keeps the previous chunk's keys with probability ``hold_p`` (held
  like a player holds them), else draws new ones; shift sprints; space/q/e and the
  mouse appear but move nothing. An "off" chunk (the loop's ``None``: no action arrived) moves
  nothing either, as does an empty key set.
- audio per frame: silence, faint noise or bursts (``audio_features`` scale); "off" chunks have
  no audio (the loop's ``None``) and no pulse.
- contrast groups (``contrast_p`` of the rows, in groups of ``contrast``): copies of one clip
  that differ only in the keys of the last chunk, drawn afresh for each copy: the same context
  continued under different keys, so the keys alone explain how the targets differ.
- text: the word ids of the *final* prompt (a switched clip's earlier chunks still show the old
  look: after a switch the loop re-caches those frames under the new prompt, exactly this).
- ``loss_mask`` [B, K]: 0 for chunks before a switch (their look contradicts the text) and for
  chunk 0 of a clip that starts mid-stream (no context could tell where the sprite is).

Everything is drawn from one ``torch.Generator``, so a seed fixes the whole data stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.loops.inputs import ACTION_DIM, ACTION_KEYS, AUDIO_DIM
from models.tinyworld.vocab import COLOURS, SHAPES, TERRAINS, WorldSpec, prompt_text, word_ids
from models.tinyworld.world import (
    PHYSICS,
    Physics,
    action_direction,
    audio_energy,
    render_layers,
    simulate,
)

__all__ = ["ClipSampler", "Clips"]

_MOVE_KEYS = ("w", "a", "s", "d")
_OTHER_KEYS = ("space", "q", "e")


@dataclass(frozen=True, slots=True)
class Clips:
    """A batch of clips (shapes: B clips, K chunks, F = K * c frames, L text length)."""

    frames: torch.Tensor  # [B, 3, F, H, W] in [-1, 1] (the DiT's pixel latents)
    sprite: torch.Tensor  # [B, F, H, W] sprite coverage in [0, 1]
    action: torch.Tensor  # [B, K, ACTION_DIM]
    action_on: torch.Tensor  # [B, K] 1 = an action vector was latched
    audio: torch.Tensor  # [B, F, AUDIO_DIM]
    audio_on: torch.Tensor  # [B, K]
    words: torch.Tensor  # [B, L] long
    loss_mask: torch.Tensor  # [B, K]
    fresh: torch.Tensor  # [B] bool: the clip starts a stream (chunk 0 has no context)
    contrast: torch.Tensor  # [B] bool: in a contrast group (only the last chunk's keys differ)


class ClipSampler:
    """Draws ``Clips`` for a stream geometry (see module docstring) on ``device``."""

    def __init__(
        self,
        *,
        num_chunks: int,
        chunk_frames: int,
        height: int,
        width: int,
        text_len: int,
        device: torch.device | str,
        seed: int = 0,
        physics: Physics = PHYSICS,
        switch_p: float = 0.3,
        fresh_p: float = 0.25,
        moving_p: float = 0.6,
        hold_p: float = 0.55,
        contrast: int = 1,
        contrast_p: float = 0.0,
    ) -> None:
        from models.tinyworld.world import terrain_textures

        self.k, self.c, self.h, self.w = num_chunks, chunk_frames, height, width
        self.text_len, self.device, self.physics = text_len, torch.device(device), physics
        self.switch_p, self.fresh_p = switch_p, fresh_p
        self.moving_p, self.hold_p = moving_p, hold_p
        if contrast < 1 or not 0.0 <= contrast_p <= 1.0:
            raise ValueError(
                f"contrast groups of {contrast} clips for a share {contrast_p}: "
                f"need a group size >= 1 and a share in [0, 1]"
            )
        self.contrast, self.contrast_p = contrast, contrast_p
        self.textures = terrain_textures(height, width, self.device)
        self.g = torch.Generator(device=self.device).manual_seed(seed)
        self.cpu_g = torch.Generator().manual_seed(seed + 1)

    # ---------------------------------------------------------------------------------------

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.g, device=self.device)

    def _randint(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(high, shape, generator=self.g, device=self.device)

    def _actions(self, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-chunk action vectors held like a player holds keys -> [b, n, A], on [b, n]."""
        acts, ons = [], []
        prev = torch.zeros((b, ACTION_DIM), device=self.device)
        for chunk in range(n):
            fresh = torch.zeros((b, ACTION_DIM), device=self.device)
            kind = self._rand(b)
            first = self._randint(4, b)
            second = (first + 1 + 2 * self._randint(2, b)) % 4  # a perpendicular key
            rows = torch.arange(b, device=self.device)
            moving = kind >= 0.3
            fresh[rows[moving], first[moving]] = 1.0
            diagonal = kind >= 0.85
            fresh[rows[diagonal], second[diagonal]] = 1.0
            opposite = (kind >= 0.80) & (kind < 0.85)  # cancelling keys: no motion
            fresh[rows[opposite], (first[opposite] + 2) % 4] = 1.0
            fresh[:, ACTION_KEYS.index("shift")] = (moving & (self._rand(b) < 0.25)).float()
            for key in _OTHER_KEYS:
                fresh[:, ACTION_KEYS.index(key)] = (self._rand(b) < 0.08).float()
            mouse = self._rand(b) < 0.2
            fresh[:, -2:] = (self._rand(b, 2) * 2 - 1) * mouse[:, None]
            keep = ((self._rand(b) < self.hold_p) & (chunk > 0))[:, None]  # chunk 0 draws
            act = torch.where(keep, prev, fresh)
            # "off" (no action arrived) is only possible when nothing is held
            idle = act[:, : len(_MOVE_KEYS)].sum(dim=1) == 0
            on = torch.where(idle & (self._rand(b) < 0.5), 0.0, 1.0)
            act = act * on[:, None]
            acts.append(act)
            ons.append(on)
            prev = act
        return torch.stack(acts, dim=1), torch.stack(ons, dim=1)

    def _audio(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> features [b, F, AUDIO_DIM], on [b, K]."""
        f = self.k * self.c
        mode = self._rand(b, 1)
        level = torch.relu(
            torch.cumsum(self._rand(b, f) - 0.5, dim=1) * 0.8 + self._rand(b, 1) * 3.0 - 1.0
        )  # random bursts
        level = torch.where(mode < 0.55, torch.zeros_like(level), level)
        level = torch.where((mode >= 0.55) & (mode < 0.7), self._rand(b, f) * 0.4, level)
        feats = (level[..., None] * (0.8 + 0.4 * self._rand(b, f, AUDIO_DIM))).clamp(0.0, 4.5)
        on = (self._rand(b, self.k) < 0.85).float() * (mode >= 0.4).float()
        feats = feats * on.repeat_interleave(self.c, dim=1)[..., None]
        return feats, on

    def _specs(self, b: int) -> torch.Tensor:
        """-> [b, 4] long (terrain, night, colour, shape)."""
        g = self.cpu_g
        return torch.stack(
            [
                torch.randint(len(TERRAINS), (b,), generator=g),
                (torch.rand(b, generator=g) < 0.25).long(),
                torch.randint(len(COLOURS), (b,), generator=g),
                torch.randint(len(SHAPES), (b,), generator=g),
            ],
            dim=1,
        )

    def _words(self, specs: torch.Tensor) -> torch.Tensor:
        ids = []
        for row in specs.tolist():
            spec = WorldSpec(row[0], bool(row[1]), row[2], row[3])
            template = int(torch.randint(8, (1,), generator=self.cpu_g))
            ids.append(word_ids(prompt_text(spec, template), self.text_len))
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    # ---------------------------------------------------------------------------------------

    def sample(self, batch: int) -> Clips:
        b, k, c, dev = batch, self.k, self.c, self.device
        f = k * c
        # motion: a fresh stream starts at rest near the centre; a mid-stream clip anywhere
        fresh = self._rand(b) < self.fresh_p
        jitter = (self._rand(b, 2) * 2 - 1) * self.physics.start_jitter * self.h
        start = torch.tensor([self.w / 2.0, self.h / 2.0], device=dev) + jitter
        margin = self.physics.radius_px * self.h / 96.0 + 2.0
        extent = torch.tensor([self.w - 2 * margin, self.h - 2 * margin], device=dev)
        anywhere = margin + self._rand(b, 2) * extent
        pos = torch.where(fresh[:, None], start, anywhere)
        terminal = self.physics.accel_px * self.h / 96.0 / (1.0 - self.physics.friction)
        angle = self._rand(b) * 2 * torch.pi
        speed = self._rand(b) * terminal * 1.2 * (self._rand(b) < self.moving_p) * ~fresh
        vel = torch.stack((angle.cos(), angle.sin()), dim=1) * speed[:, None]
        action, action_on = self._actions(b, k)
        audio, audio_on = self._audio(b)
        first, second = self._specs(b).to(dev), self._specs(b).to(dev)
        switch = torch.where(
            self._rand(b) < self.switch_p,
            1 + self._randint(k - 1, b),
            torch.full((b,), k, device=dev),
        )  # k = never
        # contrast groups: copies of one clip that differ only in the last chunk's keys
        src, contrast = self._groups(b)
        fresh, pos, vel, audio, audio_on, first, second, switch = (
            t[src] for t in (fresh, pos, vel, audio, audio_on, first, second, switch)
        )
        last, last_on = self._actions(b, 1)
        action = torch.cat(
            (action[src, :-1], torch.where(contrast[:, None, None], last, action[src, -1:])), dim=1
        )
        action_on = torch.cat(
            (action_on[src, :-1], torch.where(contrast[:, None], last_on, action_on[src, -1:])),
            dim=1,
        )
        direction, sprint = action_direction(action.repeat_interleave(c, dim=1))
        positions, _, _ = simulate(pos, vel, direction, sprint, self.h, self.w, self.physics)

        # looks: one spec, or two with a switch at chunk s
        frame_chunk = torch.arange(f, device=dev)[None, :] // c  # [1, F]
        after = frame_chunk >= switch[:, None]  # [B, F]
        look = torch.where(after[..., None], second[:, None], first[:, None])  # [B, F, 4]
        final = torch.where((switch < k)[:, None], second, first)
        frames, alpha = render_layers(
            self.textures,
            look[..., 0],
            look[..., 1].bool(),
            look[..., 2],
            look[..., 3],
            positions,
            audio_energy(audio),
            self.physics,
        )
        chunk = torch.arange(k, device=dev)[None, :]
        loss_mask = (chunk >= switch[:, None] * (switch < k)[:, None]).float()
        loss_mask = loss_mask * torch.where((chunk == 0) & ~fresh[:, None], 0.0, 1.0)
        return Clips(
            frames=frames.permute(0, 2, 1, 3, 4) * 2.0 - 1.0,
            sprite=alpha,
            action=action,
            action_on=action_on,
            audio=audio,
            audio_on=audio_on,
            words=self._words(final.cpu())[src.to(dev)],
            loss_mask=loss_mask,
            fresh=fresh,
            contrast=contrast,
        )

    def _groups(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> src [b] long (the clip each row copies), contrast [b] bool. The last
        ``contrast_p`` share of the rows form groups of ``contrast`` copies of their first row."""
        size = self.contrast
        grouped = int(round(b * self.contrast_p / size)) * size if size > 1 else 0
        rows = torch.arange(b, device=self.device)
        start = b - grouped
        src = torch.where(rows < start, rows, start + (rows - start) // size * size)
        return src, rows >= start
