"""Build tiny-world's components from its card: seeded random weights, or the shipped checkpoint.

The checkpoint is one safetensors file: ``dit.<Wan original name>`` and
``text_encoder.embedding.weight`` tensors, plus string metadata (``dit_config``: the DiT's
original-format config as JSON, ``prediction``: ``x0`` (see ``prediction.py``), ``text_len``,
``recipe``: a JSON summary of the training run).
``models.instance.load_instance`` calls ``build_components`` for cards of family
``tinyworld``; the trainer calls ``save_checkpoint``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from models.card import ModelCard
from models.tinyworld.codec import PixelCodec
from models.tinyworld.config import dit_preset
from models.tinyworld.geometry import CHUNK_FRAMES
from models.tinyworld.prediction import PixelDiT
from models.tinyworld.text import WordTextEncoder
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT

__all__ = [
    "SHIPPED_DIR",
    "CheckpointError",
    "build_components",
    "load_checkpoint",
    "new_components",
    "save_checkpoint",
]

SHIPPED_DIR = Path(__file__).resolve().parent / "weights"


class CheckpointError(RuntimeError):
    """A tiny-world checkpoint that is missing or does not fit the card (names file and why)."""


def new_components(preset: str, *, seed: int = 0) -> tuple[PixelDiT, PixelCodec, WordTextEncoder]:
    """Seeded random components of a DiT preset (training starts here; tests use them)."""
    config = dit_preset(preset)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dit = PixelDiT(config, CHUNK_FRAMES)
        text = WordTextEncoder(config.text_len, config.text_dim)
    return dit, PixelCodec(), text


def save_checkpoint(
    path: str | Path, dit: WanDiT, text: WordTextEncoder, recipe: Mapping[str, Any]
) -> None:
    """Write the DiT and text encoder (fp32, contiguous) with their config and recipe summary."""
    tensors = {
        f"dit.{k}": v.detach().float().cpu().contiguous() for k, v in dit.state_dict().items()
    }
    tensors |= {
        f"text_encoder.{k}": v.detach().float().cpu().contiguous()
        for k, v in text.state_dict().items()
    }
    metadata = {
        "dit_config": json.dumps(dit.config.to_original_config()),
        "prediction": "x0",
        "dit_preset": dit.config.name,
        "text_len": str(text.text_len),
        "recipe": json.dumps(dict(recipe), sort_keys=True),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)


def load_checkpoint(
    path: str | Path,
) -> tuple[PixelDiT, PixelCodec, WordTextEncoder, dict[str, Any]]:
    """Components from a checkpoint written by ``save_checkpoint``; -> (dit, codec, text,
    recipe summary). ``CheckpointError`` when the file is absent, or keys or shapes differ."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"tiny-world checkpoint {str(path)!r} does not exist")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iter
    if "dit_config" not in meta or meta.get("prediction") != "x0":
        raise CheckpointError(
            f"{str(path)!r} is not an x0-prediction tiny-world checkpoint "
            f"(metadata: {sorted(meta)})"
        )
    config = WanDiTConfig.from_original_config(
        json.loads(meta["dit_config"]), name=meta.get("dit_preset", "checkpoint")
    )
    dit = PixelDiT(config, CHUNK_FRAMES)
    text = WordTextEncoder(config.text_len, config.text_dim)
    for prefix, module in (("dit.", dit), ("text_encoder.", text)):
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(state, strict=False)
        # a zero-initialised hook absent from the file is an exact no-op (older checkpoints)
        missing = [
            k for k in missing if not k.startswith(("position_embedding.", "frame_embedding."))
        ]
        if missing or unexpected:
            raise CheckpointError(
                f"{str(path)!r}: {prefix[:-1]} keys missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
    return dit.eval(), PixelCodec(), text.eval(), json.loads(meta.get("recipe", "{}"))


def build_components(
    card: ModelCard,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    random_weights: bool,
    checkpoint_dir: str | Path | None,
) -> tuple[PixelDiT, PixelCodec, WordTextEncoder]:
    """The component builder ``models.instance`` uses for this family.

    Random weights when asked or when the card says so; otherwise the card's checkpoint file
    under ``checkpoint_dir`` (default: the weights shipped beside this module). The checkpoint's
    DiT config must equal the card's preset (``CheckpointError`` otherwise).
    """
    preset = card.components["dit"].preset
    if random_weights or card.weights.value == "random":
        dit, codec, text = new_components(preset, seed=seed)
    else:
        root = Path(checkpoint_dir) if checkpoint_dir is not None else SHIPPED_DIR
        dit, codec, text, _ = load_checkpoint(root / card.checkpoint.components["dit"].path_hint)
        expected = dit_preset(preset)
        if dit.config.replace(name=expected.name) != expected:
            raise CheckpointError(
                f"checkpoint under {str(root)!r} has DiT {dit.config}, the "
                f"card {card.model_id!r} wants preset {preset!r}"
            )
    return dit.to(device), codec, text.to(device=device, dtype=dtype)
