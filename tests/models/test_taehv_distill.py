"""``dreamrt train tiny-decoder``: its mechanics on CPU at tiny shapes (the tiny random card's own
rollouts and its full tiny VAE as teacher): the loss falls, the budget holds, the student saved
loads back through the loader, the CLI runs end to end and refuses what it cannot distil."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models.instance import load_instance
from models.registry import get
from models.wan.taehv.checkpoint import load_taehv
from models.wan.taehv.config import TAEHVConfig
from models.wan.taehv.decoder import TAEHVDecoder
from models.wan.taehv.distill import (
    DistillConfig,
    DistillError,
    PixelLoss,
    distill,
    draw_latent_clips,
    teacher_frames,
)
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.config import WanVAEConfig
from server.cli import _build_parser, main

CARD = "wan-tiny-taehv-random"


@pytest.fixture(scope="module")
def instance():
    return load_instance(get(CARD), device="cpu")


def test_latents_are_the_cards_own_rollout_and_targets_its_full_vae(instance) -> None:
    clips = draw_latent_clips(instance, ["a red kite"], 1, 2, seed=3)
    assert [tuple(c.shape) for c in clips] == [(1, 16, 6, 8, 8)]  # 2 chunks x 3 latent frames
    from models.tinyworld.evaluation.stream import LoopStream

    stream = LoopStream(instance, "a red kite", seed=3)
    stream.next_chunk()
    assert torch.equal(clips[0][:, :, :3], stream.state.latents)  # the session's own latents
    teacher = WanVAE(WanVAEConfig.preset(instance.card.components["vae"].preset)).eval()
    frames = teacher_frames(teacher, clips[0], chunk=3)
    with torch.no_grad():
        whole = teacher.decode(teacher.denormalize(clips[0]))
    assert frames.shape == (1, 3, 21, 64, 64)  # first latent frame -> 1 frame, the rest -> 4
    assert torch.allclose(frames, whole, atol=1e-5)


def test_pixel_loss_weighs_each_term() -> None:
    target = torch.zeros(1, 3, 2, 4, 4)
    pred = torch.zeros(1, 3, 2, 4, 4)
    pred[..., 0, 0] = 1.0  # one bright pixel per frame: a flat error would hide the edge
    total, parts = PixelLoss(l1=1.0, mse=0.0, structure=0.0)(pred, target)
    assert total.item() == pytest.approx(parts["l1"]) == pytest.approx(1 / 16)
    total, parts = PixelLoss(l1=0.0, mse=0.0, structure=1.0)(pred, target)
    assert parts["structure"] > 0 and total.item() == pytest.approx(parts["structure"])
    assert PixelLoss()(target, target)[0].item() == 0.0


def test_distillation_lowers_the_loss_and_saves_a_loadable_student(tmp_path, instance) -> None:
    config = DistillConfig(steps=16, clips=2, chunks_per_clip=1, lr=2e-3, crop_latent=None)
    out = tmp_path / "tiny_decoder" / "tiny_decoder.safetensors"
    summary = distill(get(CARD), config, out=out, instance=instance)
    assert summary["steps"] == 16 and (summary["clips"], summary["held_out"]) == (2, 1)
    assert summary["loss_last"] < summary["loss_first"]
    assert summary["psnr_after_db"] > summary["psnr_before_db"]  # on the held-out clip
    student = load_taehv(out)  # config from the file's metadata
    assert student.config == TAEHVConfig.preset("tiny")
    torch.manual_seed(config.seed)
    untrained = TAEHVDecoder(student.config)
    assert not torch.equal(student.decoder.conv_in.weight, untrained.decoder.conv_in.weight)
    assert json.loads(summary["student"]) == json.loads(student.config.to_json())


class TickingClock:
    """A clock that advances ``tick_s`` at every reading, whatever the machine's speed: the
    recipe's budget logic is then exact and independent of how loaded the CPU is."""

    def __init__(self, tick_s: float) -> None:
        self.now, self.tick_s = 0.0, tick_s

    def __call__(self) -> float:
        self.now += self.tick_s
        return self.now


def test_the_budget_bounds_the_run(tmp_path, instance) -> None:
    # the latents stop once their deadline passed (after at least one clip) ...
    clips = draw_latent_clips(
        instance, ["a"], 5, 1, seed=0, deadline=0.3, clock=TickingClock(0.125)
    )
    assert len(clips) == 3  # read at 0.125, 0.25: go on; at 0.375: stop
    # ... and training stops where the next step and the final evaluation would not fit
    config = DistillConfig(steps=10**6, budget_s=2.0, clips=2, chunks_per_clip=1, crop_latent=4)
    summary = distill(
        get(CARD),
        config,
        out=tmp_path / "s.safetensors",
        instance=instance,
        clock=TickingClock(0.125),
    )
    assert 0 < summary["steps"] < 10**6
    assert summary["wall_s"] <= config.budget_s
    assert (tmp_path / "s.safetensors").is_file()


def test_the_cli_runs_the_recipe_and_refuses_what_it_cannot_distil(tmp_path, capsys) -> None:
    args = _build_parser().parse_args(
        ["train", "tiny-decoder", "--card", CARD, "--device", "cpu", "--budget-s", "30"]
    )
    assert (args.command, args.model, args.card, args.budget_s, args.steps) == (
        "train",
        "tiny-decoder",
        CARD,
        30.0,
        2000,
    )
    out = tmp_path / "student.safetensors"
    argv = ["train", "tiny-decoder", "--card", CARD, "--device", "cpu", "--steps", "2"]
    argv += ["--clips", "2", "--chunks-per-clip", "1", "--crop", "4", "--out", str(out)]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2 and out.is_file()
    bad = ["train", "tiny-decoder", "--card", CARD, "--device", "cpu", "--student-preset", "huge"]
    assert main(bad) == 1
    assert "unknown TAEHV preset 'huge'" in capsys.readouterr().err
    assert main(["train", "tiny-decoder", "--card", "nope", "--device", "cpu"]) == 1
    with pytest.raises(DistillError, match="clips=1 must exceed held_out=1"):
        DistillConfig(clips=1)


def test_the_tiny_world_parsers_still_parse(tmp_path: Path) -> None:
    args = _build_parser().parse_args(["train", "tiny-world", "--out", str(tmp_path)])
    assert (args.model, args.budget_s) == ("tiny-world", 400.0) and callable(args.handler)
    args = _build_parser().parse_args(["eval", "tiny-world", "--rollouts", "3"])
    assert (args.model, args.rollouts) == ("tiny-world", 3)
