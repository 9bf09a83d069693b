"""A session's decoder (``"full"`` | ``"tiny"``): one resident instance streams sessions of
either from the same DiT latents, each decoded by its own codec, op and cache; a decoder the
model lacks is refused naming the field; jobs decode with the full VAE; the state's decoder
survives a snapshot; the published TAEHV file under ``tiny_decoder/`` adds the tiny decoder to
a full-VAE card."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from models.card import CheckpointManifest, ComponentEntry, ComponentSpec
from models.instance import load_instance
from models.instance_decoders import DecoderUnavailableError, with_loaded_decoders
from models.loops.chunk_rollout_state import ChunkRolloutState
from models.loops.requests import JobRequest, SessionRequest
from models.registry import get
from models.wan.card import WAN21_13B_CAUSAL
from models.wan.components import build_decoders
from models.wan.taehv import TAEHVDecoder
from models.wan.taehv_checkpoint import published_state_dict
from models.wan.taehv_config import TAEHVConfig
from models.wan.vae import WanVAE, video_to_uint8
from runtime.contract import Done, PlanKind, StepResult
from runtime.driver import Driver, InlineContext


@pytest.fixture(scope="module")
def instance():
    return load_instance(get("wan-tiny-taehv-random"), device="cpu")


def drive(instance: Any, request: SessionRequest, decodes: int) -> list[dict[str, Any]]:
    """Run ``request`` plan by plan up to its ``decodes``-th decode; for every decode: the
    plan, its latents, the frames it made and the same latents decoded again by the codec the
    request's ``decoder`` names (a reference stream of its own)."""
    loop = instance.loop("chunk_rollout")
    state = loop.init(request, instance, None)
    codec = instance.codec_for(request.decoder)
    cache = codec.new_decoder_cache(1, state.latent_h, state.latent_w)
    out: list[dict[str, Any]] = []
    while len(out) < decodes and not isinstance(plan := loop.next(state), Done):
        if plan.kind is PlanKind.VAE_DECODE:
            latents = plan.args.latents.clone()
        (output,) = plan.op([plan.args])
        if plan.kind is PlanKind.VAE_DECODE:
            with torch.no_grad():
                again = codec.decode_chunk(codec.denormalize(latents), cache)
            out.append({"plan": plan, "latents": latents, "frames": output, "direct": again[0]})
        state = loop.advance(state, StepResult(output, 0.0, kind=plan.kind))
    assert state.codec == instance.resolve_decoder(request.decoder)
    return out


def reference_cache(instance: Any, decoder: str) -> Any:
    profile = instance.card.default_profile
    s = instance.latent.spatial_stride
    return instance.codec_for(decoder).new_decoder_cache(1, profile.height // s, profile.width // s)


def test_one_instance_streams_either_decoder_from_the_same_latents(instance) -> None:
    # the first chunk decodes in two parts (its first frame first): the tiny stream both, the
    # full VAE's first (a CPU decodes the full VAE in seconds)
    tiny = drive(instance, SessionRequest(prompt="a red kite", seed=4), decodes=2)
    full = drive(instance, SessionRequest(prompt="a red kite", seed=4, decoder="full"), decodes=1)
    assert tiny[1]["plan"].emits[0].meta.final and not tiny[0]["plan"].emits[0].meta.final
    for t, f in zip(tiny[:1], full, strict=True):
        assert torch.equal(t["latents"], f["latents"])  # the DiT does not know the decoder
        assert t["plan"].op is instance.decode_op_for("tiny") is instance.decode_op
        assert f["plan"].op is instance.decode_op_for("full")
        # the card's default decoder keeps the plain signature; the other one is its own cost
        assert f["plan"].shape_sig == t["plan"].shape_sig + ":full"
        for d in (t, f):
            assert torch.equal(d["frames"], video_to_uint8(d["direct"]))
        assert t["frames"].shape == f["frames"].shape and not torch.equal(t["frames"], f["frames"])
    assert torch.equal(tiny[1]["frames"], video_to_uint8(tiny[1]["direct"]))  # the cache goes on
    assert tiny[1]["plan"].emits[0].meta.capture["decoder"] == "tiny"


def test_a_decoder_the_model_lacks_is_refused_naming_it() -> None:
    plain = load_instance(get("wan-tiny-random"), device="cpu")
    assert plain.decoder_options() == ("full",) and plain.resolve_decoder(None) == "full"
    with pytest.raises(DecoderUnavailableError, match=r"decoder 'tiny'.*\['full'\]"):
        plain.loop("chunk_rollout").init(SessionRequest(prompt="x", decoder="tiny"), plain)


def test_jobs_decode_with_the_full_vae_and_sizing_follows_the_decoder(instance) -> None:
    loop = instance.loop("chunk_rollout")
    job = loop.init(JobRequest(task="t2v", prompt="a red kite", num_frames=9), instance)
    assert job.codec == "full"
    assert job.decoder.specs == reference_cache(instance, "full").specs
    profile = instance.card.default_profile
    default, full = (
        instance.steady_chunk_plans(profile),
        instance.steady_chunk_plans(profile, "full"),
    )
    assert default[:-1] == full[:-1] and full[-1][1] == default[-1][1] + ":full"
    assert instance.steady_chunk_plans(profile, "tiny") == default
    assert instance.decode_flops(profile, "full") > instance.decode_flops(profile) > 0
    assert instance.chunk_flops(profile, "full") > instance.chunk_flops(profile)


def test_the_decoder_survives_a_snapshot(instance) -> None:
    request = SessionRequest(prompt="a yellow square", seed=11, max_chunks=2, decoder="full")
    loop = instance.loop("chunk_rollout")
    ctx = InlineContext("s")
    driver = Driver(loop, ctx)

    async def first_half() -> bytes:
        driver.init(request, instance)
        for _ in range(5):  # the prompt and the first chunk's steps: its decode comes next
            await driver.step()
        return driver.snapshot()

    blob = asyncio.run(first_half())
    resumed = Driver.from_snapshot(loop, InlineContext("s"), blob, ChunkRolloutState)
    assert resumed.state.codec == "full"
    restored = resumed.state.decoder
    assert (
        restored.specs
        == reference_cache(instance, "full").specs
        != (reference_cache(instance, "tiny").specs)
    )
    assert restored.frames_seen == 0


def test_the_published_taew2_1_file_adds_the_tiny_decoder_to_a_full_vae_card(
    tmp_path: Path,
) -> None:
    """A full-VAE card that lists a tiny decoder (as the 1.3B card does) gets it from the
    published layout under ``tiny_decoder/`` when the file is there, and does without it
    otherwise (its card then names one decoder)."""
    base = get("wan-tiny-random")
    card = dataclasses.replace(
        base,
        model_id="wan-tiny-external",
        weights="external",
        description="tiny Wan preset with weights from a directory",
        components={
            **base.components,
            "tiny_decoder": ComponentSpec("tiny_decoder", "decoder", "tiny"),
        },
        checkpoint=CheckpointManifest(
            {
                **WAN21_13B_CAUSAL.checkpoint.components,
                "tiny_decoder": ComponentEntry(
                    "tiny_decoder", "taehv", optional_for=frozenset({"session.realtime"})
                ),
            }
        ),
    ).validate()
    assert card.decoders == ("full", "tiny") and card.default_decoder == "full"
    where = {"device": torch.device("cpu"), "dtype": torch.float32, "seed": 0}
    assert build_decoders(card, random_weights=False, checkpoint_dir=tmp_path, **where) == {}
    narrowed = with_loaded_decoders(card, {})
    assert narrowed.decoders == ("full",) and narrowed.validate().to_public()["decoders"] == [
        "full"
    ]
    torch.manual_seed(7)
    published = TAEHVDecoder(TAEHVConfig.preset("tiny"))
    (tmp_path / "tiny_decoder").mkdir()
    state = {**published_state_dict(published), "encoder.0.weight": torch.zeros(64, 3, 3, 3)}
    torch.save(state, tmp_path / "tiny_decoder" / "taew2_1.pth")  # the file as published
    loaded = build_decoders(card, random_weights=False, checkpoint_dir=tmp_path, **where)
    assert set(loaded) == {"tiny"} and isinstance(loaded["tiny"], TAEHVDecoder)
    ours, theirs = loaded["tiny"].state_dict(), published.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert with_loaded_decoders(card, loaded) is card
    public = card.to_public()
    assert (public["decoders"], public["default_decoder"]) == (["full", "tiny"], "full")
    assert WAN21_13B_CAUSAL.decoders == ("full", "tiny")  # the 1.3B card offers taew2_1
    assert isinstance(
        build_decoders(card, random_weights=True, checkpoint_dir=None, **where)["tiny"],
        TAEHVDecoder,
    )
    assert not isinstance(loaded["tiny"], WanVAE)
