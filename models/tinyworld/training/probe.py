"""The action probe: does the model use the keys? A cheap teacher-forced measurement.

On a fixed batch of training pairs whose target chunk holds a direction key, the x0 error
near the context's sprite (where the keys move things) is measured twice at the sigmas where
a chunk's motion is decided (the sampler's first steps): with the true target-chunk action, and
with its direction keys rotated a quarter turn (w -> d -> s -> a -> w). A model that ignores the
action scores the same both ways (probe 0); one that follows it predicts worse with the wrong
keys (probe > 0). Reported::

    probe        = err(rotated) - err(true)        all pairs
    probe_rest   = the same over pairs whose context sprite is at rest (moves < 1 px over the
                   context chunk): starting motion, which the evaluation's key trials need
    err_true     = err(true)                       the near-sprite x0 MSE itself

Errors are mean squared x0 errors in [-1, 1] pixel units over the near-sprite region.
Deterministic: the batch and the noise come from ``seed``.
"""

from __future__ import annotations

import torch

from models.loops.inputs import ACTION_KEYS
from models.tinyworld.geometry import CHUNK_FRAMES, SCHEDULE
from models.tinyworld.prediction import PixelDiT
from models.tinyworld.text import WordTextEncoder
from models.tinyworld.training.data import ClipSampler
from models.tinyworld.training.pairs import Pair, near_sprite_mask
from models.tinyworld.training.teacher_forcing import pair_prediction

__all__ = ["PROBE_SIGMAS", "ActionProbe", "rotate_keys"]

PROBE_SIGMAS = (1.0, 0.75)
_DIRECTION_KEYS = tuple(ACTION_KEYS.index(k) for k in ("w", "d", "s", "a"))  # clockwise
_REST_PX = 1.0


def rotate_keys(action: torch.Tensor) -> torch.Tensor:
    """A quarter turn clockwise of the direction keys (w -> d -> s -> a -> w); other entries
    unchanged. action: [..., ACTION_DIM] -> [..., ACTION_DIM]."""
    out = action.clone()
    for i, src in enumerate(_DIRECTION_KEYS):
        out[..., _DIRECTION_KEYS[(i + 1) % 4]] = action[..., src]
    return out


def _centroid(alpha: torch.Tensor) -> torch.Tensor:
    # alpha: [B, H, W] -> [B, 2] (x, y) pixels
    h, w = alpha.shape[-2:]
    ys = torch.arange(h, dtype=alpha.dtype, device=alpha.device)[:, None]
    xs = torch.arange(w, dtype=alpha.dtype, device=alpha.device)[None, :]
    mass = alpha.sum(dim=(1, 2)).clamp_min(1e-6)
    return torch.stack(
        ((alpha * xs).sum(dim=(1, 2)) / mass, (alpha * ys).sum(dim=(1, 2)) / mass), dim=1
    )


class ActionProbe:
    """A fixed probe batch (module docstring); ``measure`` scores a DiT and text encoder.

    ``pairs`` clips are drawn; those whose target chunk holds a direction key (about two
    thirds) are kept. ``reach_px`` is the near-sprite region's reach (the trainer's).
    """

    def __init__(
        self,
        *,
        pairs: int,
        height: int,
        width: int,
        text_len: int,
        device: torch.device | str,
        reach_px: int,
        seed: int = 12_345,
    ) -> None:
        self.device = torch.device(device)
        sampler = ClipSampler(
            num_chunks=3,
            chunk_frames=CHUNK_FRAMES,
            height=height,
            width=width,
            text_len=text_len,
            device=self.device,
            seed=seed,
            switch_p=0.0,
        )
        clips = sampler.sample(pairs)
        g = torch.Generator(device=self.device).manual_seed(seed)
        target = 1 + torch.randint(2, (pairs,), generator=g, device=self.device)
        pair = Pair.of(clips, target)
        held = pair.action[:, 1, list(_DIRECTION_KEYS)].sum(dim=1) > 0
        ctx = clips.sprite.view(pairs, -1, CHUNK_FRAMES, height, width)
        rows = torch.arange(pairs, device=self.device)
        moved = _centroid(ctx[rows, target - 1, -1]) - _centroid(ctx[rows, target - 1, 0])
        keep = (held & (clips.loss_mask[rows, target] > 0)).nonzero().flatten()
        self.pair = pair.select(keep)
        self.rest = (moved.norm(dim=1) < _REST_PX)[keep]
        self.region = near_sprite_mask(self.pair, reach_px)  # [n, 1, 1, H, W]
        self.noise = torch.randn(self.pair.target.shape, generator=g, device=self.device)

    @property
    def size(self) -> int:
        return int(self.pair.target.shape[0])

    @torch.no_grad()
    def _errors(
        self, dit: PixelDiT, text: torch.Tensor, pair: Pair, sigma: float, autocast: bool
    ) -> torch.Tensor:
        # -> [n] near-sprite x0 MSE per pair
        xt = (1 - sigma) * pair.target + sigma * self.noise
        t = torch.full((self.size,), sigma * SCHEDULE.num_train_timesteps, device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
            x0 = pair_prediction(
                dit,
                pair.context,
                xt,
                t,
                text,
                pair.has_context,
                action=pair.action,
                action_on=pair.action_on,
                audio=pair.audio,
                audio_on=pair.audio_on,
            )
        sq = (x0.float() - pair.target).square() * self.region
        return sq.sum(dim=(1, 2, 3, 4)) / (
            self.region.sum(dim=(1, 2, 3, 4)) * 3 * CHUNK_FRAMES
        ).clamp_min(1.0)

    def measure(self, dit: PixelDiT, text_encoder: WordTextEncoder) -> dict[str, object]:
        """-> {"probe", "probe_rest", "err_true", "pairs", "rest_pairs"} (module docstring)."""
        was_training = dit.training
        dit.eval()
        autocast = self.device.type == "cuda"
        with torch.no_grad():
            text = text_encoder.embed(self.pair.words)
        rotated = self.pair.with_action(
            torch.stack((self.pair.action[:, 0], rotate_keys(self.pair.action[:, 1])), dim=1)
        )
        true = torch.stack(
            [self._errors(dit, text, self.pair, s, autocast) for s in PROBE_SIGMAS]
        ).mean(0)
        wrong = torch.stack(
            [self._errors(dit, text, rotated, s, autocast) for s in PROBE_SIGMAS]
        ).mean(0)
        dit.train(was_training)
        diff = wrong - true
        rest = diff[self.rest]
        return {
            "probe": float(diff.mean()),
            "probe_rest": float(rest.mean()) if rest.numel() else 0.0,
            "err_true": float(true.mean()),
            "pairs": self.size,
            "rest_pairs": int(rest.numel()),
        }
