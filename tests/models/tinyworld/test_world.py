"""The procedural world: prompts, motion under keys (inertia, walls), audio pulse, switches."""

from __future__ import annotations

import pytest
import torch

from models.loops.inputs import InputError
from models.tinyworld.vocab import BACKGROUNDS, WorldSpec, parse_prompt, prompt_text, word_ids
from models.tinyworld.world import World, terrain_textures


def test_prompts_parse_with_synonyms_defaults_and_night() -> None:
    assert parse_prompt("a purple triangle on snow at night") == WorldSpec(3, True, 5, 2)
    assert parse_prompt("A Violet PYRAMID on the glacier, dark") == WorldSpec(3, True, 5, 2)
    assert parse_prompt("a red ball on grass") == WorldSpec(0, False, 0, 0)
    assert parse_prompt("something else entirely") == WorldSpec(0, False, 0, 0)  # defaults
    assert parse_prompt("blue square on stone").background == BACKGROUNDS.index("stone")
    assert parse_prompt("blue square on stone at night").background == BACKGROUNDS.index("night")
    spec = WorldSpec(2, False, 3, 1)
    assert all(parse_prompt(prompt_text(spec, t)) == spec for t in range(4))


def test_word_ids_fold_synonyms_and_pad() -> None:
    assert word_ids("a crimson circle by the sea", 5) == word_ids("red ball water", 5)
    assert word_ids("", 3) == [0, 0, 0]
    assert len(word_ids("red green blue yellow white purple ball", 4)) == 4


def test_same_seed_same_frames_and_keys_move_the_sprite_with_inertia() -> None:
    a, b = World("a red ball on grass", seed=3), World("a red ball on grass", seed=3)
    frames_a = [a.step(["d"]) for _ in range(5)]
    frames_b = [b.step(["d"]) for _ in range(5)]
    assert all(torch.equal(x, y) for x, y in zip(frames_a, frames_b, strict=True))
    assert frames_a[0].shape == (96, 96, 3) and frames_a[0].dtype == torch.uint8
    start = World("a red ball on grass", seed=3).position.clone()
    assert a.position[0] > start[0] + 5 and abs(float(a.position[1] - start[1])) < 1e-4
    speed = float(a.velocity[0])
    a.step([])  # released: drift to rest, not a stop
    assert 0 < float(a.velocity[0]) < speed
    for _ in range(40):
        a.step([])
    assert float(a.velocity.abs().max()) < 0.01


@pytest.mark.parametrize(
    ("key", "axis", "sign"), [("w", 1, -1), ("a", 0, -1), ("s", 1, 1), ("d", 0, 1)]
)
def test_each_key_moves_its_way_and_walls_stop_it(key: str, axis: int, sign: int) -> None:
    world = World("a blue square on sand", seed=0)
    before = float(world.position[axis])
    world.step([key])
    world.step([key])
    assert (float(world.position[axis]) - before) * sign > 0
    for _ in range(60):
        world.step([key, "shift"])
    edge = float(world.position[axis])
    assert 9.0 < edge < 87.0  # inside the walls, against one of them
    assert float(world.velocity[axis]) == 0.0


def test_shift_sprints_and_unknown_keys_raise() -> None:
    walk, sprint = World("x", seed=1), World("x", seed=1)
    for _ in range(3):
        walk.step(["d"])
        sprint.step(["d", "shift"])
    assert float(sprint.position[0]) > float(walk.position[0]) + 1.0
    with pytest.raises(InputError):
        walk.step(["jump"])


def test_audio_pulses_the_sprite_and_prompt_switch_keeps_motion() -> None:
    world = World("a white ball on stone", seed=2)
    assert torch.equal(world.step(), world.step())  # at rest and silent: a still image
    calm = world.step(audio_energy=0.0)
    loud = world.step(audio_energy=1.0)
    background = (terrain_textures(96, 96)[4].permute(1, 2, 0) * 255).round()
    area = [int(((f.float() - background).abs().sum(-1) > 60).sum()) for f in (calm, loud)]
    assert area[1] > 1.6 * area[0]
    world.step(["d"])
    position, velocity = world.position.clone(), world.velocity.clone()
    world.set_prompt("a green triangle on water at night")
    frame = world.step(["d"])
    assert float(world.position[0]) > float(position[0]) and float(velocity[0]) > 0
    assert frame.float().mean() < 90  # night


def test_advancing_without_rendering_reaches_the_frames_stepping_shows() -> None:
    """``step`` is ``advance`` then ``render``: a caller that renders some frames only (the
    classifier's calibration) sees exactly the frames a stepped world shows."""
    stepped, advanced = World("a red ball on grass", seed=3), World("a red ball on grass", seed=3)
    for i in range(12):
        keys = ("d", "shift") if i < 6 else ("w",)
        frame = stepped.step(keys, audio_energy=float(i % 5 == 0))
        advanced.advance(keys)
        if i % 4 == 3:
            assert torch.equal(advanced.render(audio_energy=float(i % 5 == 0)), frame)
    assert torch.equal(advanced.position, stepped.position)
    assert advanced.frames == stepped.frames == 12
    assert not torch.equal(advanced.render(), World("a red ball on grass", seed=3).render())
