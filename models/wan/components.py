"""Build a Wan card's components: seeded random weights, or the card's checkpoint directory.

``models.instance.load_instance`` calls ``build_components`` (its ``ComponentBuilder``) for every
family without a builder of its own. Random weights initialise on the target device (a 1.3B DiT
inits in milliseconds on a GPU); a checkpoint directory is laid out as the card's manifest says
(``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``) and is checked for every
component before gigabytes of weights load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.card import ModelCard
from models.instance import InstanceError
from models.loops.inputs import ACTION_DIM, AUDIO_DIM
from models.wan.config import WanDiTConfig
from models.wan.text_encoder import UMT5TextEncoder
from models.wan.transformer import WanDiT
from models.wan.vae import WanVAE
from models.wan.vae_config import WanVAEConfig

__all__ = ["build_components"]


def build_components(
    card: ModelCard,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    random_weights: bool,
    checkpoint_dir: str | Path | None,
) -> tuple[WanDiT, WanVAE, UMT5TextEncoder]:
    """(dit, vae, text encoder) of ``card``: random when asked or when the card's weights are
    random, otherwise from ``checkpoint_dir`` (``InstanceError`` names what is missing)."""
    if not (random_weights or card.weights.value == "random"):
        return _load_checkpoint(card, checkpoint_dir, device, dtype)
    dit_spec = card.components["dit"]
    hooks = {
        "action_dim": ACTION_DIM if "action" in dit_spec.conditioning else 0,
        "audio_dim": AUDIO_DIM if "audio" in dit_spec.conditioning else 0,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with device:  # initialise where the weights will live
            dit = WanDiT(WanDiTConfig.preset(dit_spec.preset).replace(**hooks))
            vae = WanVAE(WanVAEConfig.preset(card.components["vae"].preset))
    _randomize_hooks(dit, seed)
    encoder = UMT5TextEncoder.from_preset(
        card.components["text_encoder"].preset, seed=seed, device=device, dtype=dtype
    )
    return dit, vae, encoder


def _randomize_hooks(dit: WanDiT, seed: int) -> None:
    """Random cards get non-zero action/audio hooks so inputs visibly change the output (real
    checkpoints start them at zero, an exact no-op, and train them)."""
    generator = torch.Generator().manual_seed(seed)
    for hook in (dit.action_embedding, dit.audio_embedding):
        if hook is None:
            continue
        for p in hook.parameters():
            p.data.copy_(torch.randn(p.shape, generator=generator) * 0.5)


def _load_checkpoint(
    card: ModelCard, checkpoint_dir: str | Path | None, device: torch.device, dtype: torch.dtype
) -> tuple[WanDiT, WanVAE, UMT5TextEncoder]:
    from models.checkpoint import load_transformer, load_vae
    from models.wan.text_encoder import require_transformers

    if checkpoint_dir is None:
        raise InstanceError(
            f"card {card.model_id!r} has {card.weights.value} weights: pass the checkpoint "
            f"directory (components {sorted(card.checkpoint.components)})"
        )
    root = Path(checkpoint_dir)
    entries = card.checkpoint.components
    missing = [
        f"{c} ({e.path_hint})" for c, e in entries.items() if not (root / e.path_hint).exists()
    ]
    if missing:
        raise InstanceError(
            f"checkpoint {str(root)!r} for card {card.model_id!r} lacks: " + ", ".join(missing)
        )
    require_transformers()  # before gigabytes of DiT weights load, not after
    dit = load_transformer(root / entries["dit"].path_hint, device=device, dtype=dtype)
    vae = load_vae(root / entries["vae"].path_hint, device=device, dtype=dtype)
    encoder = UMT5TextEncoder.from_pretrained(
        root / entries["text_encoder"].path_hint,
        root / entries["tokenizer"].path_hint,
        text_len=dit.config.text_len,
        preset=card.components["text_encoder"].preset,
        device=device,
        dtype=dtype,
    )
    return dit, vae, encoder
