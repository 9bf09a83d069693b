"""Cards that decode with the tiny streaming decoder: the card names it, the instance loads it
(random, or from a checkpoint directory in the published layout) instead of the full VAE, and
sessions stream through ``chunk_rollout`` with its cache as loop state (snapshots resume)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import torch

from models.card import CardError, LoopSpec
from models.checkpoint.load import save_original_format
from models.instance import InstanceError, load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from models.tinyworld.evaluation.stream import LoopStream
from models.wan.card import WAN21_13B_CAUSAL_TAEHV
from models.wan.taehv.checkpoint import published_state_dict
from models.wan.taehv.decoder import TAEHVDecoder
from models.wan.vae.autoencoder import WanVAE, video_to_uint8
from runtime.driver import Driver, InlineContext
from tests.models.test_chunk_rollout import snapshot_and_resume


@pytest.fixture(scope="module")
def instance():
    return load_instance(get("wan-tiny-taehv-random"), device="cpu")


def test_the_cards_name_the_tiny_decoder_and_keep_the_full_vae_as_teacher() -> None:
    card = get("wan2.1-1.3b-causal-taehv")
    assert (
        card.decoder_component == "tiny_decoder"
        and get("wan2.1-1.3b-causal").decoder_component == "vae"
    )
    assert (card.components["tiny_decoder"].kind.value, card.components["tiny_decoder"].preset) == (
        "decoder",
        "taew2_1",
    )
    entries = card.checkpoint.components
    assert (entries["tiny_decoder"].path_hint, entries["tiny_decoder"].format.value) == (
        "tiny_decoder",
        "taehv",
    )
    assert entries["tiny_decoder"].required_for and not entries["vae"].required_for
    assert card.recipe == get("wan2.1-1.3b-causal").recipe  # the same DiT, the same recipe
    assert "tiny_decoder" in card.loops["chunk_rollout"].components
    assert get("wan-tiny-taehv-random").decoder_component == "tiny_decoder"


def test_a_decode_loop_must_name_one_codec() -> None:
    card = get("wan-tiny-taehv-random")
    bad = dataclasses.replace(
        card,
        loops={
            **card.loops,
            "vae_decode": LoopSpec("vae_decode", "vae_decode", components=("dit",)),
        },
    )
    with pytest.raises(CardError, match="decodes with 'dit', a dit, not a vae or decoder"):
        bad.validate()


def test_the_instance_decodes_with_the_tiny_decoder_and_holds_the_full_vae_beside(
    instance,
) -> None:
    assert isinstance(instance.vae, TAEHVDecoder) and instance.default_decoder == "tiny"
    assert instance.components["tiny_decoder"] is instance.vae
    # random weights: the full VAE is built too, a session may pick it (and jobs decode with it)
    assert instance.decoder_options() == ("full", "tiny")
    assert isinstance(instance.codec_for("full"), WanVAE)
    assert instance.components["vae"] is instance.codec_for("full")
    assert instance.decode_op_for("full") is not instance.decode_op_for("tiny")
    reference = load_instance(get("wan-tiny-random"), device="cpu")
    # same seed, same DiT: the two cards' sessions differ only in how latents become frames
    ours, theirs = instance.dit.state_dict(), reference.dit.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    profile = instance.card.default_profile
    assert instance.decode_flops(profile) == instance.vae.decode_flops(3, 8, 8) > 0
    assert instance.decode_flops(profile) < reference.decode_flops(profile)


def test_session_frames_are_the_tiny_decoder_of_the_dit_latents_as_they_are(instance) -> None:
    stream = LoopStream(instance, "a red kite", seed=4)
    cache = instance.vae.new_decoder_cache(1, 8, 8)
    for expected_frames in (9, 12, 12):  # first chunk: 1 + 4 * 2, then 4 per latent frame
        frames = stream.next_chunk()
        assert frames.shape == (expected_frames, 64, 64, 3) and frames.dtype == torch.uint8
        with torch.no_grad():  # no denormalize: TAEHV decodes the DiT's latent scale
            direct = instance.vae.decode_chunk(stream.state.latents, cache)
        assert torch.equal(frames, video_to_uint8(direct[0]))


def _media(emissions) -> list[torch.Tensor]:
    return [e.output for e in emissions if e.spec.stream == "media"]


def test_snapshot_at_any_boundary_resumes_bit_identically(instance) -> None:
    request = SessionRequest(prompt="a yellow square", seed=11, max_chunks=2)
    whole = InlineContext("s")
    asyncio.run(Driver(instance.loop("chunk_rollout"), whole).run(request, instance))
    reference = _media(whole.emissions)
    assert [f.shape[0] for f in reference] == [1, 8, 12]
    # mid-denoise, between the first chunk's decode parts, after them (before the KV update)
    for cut_at in (3, 6, 7):
        combined = _media(snapshot_and_resume(instance, request, cut_at))
        assert len(combined) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(combined, reference, strict=True))


# --------------------------------------------------------------------------------------------
# external weights: the card pointed at a directory holding the published layout


def _external_card():
    return dataclasses.replace(
        get("wan-tiny-taehv-random"),
        model_id="wan-tiny-taehv-external",
        weights="external",
        description="tiny Wan preset + tiny decoder with weights from a directory",
        checkpoint=WAN21_13B_CAUSAL_TAEHV.checkpoint,
    )


def test_external_card_loads_the_published_layout_and_no_full_vae(tmp_path: Path, instance) -> None:
    from tests.models.test_text_encoder import write_checkpoint

    (tmp_path / "transformer").mkdir()
    save_original_format(instance.dit, tmp_path / "transformer" / "model.safetensors")
    write_checkpoint(tmp_path, d_model=instance.dit.config.text_dim)
    with pytest.raises(InstanceError, match=r"lacks: tiny_decoder \(tiny_decoder\)$"):
        load_instance(_external_card(), device="cpu", checkpoint_dir=tmp_path)
    torch.manual_seed(5)
    decoder = TAEHVDecoder(instance.vae.config)
    (tmp_path / "tiny_decoder").mkdir()  # what a user does with madebyollin's taew2_1.pth
    torch.save(published_state_dict(decoder), tmp_path / "tiny_decoder" / "taew2_1.pth")
    loaded = load_instance(_external_card(), device="cpu", checkpoint_dir=tmp_path)  # no vae/
    assert loaded.decoder_options() == ("tiny",) and "vae" not in loaded.card.components
    ours, theirs = loaded.vae.state_dict(), decoder.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    frames = LoopStream(loaded, "a red ball", seed=1).next_chunk()
    assert frames.shape == (9, 64, 64, 3)
