"""load_instance: a card with external weights loads from a checkpoint directory the test writes.

The directory is laid out as the card's manifest says (transformer/ in the original Wan layout,
vae/ with a diffusers config.json, text_encoder/ + tokenizer/ in the diffusers layout), so this
is the same path `dreamrt serve --checkpoint DIR` takes for real weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from models.card.manifest import CheckpointManifest
from models.checkpoint.load import save_original_format
from models.instance import InstanceError, load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from models.wan.card import WAN21_13B_CAUSAL
from runtime.driver import run_inline
from tests.models.test_text_encoder import write_checkpoint


def _external_card():
    tiny = get("wan-tiny-random")
    # the 1.3B card's manifest for the components the tiny card has (its optional tiny
    # decoder is not one of them)
    entries = {
        name: entry
        for name, entry in WAN21_13B_CAUSAL.checkpoint.components.items()
        if name in tiny.components or name == "tokenizer"
    }
    return dataclasses.replace(
        tiny,
        model_id="wan-tiny-external",
        weights="external",
        description="tiny Wan preset with weights from a directory",
        checkpoint=CheckpointManifest(entries),
    )


def _write_checkpoint(root: Path, source) -> None:
    (root / "transformer").mkdir(parents=True)
    save_original_format(source.dit, root / "transformer" / "model.safetensors")
    (root / "vae").mkdir()
    # Wan's original VAE names in a diffusers-layout folder: the loader detects the naming.
    save_original_format(source.vae, root / "vae" / "diffusion_pytorch_model.safetensors")
    config = {"_class_name": "AutoencoderKLWan", **source.vae.config.to_diffusers_config()}
    (root / "vae" / "config.json").write_text(json.dumps(config))
    write_checkpoint(root, d_model=source.dit.config.text_dim)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    source = load_instance(get("wan-tiny-random"), device="cpu", seed=3)
    root = tmp_path_factory.mktemp("ckpt")
    _write_checkpoint(root, source)
    return root, source


def test_external_card_loads_every_component_from_the_manifest(checkpoint) -> None:
    root, source = checkpoint
    loaded = load_instance(_external_card(), device="cpu", checkpoint_dir=root)
    for name in ("dit", "vae"):
        ours, theirs = getattr(loaded, name).state_dict(), getattr(source, name).state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert loaded.dit.config.action_dim == source.dit.config.action_dim > 0  # hooks adopted
    result, emissions = asyncio.run(
        run_inline(
            loaded.loop("chunk_rollout"), SessionRequest(prompt="a red ball", max_chunks=1), loaded
        )
    )
    frames = [e.output for e in emissions if e.spec.stream == "media"]
    # a session's first chunk: its first frame alone, then the other 8
    assert [f.shape for f in frames] == [(1, 64, 64, 3), (8, 64, 64, 3)]
    assert result.outputs["chunks"] == 1


def test_missing_components_are_named(tmp_path, checkpoint) -> None:
    root, _ = checkpoint
    with pytest.raises(InstanceError, match="pass the checkpoint directory"):
        load_instance(_external_card(), device="cpu")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "transformer").symlink_to(root / "transformer")
    with pytest.raises(InstanceError, match=r"lacks: vae \(vae\), text_encoder"):
        load_instance(_external_card(), device="cpu", checkpoint_dir=partial)


def test_weights_digest_covers_the_decoders_served(tmp_path) -> None:
    """Weights digest x decoders: a taehv card serves its full VAE beside the tiny decoder
    once ``vae/`` is there (sessions may pick either), so the records' weights version then
    covers that file too; it always covers the decoder that runs by default."""
    from models.instance.resident import _weights_digest

    card = get("wan2.1-1.3b-causal-taehv")
    for name in ("transformer", "text_encoder", "tokenizer", "tiny_decoder"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.safetensors").write_bytes(name.encode() * 8)
    served = _weights_digest(card, 0, False, tmp_path)
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "weights.safetensors").write_bytes(b"teacher" * 8)
    with_full = _weights_digest(card, 0, False, tmp_path)
    assert with_full != served  # a second decoder is served now
    (tmp_path / "tiny_decoder" / "weights.safetensors").write_bytes(b"retrained" * 8)
    assert _weights_digest(card, 0, False, tmp_path) != with_full
    full = get("wan2.1-1.3b-causal")  # the full-VAE card decodes with it: its file counts
    with_vae = _weights_digest(full, 0, False, tmp_path)
    (tmp_path / "vae" / "weights.safetensors").write_bytes(b"other" * 8)
    assert _weights_digest(full, 0, False, tmp_path) != with_vae
