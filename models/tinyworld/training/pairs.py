"""Training pairs: one target chunk of a clip with the context chunk before it (trainer, probe).

A ``Pair`` holds what the pair forward (``teacher_forcing.pair_prediction``) needs for each clip:
the clean context chunk, the clean target chunk, the inputs each chunk was latched with, the
text, and the context's sprite coverage (where the keys move things). ``near_sprite_mask``
dilates that coverage into the region the trainer weights and the action probe scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.tinyworld.geometry import CHUNK_FRAMES
from models.tinyworld.training.data import Clips

__all__ = ["Pair", "near_sprite_mask"]


@dataclass(frozen=True, slots=True)
class Pair:
    """Per clip: a target chunk and its context chunk, with the inputs each was latched with.

    context, target: [B, 3, c, H, W]; action: [B, 2, A] (context's, target's chunk);
    action_on: [B, 2]; audio: [B, 2c, AUDIO_DIM]; audio_on: [B, 2]; has_context: [B];
    words: [B, L]; near_sprite: [B, H, W] the context's last-frame sprite coverage (0 without
    context).
    """

    context: torch.Tensor
    target: torch.Tensor
    has_context: torch.Tensor
    action: torch.Tensor
    action_on: torch.Tensor
    audio: torch.Tensor
    audio_on: torch.Tensor
    words: torch.Tensor
    near_sprite: torch.Tensor

    @classmethod
    def of(cls, clips: Clips, target: torch.Tensor) -> Pair:
        """target: [B] chunk index; its context is the chunk before (none for chunk 0)."""
        b, ch, f, h, w = clips.frames.shape
        c = CHUNK_FRAMES
        rows = torch.arange(b, device=target.device)
        before = (target - 1).clamp_min(0)
        has = (target > 0).float()
        chunks = clips.frames.view(b, ch, f // c, c, h, w)
        audio = clips.audio.view(b, f // c, c, -1)
        return cls(
            context=chunks[rows, :, before],
            target=chunks[rows, :, target],
            has_context=has,
            action=torch.stack((clips.action[rows, before], clips.action[rows, target]), 1),
            action_on=torch.stack(
                (clips.action_on[rows, before] * has, clips.action_on[rows, target]), 1
            ),
            audio=torch.cat((audio[rows, before], audio[rows, target]), dim=1),
            audio_on=torch.stack(
                (clips.audio_on[rows, before] * has, clips.audio_on[rows, target]), 1
            ),
            words=clips.words,
            near_sprite=clips.sprite.view(b, f // c, c, h, w)[rows, before, -1]
            * has[:, None, None],
        )

    def select(self, index: torch.Tensor) -> Pair:
        """The pairs at ``index`` ([n] long)."""
        return Pair(
            *(
                t.index_select(0, index)
                for t in (
                    self.context,
                    self.target,
                    self.has_context,
                    self.action,
                    self.action_on,
                    self.audio,
                    self.audio_on,
                    self.words,
                    self.near_sprite,
                )
            )
        )

    def with_context(self, context: torch.Tensor) -> Pair:
        return Pair(
            context,
            self.target,
            self.has_context,
            self.action,
            self.action_on,
            self.audio,
            self.audio_on,
            self.words,
            self.near_sprite,
        )

    def with_action(self, action: torch.Tensor) -> Pair:
        return Pair(
            self.context,
            self.target,
            self.has_context,
            action,
            self.action_on,
            self.audio,
            self.audio_on,
            self.words,
            self.near_sprite,
        )


def near_sprite_mask(pair: Pair, reach_px: int) -> torch.Tensor:
    """-> [B, 1, 1, H, W] in [0, 1]: the context's sprite coverage dilated by ``reach_px``
    (a square max filter; 1 wherever a fully covered sprite pixel is that close)."""
    near = torch.nn.functional.max_pool2d(pair.near_sprite[:, None], 2 * reach_px + 1, 1, reach_px)
    return near[:, :, None]
