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
from models.instance.decoders import DecoderUnavailableError, with_loaded_decoders
from models.loops.chunk_rollout.state import ChunkRolloutState
from models.loops.requests import JobRequest, SessionRequest
from models.registry import get
from models.wan.card import WAN21_13B_CAUSAL
from models.wan.components import build_decoders
from models.wan.taehv.checkpoint import load_taehv, published_state_dict, taehv_key_table
from models.wan.taehv.config import TAEHVConfig
from models.wan.taehv.decoder import TAEHVDecoder
from models.wan.vae.autoencoder import WanVAE, video_to_uint8
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


def published_taew2_1(
    seed: int, widths: tuple[int, int, int, int] = (256, 128, 64, 64)
) -> dict[str, torch.Tensor]:
    """A file's state dict as madebyollin publishes ``taew2_1.pth``, built here from the
    published ``nn.Sequential`` decoder (not from our key table): position 0 clamp, 1 conv
    16 -> w0, 2 relu, then per stage s (widths w0, w1, w2 -> w1, w2, w3; published 256, 128,
    64, 64) three MemBlocks (``conv.0`` 2C -> C, ``conv.2``, ``conv.4`` C -> C, 3x3 with bias),
    an Upsample, a TGrow (``conv`` 1x1 C -> C * stride, no bias; stride 1, 2, 2) and a 3x3 conv
    without bias; 21 relu, 22 conv w3 -> 3; plus encoder tensors we do not read."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return 0.1 * torch.randn(*shape, generator=g)

    strides = (1, 2, 2)
    state = {"decoder.1.weight": rand(widths[0], 16, 3, 3), "decoder.1.bias": rand(widths[0])}
    for s_, (c, stride) in enumerate(zip(widths[:3], strides, strict=True)):
        first = 3 + 6 * s_
        for k in range(3):
            for j, n_in in ((0, 2 * c), (2, c), (4, c)):
                state[f"decoder.{first + k}.conv.{j}.weight"] = rand(c, n_in, 3, 3)
                state[f"decoder.{first + k}.conv.{j}.bias"] = rand(c)
        state[f"decoder.{first + 4}.conv.weight"] = rand(c * stride, c, 1, 1)
        state[f"decoder.{first + 5}.weight"] = rand(widths[s_ + 1], c, 3, 3)
    state["decoder.22.weight"], state["decoder.22.bias"] = rand(3, widths[3], 3, 3), rand(3)
    state["encoder.0.weight"], state["encoder.0.bias"] = rand(64, 3, 3, 3), rand(64)
    return state


def test_a_file_in_the_published_layout_decodes_as_the_published_network(
    tmp_path: Path,
) -> None:
    """``taew2_1.pth`` as published (built from the published ``nn.Sequential`` at a few
    channels) loads and decodes as that network does, read literally frame by frame."""
    from tests.models.test_taehv import published_reference

    widths = (8, 6, 4, 4)
    state = published_taew2_1(seed=7, widths=widths)
    torch.save(state, tmp_path / "taew2_1.pth")
    decoder = load_taehv(tmp_path, config=TAEHVConfig(widths=widths))  # the directory form
    z = 2.0 * torch.randn(1, 16, 2, 2, 3, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = decoder.decode(z), published_reference(state, z)
    assert ours.shape == theirs.shape == (1, 3, 5, 16, 24)
    assert ((ours - theirs).abs().max() / theirs.abs().max()).item() <= 1e-5
    full = published_taew2_1(seed=0)  # the published sizes: exactly the names and shapes we map
    with torch.device("meta"):
        ours_meta = TAEHVDecoder(TAEHVConfig.preset("taew2_1"))
    mapped = {row.published: row.ours for row in taehv_key_table(ours_meta.config)}
    decoder_keys = {k for k in full if k.startswith("decoder.")}
    assert decoder_keys == set(mapped) and len(decoder_keys) == 64
    params = ours_meta.state_dict()
    assert all(tuple(full[k].shape) == tuple(params[mapped[k]].shape) for k in decoder_keys)


def test_the_published_file_adds_the_tiny_decoder_to_a_full_vae_card(tmp_path: Path) -> None:
    """A full-VAE card that lists a tiny decoder (as the 1.3B card lists taew2_1) gets it from
    the file under ``tiny_decoder/`` when it is there, and does without it otherwise (its card
    then names one decoder)."""
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
    assert WAN21_13B_CAUSAL.decoders == ("full", "tiny")  # the 1.3B card offers taew2_1 too
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
    torch.save(state, tmp_path / "tiny_decoder" / "taew2_1.pth")  # the published file name
    loaded = build_decoders(card, random_weights=False, checkpoint_dir=tmp_path, **where)
    assert set(loaded) == {"tiny"} and isinstance(loaded["tiny"], TAEHVDecoder)
    ours, theirs = loaded["tiny"].state_dict(), published.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert with_loaded_decoders(card, loaded) is card
    public = card.to_public()
    assert (public["decoders"], public["default_decoder"]) == (["full", "tiny"], "full")
    random = build_decoders(card, random_weights=True, checkpoint_dir=None, **where)
    assert set(random) == {"tiny"} and not isinstance(random["tiny"], WanVAE)
