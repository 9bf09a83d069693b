"""Pixel-statistics classifiers of tiny-world frames, calibrated on the world's own frames.

- **background**: the frame's per-channel median colour, nearest of the world's terrain colours
  (day and night variants; every night variant is the class ``night``);
- **sprite**: pixels that differ from that background's own texture by more than
  ``SPRITE_L1`` (sum of absolute RGB differences); their centroid is the sprite position and the
  majority of their nearest sprite colours (body or rim) its colour; the mask's fill of its
  bounding box tells the shape (square ~1, ball ~pi/4, triangle ~1/2);
- **frame statistics** (per-channel mean and std, sprite area) for the collapse check: a frame
  is in range when its statistics lie within what ``calibrate`` measured on world frames of the
  same background class (so a vanished sprite, a smeared or saturated frame is out of range).

Frames are uint8 ``[H, W, 3]`` or ``[n, H, W, 3]`` as the loop emits them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.tinyworld.vocab import BACKGROUNDS, COLOURS, SHAPES, TERRAINS, WorldSpec, prompt_text
from models.tinyworld.world import (
    RIM_SCALE,
    SPRITE_RGB,
    World,
    backgrounds,
    terrain_textures,
)

__all__ = ["FrameClassifier", "FrameReading", "StatsRange"]

SPRITE_L1 = 0.3
MIN_SPRITE_PX = 6


@dataclass(frozen=True, slots=True)
class FrameReading:
    """What one frame shows. ``colour``/``shape``/``centroid`` are None without a sprite."""

    background: str
    colour: str | None
    shape: str | None
    centroid: tuple[float, float] | None  # (x, y) pixels
    sprite_px: int
    stats: tuple[float, ...]  # mean r, g, b, std r, g, b, sprite area fraction


@dataclass(frozen=True, slots=True)
class StatsRange:
    """Per-statistic [low, high] seen on world frames, widened by ``margin`` of the span."""

    low: tuple[float, ...]
    high: tuple[float, ...]

    def contains(self, stats: tuple[float, ...]) -> bool:
        return all(lo <= s <= hi for s, lo, hi in zip(stats, self.low, self.high, strict=True))


class FrameClassifier:
    """Reads frames of one resolution (module docstring). Pure function of the world's look."""

    def __init__(self, height: int = 96, width: int = 96) -> None:
        self.height, self.width = height, width
        tex = terrain_textures(height, width)
        terrain = torch.arange(len(TERRAINS)).repeat(2)
        night = torch.arange(2 * len(TERRAINS)) >= len(TERRAINS)
        self._looks = backgrounds(tex, terrain, night)  # [10, 3, H, W] day then night
        self._centroids = self._looks.flatten(2).median(dim=2).values  # [10, 3]
        self._classes = [TERRAINS[t] for t in range(len(TERRAINS))] + ["night"] * len(TERRAINS)
        self._sprite_rgb = torch.cat((SPRITE_RGB, SPRITE_RGB * RIM_SCALE))  # [12, 3]
        self.stats_ranges: dict[str, StatsRange] = {}

    def read(self, frame: torch.Tensor) -> FrameReading:
        """frame: uint8 [H, W, 3] -> FrameReading."""
        img = frame.permute(2, 0, 1).float() / 255.0  # [3, H, W]
        median = img.flatten(1).median(dim=1).values
        look = int((self._centroids - median).abs().sum(dim=1).argmin())
        diff = (img - self._looks[look]).abs().sum(dim=0)  # [H, W]
        mask = diff > SPRITE_L1
        n = int(mask.sum())
        mean, std = img.flatten(1).mean(dim=1), img.flatten(1).std(dim=1)
        stats = (*mean.tolist(), *std.tolist(), n / (self.height * self.width))
        if n < MIN_SPRITE_PX:
            return FrameReading(self._classes[look], None, None, None, n, stats)
        ys, xs = torch.nonzero(mask, as_tuple=True)
        pixels = img[:, ys, xs].T  # [n, 3]
        nearest = torch.cdist(pixels, self._sprite_rgb).argmin(dim=1) % len(COLOURS)
        colour = COLOURS[int(torch.bincount(nearest, minlength=len(COLOURS)).argmax())]
        box = float((xs.max() - xs.min() + 1) * (ys.max() - ys.min() + 1))
        fill = n / box
        shape = "square" if fill > 0.9 else ("triangle" if fill < 0.64 else "ball")
        centroid = (float(xs.float().mean()) + 0.5, float(ys.float().mean()) + 0.5)
        return FrameReading(self._classes[look], colour, shape, centroid, n, stats)

    def calibrate(
        self, *, seeds: int = 2, frames: int = 24, margin: float = 0.1
    ) -> dict[str, StatsRange]:
        """Run the world over every prompt with keys and audio pulses; record each background
        class's statistics range (widened by ``margin`` of its span) as ``stats_ranges``."""
        rows = []
        for terrain in range(len(TERRAINS)):
            for colour in range(len(COLOURS)):
                for shape in range(len(SHAPES)):
                    for night in (False, True):
                        spec = WorldSpec(terrain, night, colour, shape)
                        for seed in range(seeds):
                            world = World(
                                prompt_text(spec), seed=seed, height=self.height, width=self.width
                            )
                            for i in range(frames):
                                world.advance(("wasd"[(i // 6 + seed) % 4],))
                                if i % 6 == 5:  # every sixth frame is read (only those render)
                                    frame = world.render(audio_energy=float(i % 5 == 0))
                                    reading = self.read(frame)
                                    rows.append((BACKGROUNDS[spec.background], reading.stats))
        ranges = {}
        for name in BACKGROUNDS:
            table = torch.tensor([stats for background, stats in rows if background == name])
            low, high = table.min(dim=0).values, table.max(dim=0).values
            pad = (high - low) * margin
            ranges[name] = StatsRange(tuple((low - pad).tolist()), tuple((high + pad).tolist()))
        self.stats_ranges = ranges
        return ranges

    def in_range(self, reading: FrameReading) -> bool:
        """The frame's statistics lie in its background class's calibrated range (calibrates on
        first use)."""
        ranges = self.stats_ranges or self.calibrate()
        return ranges[reading.background].contains(reading.stats)

    def matches(self, reading: FrameReading, spec: WorldSpec) -> bool:
        """Background class and sprite colour are what ``spec`` names."""
        return (
            reading.background == BACKGROUNDS[spec.background]
            and reading.colour == COLOURS[spec.colour]
        )
