"""The tiny-world card: valid, registered, served only under its recipe's loop, buildable."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.card import RecipeMismatchError, ScheduleSpec
from models.instance import load_instance
from models.tinyworld.card import TINY_WORLD
from models.tinyworld.codec import CodecShapeError, PixelCodec
from models.tinyworld.components import CheckpointError, build_components
from models.tinyworld.prediction import PixelDiT
from models.tinyworld.text import WordTextEncoder


def _random_card(preset: str = "tinyworld-test"):
    card = TINY_WORLD
    dit = dataclasses.replace(card.components["dit"], preset=preset)
    return dataclasses.replace(
        card,
        components={**card.components, "dit": dit},
        weights="random",
        description="tiny-world architecture, random weights (tests)",
    )


def test_card_is_valid_and_describes_its_recipe() -> None:
    card = TINY_WORLD
    assert card.validate() is card
    assert card.recipe.assumes_loop == "chunk_rollout"
    assert card.recipe.training_command.startswith("dreamrt train tiny-world")
    profile = card.default_profile
    assert (profile.width, profile.height, profile.fps, profile.steps) == (96, 96, 12, 4)
    assert card.latent.tokens_per_latent_frame(96, 96) == 36
    assert {"input.action", "input.audio", "prompt.switch"} <= card.capabilities
    public = card.to_public()
    assert public["weights"] == "trained" and public["recipe"]["method"] == card.recipe.method


def test_serving_under_another_sampler_is_a_typed_error() -> None:
    card = TINY_WORLD
    with pytest.raises(RecipeMismatchError, match="assumes"):
        card.check_serving("chunk_rollout", "fp32", ScheduleSpec((1000, 500), flow_shift=1.0))
    with pytest.raises(RecipeMismatchError, match="fp16"):
        card.check_serving("chunk_rollout", "fp16")


def test_random_instance_builds_generic_components_and_sizes_itself() -> None:
    card = _random_card()
    instance = load_instance(card, device="cpu")
    assert isinstance(instance.dit, PixelDiT)
    assert isinstance(instance.vae, PixelCodec)
    assert isinstance(instance.text.encoder, WordTextEncoder)
    profile = card.default_profile
    assert instance.kv_geometry(profile.chunk_latent_frames) == (0, 4)
    assert instance.kv_slab_bytes(profile) > 0 and instance.chunk_flops(profile) > 0
    assert instance.chunk_seconds(profile) == pytest.approx(4 / 12)


def test_text_encoder_ignores_unknown_words_and_caches_by_text() -> None:
    instance = load_instance(_random_card(), device="cpu")
    text = instance.text
    a = text.encode(["a red ball on grass"])
    b = text.encode(["grass, red ball!"])
    assert torch.equal(a.sort(dim=1).values, b.sort(dim=1).values)  # same words: any order
    assert text.misses == 2 and text.hits == 0
    text.encode(["a red ball on grass"])
    assert text.hits == 1
    assert not torch.equal(a, text.encode(["a blue ball on grass"]))


def test_pixel_codec_is_identity_with_a_counting_cache() -> None:
    codec = PixelCodec()
    cache = codec.new_decoder_cache(1, 96, 96)
    z = torch.linspace(-2, 2, 3 * 4 * 96 * 96).view(1, 3, 4, 96, 96)
    out = codec.decode_chunk(codec.denormalize(z), cache)
    assert torch.equal(out, z.clamp(-1, 1)) and cache.frames_seen == 4
    assert codec.decoder_cache_bytes(1, 96, 96, torch.float32) == 0
    with pytest.raises(CodecShapeError, match=r"\(1, 4, 2, 8, 8\)"):
        codec.decode_chunk(torch.zeros(1, 4, 2, 8, 8), cache)


def test_missing_or_foreign_checkpoint_names_the_file(tmp_path) -> None:
    card = TINY_WORLD
    with pytest.raises(CheckpointError, match="does not exist"):
        build_components(
            card,
            device=torch.device("cpu"),
            dtype=torch.float32,
            seed=0,
            random_weights=False,
            checkpoint_dir=tmp_path,
        )
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "tiny-world.safetensors"))
    with pytest.raises(CheckpointError, match="not an x0-prediction"):
        build_components(
            card,
            device=torch.device("cpu"),
            dtype=torch.float32,
            seed=0,
            random_weights=False,
            checkpoint_dir=tmp_path,
        )
