"""The ``dreamrt train RECIPE`` and ``dreamrt eval MODEL`` commands: one sub-command per recipe.

Each recipe module (``RECIPES``) provides ``add_recipe_parsers(train, evaluate, parents)``, adding
its parsers under the ``train`` and ``eval`` sub-command tables; each parser sets ``handler``
(args -> exit code). server/cli.py hooks ``add_parsers`` in, so the server names no family.
Recipe modules import only argparse at parse time: torch loads when a handler runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

__all__ = ["RECIPES", "add_parsers"]

RECIPES = (
    "models.tinyworld.cli",  # train / eval tiny-world: the embedded card's recipe
    "models.wan.taehv.cli",  # train tiny-decoder: a TAEHV decoder distilled from a card's VAE
)


def add_parsers(
    subparsers: argparse._SubParsersAction,
    parents: Sequence[argparse.ArgumentParser] = (),
    recipes: Sequence[str] = RECIPES,
) -> None:
    """Add ``train`` and ``eval`` (each with one sub-command per recipe, chosen as ``model``);
    ``parents`` are the host parser's common options, added to every recipe's parser."""
    train = subparsers.add_parser("train", help="train a model or component by its recipe")
    train_recipes = train.add_subparsers(dest="model", required=True, metavar="RECIPE")
    evaluate = subparsers.add_parser("eval", help="evaluate a trained model")
    eval_recipes = evaluate.add_subparsers(dest="model", required=True, metavar="MODEL")
    for module in recipes:
        importlib.import_module(module).add_recipe_parsers(
            train_recipes, eval_recipes, list(parents)
        )
