"""``dreamrt train tiny-decoder --card CARD``: distil a TAEHV tiny decoder from a card's full VAE
on the card's own latents (``models.wan.taehv.distill``); prints a JSON summary.

Exit codes: 0 success, 1 the recipe could not run (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["add_recipe_parsers"]


def add_recipe_parsers(
    train_recipes: argparse._SubParsersAction,
    eval_recipes: argparse._SubParsersAction,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> None:
    """Add ``tiny-decoder`` under ``train`` (no evaluation command: the summary reports PSNR)."""
    p = train_recipes.add_parser(
        "tiny-decoder",
        help="distil a TAEHV tiny streaming decoder from a card's full VAE",
        parents=list(parents),
    )
    p.add_argument("--card", required=True, help="card whose DiT makes the latents and VAE teaches")
    p.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="the card's weights (external)"
    )
    p.add_argument("--device", default="auto", help="torch device (auto, cuda, cpu)")
    p.add_argument("--precision", default=None, help="serving precision of the card (default: its)")
    p.add_argument("--budget-s", type=float, default=900.0, help="wall-clock budget, all included")
    p.add_argument("--steps", type=int, default=2000, help="at most this many optimizer steps")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("tiny_decoder.safetensors"),
        help="the student, in the published layout (for a *-taehv card: "
        "<checkpoint-dir>/tiny_decoder/tiny_decoder.safetensors)",
    )
    p.add_argument("--clips", type=int, default=16, help="latent clips drawn from the card")
    p.add_argument("--chunks-per-clip", type=int, default=2)
    p.add_argument("--held-out", type=int, default=1, help="clips kept for the PSNR report")
    p.add_argument("--crop", type=int, default=24, help="latent crop side per step (0: whole)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--student-preset", default=None, help="TAEHV preset (default: the card's)")
    p.add_argument("--init", default=None, metavar="CHECKPOINT", help="start from these weights")
    p.add_argument("--prompts", type=Path, default=None, help="file of prompts, one per line")
    p.add_argument("--l1", type=float, default=1.0, help="weight of the pixel L1")
    p.add_argument("--mse", type=float, default=1.0, help="weight of the pixel MSE")
    p.add_argument(
        "--structure",
        type=float,
        default=0.5,
        help="weight of the x/y/t finite-difference L1 (an LPIPS-free perceptual proxy)",
    )
    p.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from models.card import CardError
    from models.checkpoint.load import CheckpointError
    from models.instance import InstanceError
    from models.registry import UnknownModelError, get
    from models.wan.taehv.distill import DistillConfig, DistillError, PixelLoss, distill

    prompts = ()
    if args.prompts is not None:
        lines = args.prompts.read_text().splitlines()
        prompts = tuple(line.strip() for line in lines if line.strip())
    try:
        config = DistillConfig(
            steps=args.steps,
            budget_s=args.budget_s,
            clips=args.clips,
            chunks_per_clip=args.chunks_per_clip,
            held_out=args.held_out,
            lr=args.lr,
            crop_latent=args.crop or None,
            seed=args.seed,
            student_preset=args.student_preset,
            init=args.init,
            prompts=prompts,
            loss=PixelLoss(l1=args.l1, mse=args.mse, structure=args.structure),
        )
        summary = distill(
            get(args.card),
            config,
            out=args.out,
            device=args.device,
            precision=args.precision,
            checkpoint_dir=args.checkpoint_dir,
        )
    except (
        CardError,
        CheckpointError,
        DistillError,
        InstanceError,
        UnknownModelError,
    ) as exc:
        sys.stderr.write(f"dreamrt train tiny-decoder: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    return 0
