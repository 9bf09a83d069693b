"""Build a Wan card's components: seeded random weights, or the card's checkpoint directory.

``models.instance.load_instance`` calls ``build_components`` (its ``ComponentBuilder``) for every
family without a builder of its own. Random weights initialise on the target device (a 1.3B DiT
inits in milliseconds on a GPU); a checkpoint directory is laid out as the card's manifest says
(``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``) and is checked for every
component before gigabytes of weights load. The codec built is the card's
``decoder_component``: the full VAE, or a tiny TAEHV decoder (``tiny_decoder/``) for a card
that decodes with one. ``build_decoders`` builds the card's *other* decoders (the options a
session may pick, ``ModelCard.decoders``): with random weights always, from a checkpoint
directory when their files are there (an optional component left out is no error).
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.card import ComponentKind, ComponentSpec, ModelCard
from models.instance import InstanceError
from models.loops.inputs import ACTION_DIM, AUDIO_DIM
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT
from models.wan.taehv.config import TAEHVConfig
from models.wan.taehv.decoder import TAEHVDecoder
from models.wan.text_encoder import UMT5TextEncoder
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.config import WanVAEConfig

__all__ = ["CPU_RANDOM_PARAM_LIMIT", "build_components", "build_decoders", "dit_param_count"]


def build_components(
    card: ModelCard,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    random_weights: bool,
    checkpoint_dir: str | Path | None,
) -> tuple[WanDiT, WanVAE | TAEHVDecoder, UMT5TextEncoder]:
    """(dit, codec, text encoder) of ``card``: random when asked or when the card's weights are
    random, otherwise from ``checkpoint_dir`` (``InstanceError`` names what is missing)."""
    if not (random_weights or card.weights.value == "random"):
        return _load_checkpoint(card, checkpoint_dir, device, dtype)
    dit_spec = card.components["dit"]
    hooks = {
        "action_dim": ACTION_DIM if "action" in dit_spec.conditioning else 0,
        "audio_dim": AUDIO_DIM if "audio" in dit_spec.conditioning else 0,
    }
    config = WanDiTConfig.preset(dit_spec.preset).replace(**hooks)
    _check_random_size(config, device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with device:  # initialise where the weights will live
            dit = WanDiT(config)
            vae = _random_codec(card)
    _randomize_hooks(dit, seed)
    encoder = UMT5TextEncoder.from_preset(
        card.components["text_encoder"].preset, seed=seed, device=device, dtype=dtype
    )
    return dit, vae, encoder


# Random weights above this many DiT parameters build only on an accelerator or the meta
# device: a 14B DiT is 56 GB of fp32 before the cast, more than a development machine holds.
CPU_RANDOM_PARAM_LIMIT = 4_000_000_000


def dit_param_count(config: WanDiTConfig) -> int:
    """Parameters of ``WanDiT(config)``, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in WanDiT(config).parameters())


def _check_random_size(config: WanDiTConfig, device: torch.device) -> None:
    if device.type == "cpu" and (count := dit_param_count(config)) > CPU_RANDOM_PARAM_LIMIT:
        raise InstanceError(
            f"DiT preset {config.name!r} has {count / 1e9:.1f}B parameters: random weights "
            f"build on cuda or meta only, not on the CPU (limit {CPU_RANDOM_PARAM_LIMIT:,})"
        )


def _random_codec(card: ModelCard) -> WanVAE | TAEHVDecoder:
    """The latent codec the loops decode with (``card.decoder_component``), from its preset."""
    return _codec_of(card.components[card.decoder_component])


def build_decoders(
    card: ModelCard,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    random_weights: bool,
    checkpoint_dir: str | Path | None,
) -> dict[str, WanVAE | TAEHVDecoder]:
    """The card's decoders other than its default one (``ModelCard.decoders``) -> codec by
    option (``"full"`` / ``"tiny"``): seeded random ones for a random card (their own seed
    stream: the default components' weights do not move), else those whose checkpoint path
    exists under ``checkpoint_dir``."""
    from models.checkpoint.load import load_vae
    from models.wan.taehv.checkpoint import load_taehv

    random = random_weights or card.weights.value == "random"
    out: dict[str, WanVAE | TAEHVDecoder] = {}
    for option in card.decoders:
        if option == card.default_decoder:
            continue
        spec = card.components[card.decoder_component_for(option)]
        if random:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + 1)
                with device:
                    out[option] = _codec_of(spec)
            continue
        entry = card.checkpoint.components.get(spec.component_id)
        if checkpoint_dir is None or entry is None:
            continue
        path = Path(checkpoint_dir) / entry.path_hint
        if not path.exists():
            continue
        if spec.kind is ComponentKind.DECODER:
            config = TAEHVConfig.preset(spec.preset)
            out[option] = load_taehv(path, device=device, dtype=dtype, config=config)
        else:
            out[option] = load_vae(path, device=device, dtype=dtype)
    return out


def _codec_of(spec: ComponentSpec) -> WanVAE | TAEHVDecoder:
    if spec.kind is ComponentKind.DECODER:
        return TAEHVDecoder(TAEHVConfig.preset(spec.preset))
    return WanVAE(WanVAEConfig.preset(spec.preset))


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
) -> tuple[WanDiT, WanVAE | TAEHVDecoder, UMT5TextEncoder]:
    from models.checkpoint.load import load_transformer, load_vae
    from models.wan.text_encoder import require_transformers

    if checkpoint_dir is None:
        raise InstanceError(
            f"card {card.model_id!r} has {card.weights.value} weights: pass the checkpoint "
            f"directory (components {sorted(card.checkpoint.components)})"
        )
    root = Path(checkpoint_dir)
    entries = card.checkpoint.components
    codec = card.decoder_component
    loaded = ("dit", codec, "text_encoder", "tokenizer")  # not a full VAE that only teaches
    missing = [
        f"{c} ({e.path_hint})"
        for c, e in entries.items()
        if c in loaded and not (root / e.path_hint).exists()
    ]
    if missing:
        raise InstanceError(
            f"checkpoint {str(root)!r} for card {card.model_id!r} lacks: " + ", ".join(missing)
        )
    require_transformers()  # before gigabytes of DiT weights load, not after
    dit = load_transformer(root / entries["dit"].path_hint, device=device, dtype=dtype)
    vae: TAEHVDecoder | WanVAE
    if card.components[codec].kind is ComponentKind.DECODER:
        from models.wan.taehv.checkpoint import load_taehv

        config = TAEHVConfig.preset(card.components[codec].preset)
        vae = load_taehv(root / entries[codec].path_hint, device=device, dtype=dtype, config=config)
    else:
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
