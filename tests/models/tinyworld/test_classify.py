"""The evaluation's pixel classifiers read the world's own frames correctly."""

from __future__ import annotations

import torch

from models.tinyworld.evaluation.classify import FrameClassifier
from models.tinyworld.vocab import BACKGROUNDS, SHAPES, WorldSpec, prompt_text
from models.tinyworld.world import World


def test_background_colour_shape_and_centroid_of_every_look() -> None:
    cls = FrameClassifier()
    wrong, shapes = [], 0
    for terrain in range(5):
        for colour in range(6):
            for shape in range(3):
                spec = WorldSpec(terrain, (terrain + colour) % 3 == 0, colour, shape)
                world = World(prompt_text(spec), seed=terrain * 7 + colour)
                for _ in range(8):
                    frame = world.step(["d", "s"])
                reading = cls.read(frame)
                if not cls.matches(reading, spec):
                    wrong.append((spec.describe(), reading))
                shapes += reading.shape == SHAPES[shape]
                x, y = reading.centroid
                assert abs(x - float(world.position[0])) < 1.0
                assert abs(y - float(world.position[1])) < 1.0
    assert wrong == []
    assert shapes >= 88  # of 90


def test_stats_ranges_accept_world_frames_and_reject_collapse() -> None:
    cls = FrameClassifier()
    ranges = cls.calibrate(seeds=1, frames=12)
    assert set(ranges) == set(BACKGROUNDS)
    world = World("a yellow triangle on water", seed=4)
    frames = [world.step(["a"], audio_energy=float(i % 3 == 0)) for i in range(12)]
    assert all(cls.in_range(cls.read(f)) for f in frames)
    grey = torch.full((96, 96, 3), 128, dtype=torch.uint8)  # a washed-out frame
    assert not cls.in_range(cls.read(grey))
    no_sprite = World("a red ball on grass", seed=0)
    empty = no_sprite.step()
    empty[:] = (cls._looks[0].permute(1, 2, 0) * 255).round().to(torch.uint8)
    reading = cls.read(empty)
    assert reading.colour is None and not cls.in_range(reading)
