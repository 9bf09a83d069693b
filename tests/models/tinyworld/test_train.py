"""The recipe runs end to end on a CPU: the loss falls, both phases run, the checkpoint loads."""

from __future__ import annotations

import json

import pytest
import torch

from models.tinyworld.components import load_checkpoint
from models.tinyworld.config import dit_preset
from models.tinyworld.prediction import PixelDiT
from models.tinyworld.training.data import ClipSampler
from models.tinyworld.training.recipe import PHASE1_FILE, TrainConfig, train


@pytest.mark.slow
def test_a_short_run_learns_and_writes_a_loadable_checkpoint(tmp_path) -> None:
    cfg = TrainConfig(
        preset="tinyworld-test",
        batch=4,
        height=32,
        width=32,
        max_steps=40,
        budget_s=600.0,
        warmup_steps=5,
        log_every=5,
        self_rollout_from=0.5,
        probe_every=20,
        probe_pairs=16,
        action_lr_mult=10.0,
    )
    summary = train(cfg, device="cpu", out_dir=tmp_path)
    assert summary["steps"] == 40 and summary["clips_seen"] == 160
    log = json.loads((tmp_path / "train_log.json").read_text())["log"]
    assert [r["step"] for r in log] == list(range(5, 45, 5))
    assert [r["self_rollout"] for r in log] == [0.0] * 4 + [1.0] * 4
    assert log[-1]["loss"] < 0.7 * log[0]["loss"], [r["loss"] for r in log]
    probes = json.loads((tmp_path / "train_log.json").read_text())["probe"]
    assert [(r["step"], r["weights"]) for r in probes] == [(0, "live"), (20, "live"), (40, "live")]
    assert probes[0]["probe"] == 0.0  # a seeded DiT's action hook is a no-op
    assert summary["final_probe"]["weights"] == "ema" and summary["final_probe"]["step"] == 40
    dit, _, text, recipe = load_checkpoint(tmp_path / "tiny-world.safetensors")
    assert isinstance(dit, PixelDiT)
    assert dit.config.replace(name="x") == dit_preset("tinyworld-test").replace(name="x")
    assert recipe["steps"] == 40 and recipe["config"]["batch"] == 4
    assert text.encode(["a red ball"]).shape == (1, 8, 16)
    assert (tmp_path / PHASE1_FILE).is_file()


def test_clips_follow_the_keys_and_mark_switches() -> None:
    sampler = ClipSampler(
        num_chunks=3,
        chunk_frames=4,
        height=32,
        width=32,
        text_len=8,
        device="cpu",
        seed=3,
        switch_p=1.0,
    )
    clips = sampler.sample(6)
    assert clips.frames.shape == (6, 3, 12, 32, 32) and clips.sprite.shape == (6, 12, 32, 32)
    assert float(clips.frames.min()) >= -1.0 and float(clips.frames.max()) <= 1.0
    # every clip switches at chunk 1 or 2: the chunks before it carry no loss
    switched_at = (clips.loss_mask > 0).float().argmax(dim=1)
    assert set(switched_at.tolist()) <= {1, 2}
    # an "off" action chunk holds no keys
    off = clips.action_on == 0
    assert torch.all(clips.action[off] == 0)
    assert bool((clips.sprite.flatten(2).amax(dim=2) > 0.99).all())  # a sprite in every frame


def test_hold_p_one_keeps_the_first_chunks_keys_for_the_whole_clip() -> None:
    sampler = ClipSampler(
        num_chunks=3,
        chunk_frames=4,
        height=32,
        width=32,
        text_len=8,
        device="cpu",
        seed=4,
        hold_p=1.0,
        moving_p=0.0,
    )
    clips = sampler.sample(32)
    held = clips.action[:, 0, :4].sum(dim=1) > 0  # a direction key in chunk 0
    assert int(held.sum()) >= 8
    assert torch.equal(clips.action[held, 1], clips.action[held, 0])
    assert torch.equal(clips.action[held, 2], clips.action[held, 0])
    changes = (
        ClipSampler(
            num_chunks=3,
            chunk_frames=4,
            height=32,
            width=32,
            text_len=8,
            device="cpu",
            seed=4,
            hold_p=0.0,
        )
        .sample(32)
        .action
    )
    assert not torch.equal(changes[:, 1], changes[:, 0])


def test_contrast_groups_share_everything_but_the_last_chunks_keys() -> None:
    sampler = ClipSampler(
        num_chunks=3,
        chunk_frames=4,
        height=32,
        width=32,
        text_len=8,
        device="cpu",
        seed=5,
        contrast=4,
        contrast_p=0.5,
    )
    clips = sampler.sample(16)
    assert clips.contrast.tolist() == [False] * 8 + [True] * 8
    for lead in (8, 12):
        group = slice(lead, lead + 4)
        first_two = clips.frames[group, :, :8]  # chunks 0 and 1: one clip, four copies
        assert torch.equal(first_two, first_two[:1].expand_as(first_two))
        assert torch.equal(clips.words[group], clips.words[lead : lead + 1].expand(4, -1))
        assert torch.equal(
            clips.action[group, :2], clips.action[lead : lead + 1, :2].expand(4, -1, -1)
        )
    last = clips.action[8:, 2]
    assert len({tuple(row.tolist()) for row in last}) > 2  # the keys of chunk 2 differ
    with pytest.raises(ValueError, match="contrast groups of 0"):
        ClipSampler(
            num_chunks=3, chunk_frames=4, height=32, width=32, text_len=8, device="cpu", contrast=0
        )
