"""diffusion_denoise through the bidirectional Wan cards: jobs run to completion with the runtime
driver, deterministic per seed, with classifier-free guidance applied; the 1.3B card loads a
diffusers-layout directory (written here at tiny dimensions)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import msgspec
import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from models.card import RecipeMismatchError
from models.instance import InstanceError, load_instance
from models.loops.diffusion_denoise import DiffusionDenoise
from models.loops.ops import DiffusionStepArgs
from models.loops.requests import JobRequest
from models.registry import get
from models.wan.card import WAN21_T2V_SCHEDULE
from models.wan.dit.config import WanDiTConfig
from models.wan.vae.config import WanVAEConfig
from runtime.contract import PlanKind
from runtime.driver import Driver, InlineContext
from tests.models.test_text_encoder import write_checkpoint

TINY = "wan2.1-t2v-tiny-random"


@pytest.fixture(scope="module")
def instance():
    return load_instance(get(TINY), device="cpu", seed=5)


def run_job(instance, **fields) -> tuple[torch.Tensor, InlineContext]:
    """A job to completion through the runtime driver; -> (frames [n, H, W, 3], context)."""
    request = JobRequest(**{"task": "t2v", "prompt": "a red ball", "num_frames": 5, **fields})
    ctx = InlineContext("job")
    result = asyncio.run(Driver(instance.loop("diffusion_denoise"), ctx).run(request, instance))
    return result.outputs["frames"], ctx


@pytest.fixture(scope="module")
def guided(instance) -> tuple[torch.Tensor, InlineContext]:
    """The card's default job: seed 1, guidance 5."""
    return run_job(instance, seed=1)


def kinds(ctx: InlineContext) -> list[PlanKind]:
    return [plan.kind for plan in ctx.executed]


# --------------------------------------------------------------------------------------------
# the cards


def test_base_card_serves_jobs_only_with_the_wan_sampler() -> None:
    card = get("wan2.1-t2v-1.3b")
    assert card.capabilities == {"text_to_video", "text_to_image"}
    spec = card.loop_for("text_to_video")
    assert (spec.loop_id, spec.attention.value) == ("diffusion_denoise", "bidirectional")
    assert spec.schedule == WAN21_T2V_SCHEDULE
    s = WAN21_T2V_SCHEDULE
    assert (s.steps, s.flow_shift, s.guidance_scale) == (50, 5.0, 5.0)
    assert "chunk_kv" not in card.caches and card.loop_for("session.realtime") is None
    with pytest.raises(RecipeMismatchError, match="has no loop 'chunk_rollout'"):
        card.check_serving("chunk_rollout", "bf16")
    assert card.weights.value == "external"
    assert {c: (e.path_hint, e.format.value) for c, e in card.checkpoint.components.items()} == {
        "dit": ("transformer", "diffusers"),
        "vae": ("vae", "diffusers"),
        "text_encoder": ("text_encoder", "diffusers"),
        "tokenizer": ("tokenizer", "diffusers"),
    }
    with pytest.raises(InstanceError, match="pass the checkpoint directory"):
        load_instance(card, device="cpu")


def test_tiny_card_is_the_same_loop_and_recipe_at_tiny_dimensions() -> None:
    base, tiny = get("wan2.1-t2v-1.3b"), get(TINY)
    assert tiny.loops == base.loops
    assert tiny.recipe.assumes_loop == base.recipe.assumes_loop == "diffusion_denoise"
    assert tiny.capabilities == base.capabilities
    assert {c: s.preset for c, s in tiny.components.items()} == {
        "dit": "tiny",
        "vae": "tiny",
        "text_encoder": "umt5-tiny",
        "tokenizer": "byte-fallback",
    }
    assert "random weights" in tiny.description


# --------------------------------------------------------------------------------------------
# jobs through the driver


def test_t2v_job_runs_every_plan_and_returns_the_requested_frames(instance, guided) -> None:
    assert isinstance(instance.loop("diffusion_denoise"), DiffusionDenoise)
    frames, ctx = guided
    assert frames.shape == (5, 64, 64, 3) and frames.dtype == torch.uint8
    # prompt + empty negative prompt, 50 guided steps, two decodes of the 2 latent frames: the
    # clip's first frame alone, as a session's, then the rest (the decoder graphs sessions run)
    assert kinds(ctx) == (
        [PlanKind.TEXT_ENCODE] * 2 + [PlanKind.DIFFUSION_STEP] * 50 + [PlanKind.VAE_DECODE] * 2
    )
    decodes = [p for p in ctx.executed if p.kind is PlanKind.VAE_DECODE]
    assert [p.shape_sig for p in decodes] == ["decode:1:1x8x8", "decode:0:1x8x8"]
    assert [p.args.latents.shape[2] for p in decodes] == [1, 1]
    steps = [p.args for p in ctx.executed if p.kind is PlanKind.DIFFUSION_STEP]
    assert all(a.negative is not None and a.guidance_scale == 5.0 for a in steps)
    assert not any(a.renoise for a in steps)  # a 50-step schedule takes Euler steps
    assert [a.init_seed is not None for a in steps] == [True] + [False] * 49
    assert steps[-1].sigma_next == 0.0
    progress = [
        msgspec.structs.asdict(e.spec.meta) for e in ctx.emissions if e.spec.stream == "progress"
    ]
    assert [p["done"] for p in progress] == list(range(1, 55))
    assert {p["total"] for p in progress} == {54}

    again, _ = run_job(instance, seed=1)
    other, _ = run_job(instance, seed=2)
    assert torch.equal(frames, again)
    assert not torch.equal(frames, other)


def test_guidance_one_turns_cfg_off_and_changes_the_result(instance, guided) -> None:
    plain, ctx = run_job(instance, seed=1, guidance_scale=1.0)
    assert kinds(ctx).count(PlanKind.TEXT_ENCODE) == 1  # no negative prompt to encode
    steps = [p.args for p in ctx.executed if p.kind is PlanKind.DIFFUSION_STEP]
    assert len(steps) == 50 and all(a.negative is None for a in steps)
    assert not ctx.executed[1].shape_sig.endswith(":cfg")
    assert not torch.equal(guided[0], plain)


def test_t2i_job_makes_one_frame(instance) -> None:
    frames, _ = run_job(instance, task="t2i", num_frames=None, seed=3)
    assert frames.shape == (1, 64, 64, 3)


def test_requests_the_recipe_cannot_honour_are_refused(instance) -> None:
    loop = instance.loop("diffusion_denoise")
    with pytest.raises(ValueError, match="steps=4, but its recipe samples with 50 steps"):
        loop.init(JobRequest(task="t2v", prompt="x", steps=4), instance, None)
    with pytest.raises(ValueError, match="guidance_scale=0.5 must be finite and >= 1"):
        loop.init(JobRequest(task="t2v", prompt="x", guidance_scale=0.5), instance, None)


# --------------------------------------------------------------------------------------------
# the step ops


def test_text_embed_op_returns_the_encoders_embedding(instance) -> None:
    [embedding] = instance.text_embed_op(["a red ball"])
    assert embedding.shape == (1, instance.text_len, instance.dit.config.text_dim)
    assert torch.equal(embedding, instance.text.encode(["a red ball"]))


def test_diffusion_step_op_combines_the_branches_as_cfg(instance) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 2, 8, 8, generator=gen)
    text, negative = instance.text.encode(["a red ball"]), instance.text.encode([""])
    t, sigma, sigma_next = 900.0, 0.9, 0.8
    with torch.no_grad():
        v_c = instance.dit(x, torch.tensor([t]), text)
        v_u = instance.dit(x, torch.tensor([t]), negative)
    args = DiffusionStepArgs(
        x=x,
        timestep=t,
        sigma=sigma,
        sigma_next=sigma_next,
        noise_seed=1,
        init_seed=None,
        text=text,
        negative=negative,
        guidance_scale=5.0,
        renoise=False,
    )
    [out] = instance.diffusion_step_op([args])
    expected = x + (sigma_next - sigma) * (v_u + 5.0 * (v_c - v_u))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    [plain] = instance.diffusion_step_op([dataclasses.replace(args, negative=None)])
    torch.testing.assert_close(plain, x + (sigma_next - sigma) * v_c, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# the 1.3B card's weights: a diffusers-layout directory


def test_base_card_loads_a_diffusers_directory_and_runs_a_job(tmp_path: Path) -> None:
    tiny = get(TINY)
    # the 1.3B card's manifest, loops and recipe with tiny component presets, so that a
    # diffusers directory of tiny modules is a valid checkpoint for it
    card = dataclasses.replace(
        get("wan2.1-t2v-1.3b"),
        model_id="wan2.1-t2v-tiny-diffusers",
        components=tiny.components,
        default_profile=tiny.default_profile,
    )
    dit_cfg, vae_cfg = WanDiTConfig.preset("tiny"), WanVAEConfig.preset("tiny")
    torch.manual_seed(0)
    reference = WanTransformer3DModel(**dit_cfg.to_diffusers_config()).eval()
    reference.save_pretrained(tmp_path / "transformer")
    AutoencoderKLWan(**vae_cfg.to_diffusers_config()).save_pretrained(tmp_path / "vae")
    write_checkpoint(tmp_path, d_model=dit_cfg.text_dim)

    loaded = load_instance(card, device="cpu", checkpoint_dir=tmp_path)
    assert loaded.dit.config.dim == dit_cfg.dim
    head = loaded.dit.state_dict()["head.head.weight"]
    assert torch.equal(head, reference.state_dict()["proj_out.weight"])
    frames, ctx = run_job(loaded, task="t2i", num_frames=None, seed=0)
    assert frames.shape == (1, 64, 64, 3)
    assert kinds(ctx).count(PlanKind.DIFFUSION_STEP) == 50
