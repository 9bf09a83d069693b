"""The recipe runs end to end on a CPU: the loss falls, both phases run, the checkpoint loads."""

from __future__ import annotations

import json

import pytest
import torch

from models.tinyworld.components import load_checkpoint
from models.tinyworld.config import dit_preset
from models.tinyworld.data import ClipSampler
from models.tinyworld.prediction import PixelDiT
from models.tinyworld.train import PHASE1_FILE, TrainConfig, train


@pytest.mark.slow
def test_a_short_run_learns_and_writes_a_loadable_checkpoint(tmp_path) -> None:
    cfg = TrainConfig(preset="tinyworld-test", batch=4, height=32, width=32, max_steps=40,
                      budget_s=600.0, warmup_steps=5, log_every=5, self_rollout_from=0.5)
    summary = train(cfg, device="cpu", out_dir=tmp_path)
    assert summary["steps"] == 40 and summary["clips_seen"] == 160
    log = json.loads((tmp_path / "train_log.json").read_text())["log"]
    assert [r["step"] for r in log] == list(range(5, 45, 5))
    assert [r["self_rollout"] for r in log] == [0.0] * 4 + [1.0] * 4
    assert log[-1]["loss"] < 0.7 * log[0]["loss"], [r["loss"] for r in log]
    dit, _, text, recipe = load_checkpoint(tmp_path / "tiny-world.safetensors")
    assert isinstance(dit, PixelDiT)
    assert dit.config.replace(name="x") == dit_preset("tinyworld-test").replace(name="x")
    assert recipe["steps"] == 40 and recipe["config"]["batch"] == 4
    assert text.encode(["a red ball"]).shape == (1, 8, 16)
    assert (tmp_path / PHASE1_FILE).is_file()


def test_clips_follow_the_keys_and_mark_switches() -> None:
    sampler = ClipSampler(num_chunks=3, chunk_frames=4, height=32, width=32, text_len=8,
                          device="cpu", seed=3, switch_p=1.0)
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
