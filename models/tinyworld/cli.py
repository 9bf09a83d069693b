"""``dreamrt train tiny-world`` and ``dreamrt eval tiny-world``.

``add_recipe_parsers`` adds both under ``models.recipe_cli``'s ``train`` / ``eval`` (which
server/cli.py hooks in); ``add_parsers(subparsers)`` builds those two commands with this recipe
alone, and ``python -m models.tinyworld.cli train|eval ...`` runs them without the server package.
Exit codes: 0 success (eval: every threshold met), 1 failure or an unmet threshold, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["add_parsers", "add_recipe_parsers", "main"]

_MODEL = "tiny-world"


def add_parsers(
    subparsers: argparse._SubParsersAction, parents: Sequence[argparse.ArgumentParser] = ()
) -> None:
    """Add ``train`` and ``eval`` holding this recipe only (``train tiny-world``, ...)."""
    from models.recipe_cli import add_parsers as add_recipe_commands

    add_recipe_commands(subparsers, parents, recipes=(__name__,))


def add_recipe_parsers(
    train_recipes: argparse._SubParsersAction,
    eval_recipes: argparse._SubParsersAction,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> None:
    """Add ``tiny-world`` under ``train`` and under ``eval``; ``parents`` are the host parser's
    common options. Each sets ``handler`` (args -> exit code)."""
    train = train_recipes.add_parser(
        _MODEL, help="train tiny-world by its recipe", parents=list(parents)
    )
    train.add_argument("--device", default="cuda", help="torch device (cuda, cpu)")
    train.add_argument("--out", type=Path, required=True, help="directory for the checkpoint")
    train.add_argument("--budget-s", type=float, default=400.0, help="wall-clock budget")
    train.add_argument("--max-steps", type=int, default=1_000_000)
    train.add_argument("--batch", type=int, default=128)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--preset", default="tinyworld-s")
    train.add_argument("--size", type=int, default=96, help="frame height and width (pixels)")
    train.add_argument(
        "--init",
        default=None,
        metavar="CHECKPOINT",
        help="start from these weights (fine-tuning) instead of a seeded init",
    )
    train.add_argument(
        "--fresh-p", type=float, default=0.25, help="share of clips that start a stream"
    )
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--warmup-steps", type=int, default=100)
    train.add_argument(
        "--self-rollout-from",
        type=float,
        default=0.6,
        help="fraction of the budget after which phase 2 starts",
    )
    train.add_argument(
        "--sprite-weight",
        type=float,
        default=10.0,
        help="extra loss weight near the context's sprite",
    )
    train.add_argument(
        "--sprite-reach-px",
        type=int,
        default=24,
        help="how far from the context's sprite that weight reaches",
    )
    train.add_argument(
        "--moving-p", type=float, default=0.6, help="share of mid-stream clips that start moving"
    )
    train.add_argument(
        "--hold-p", type=float, default=0.55, help="chance a chunk keeps the previous chunk's keys"
    )
    train.add_argument(
        "--contrast",
        type=int,
        default=1,
        help="clips per contrast group (same clip, last chunk's keys redrawn)",
    )
    train.add_argument(
        "--contrast-p", type=float, default=0.0, help="share of the batch in contrast groups"
    )
    train.add_argument(
        "--action-lr-mult",
        type=float,
        default=1.0,
        help="the action hook's learning rate / --lr (no weight decay if != 1)",
    )
    train.add_argument(
        "--probe-every", type=int, default=100, help="steps between action probes (0: never)"
    )
    train.add_argument(
        "--probe-pairs", type=int, default=96, help="clips drawn for the probe batch"
    )
    train.set_defaults(handler=_train)

    ev = eval_recipes.add_parser(
        _MODEL, help="evaluate tiny-world through the real loop", parents=list(parents)
    )
    ev.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="directory holding tiny-world.safetensors (default: the shipped one)",
    )
    ev.add_argument("--device", default="cpu")
    ev.add_argument("--precision", default=None, help="fp32 or bf16 (default: the card's pick)")
    ev.add_argument(
        "--checkpoint-file",
        default=None,
        help="file name under --checkpoint-dir (default: the card's)",
    )
    ev.add_argument("--rollouts", type=int, default=50)
    ev.add_argument("--chunks", type=int, default=18, help="chunks per rollout (4 frames each)")
    ev.add_argument("--long-s", type=float, default=60.0, help="collapse check length")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--json", type=Path, default=None, help="also write the report here")
    # the lossy serving levers (models.instance.WanInstance.configure), for the quality guard
    ev.add_argument(
        "--attention",
        default=None,
        metavar="NAME",
        help="self-attention kernel (auto, sage, fp8-triton, fa3-fp8, cudnn-fp8, ...; tiny-world's "
        "head dim is 32: kernels without it fall back to SDPA, logged)",
    )
    ev.add_argument("--fp8", default=None, choices=["row", "tensor"], help="FP8 linear layers")
    ev.add_argument(
        "--fold", action="store_true", help="KV update folded into the last denoising step"
    )
    ev.set_defaults(handler=_eval)


def _train(args: argparse.Namespace) -> int:
    from models.tinyworld.training.recipe import TrainConfig, train

    config = TrainConfig(
        preset=args.preset,
        batch=args.batch,
        budget_s=args.budget_s,
        max_steps=args.max_steps,
        seed=args.seed,
        height=args.size,
        width=args.size,
        init_from=args.init,
        fresh_p=args.fresh_p,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        self_rollout_from=args.self_rollout_from,
        sprite_weight=args.sprite_weight,
        sprite_reach_px=args.sprite_reach_px,
        moving_p=args.moving_p,
        hold_p=args.hold_p,
        contrast=args.contrast,
        contrast_p=args.contrast_p,
        action_lr_mult=args.action_lr_mult,
        probe_every=args.probe_every,
        probe_pairs=args.probe_pairs,
    )
    summary = train(config, device=args.device, out_dir=args.out)
    sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import torch

    from models.instance import InstanceError, load_instance
    from models.tinyworld.card import TINY_WORLD
    from models.tinyworld.evaluation.evaluate import evaluate

    torch.set_num_threads(1)  # what a served session gets: the other core encodes
    # The card itself, not the registry: it is registered (and served by default) only once
    # weights that pass this evaluation ship with the repository.
    card = TINY_WORLD
    if args.checkpoint_file is not None:  # e.g. the phase-1 weights of a training run
        entries = {
            c: replace(e, path_hint=args.checkpoint_file)
            for c, e in card.checkpoint.components.items()
        }
        card = replace(card, checkpoint=replace(card.checkpoint, components=entries))
    instance = load_instance(
        card, device=args.device, precision=args.precision, checkpoint_dir=args.checkpoint_dir
    )
    try:
        instance.configure(
            attention=args.attention, fp8=args.fp8, kv_update="last_step" if args.fold else None
        )
    except InstanceError as exc:
        sys.stderr.write(f"dreamrt eval: {exc}\n")
        return 2
    report = evaluate(
        instance, rollouts=args.rollouts, chunks=args.chunks, long_s=args.long_s, seed=args.seed
    )
    text = json.dumps(report.as_dict() | {"levers": instance.levers}, indent=1)
    sys.stdout.write(text + "\n")
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if report.passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.tinyworld.cli")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
