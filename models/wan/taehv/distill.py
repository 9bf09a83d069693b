"""``dreamrt train tiny-decoder``: distil a TAEHV student decoder from a card's full Wan VAE, on
the card's own latents.

Recipe::

    1 latents   the card's own chunk_rollout (its DiT, its 4-step schedule, its chunking), run as
                sessions on a set of prompts and seeds: ``clips`` clips of ``chunks_per_clip``
                chunks, each kept from its stream's first latent frame
    2 targets   the full VAE decodes each clip chunk by chunk with its causal cache (== one pass),
                once, in [-1, 1]
    3 student   TAEHV (random init, or ``init``: e.g. the published taew2_1 to fine-tune) decodes
                a random spatial crop of a clip from the stream start; loss in pixel space vs the
                same crop of the targets; AdamW; until ``steps`` or the wall-clock budget
    4 output    held-out PSNR before/after, and the student saved in the published layout
                (``save_taehv``), which ``load_taehv`` and the ``*-taehv`` cards read

Why the card's own rollouts rather than latents of encoded videos: the student will only ever
decode what this DiT produces under this sampler (off-manifold details, the first-chunk handling,
the chunk boundaries), and the card's recipe is data-free (Self-Forcing trains from prompts), so
no video set is needed. Training on clips from the stream's start keeps the memory blocks'
context exactly what streaming gives them (a clip decoded whole == streamed, tested).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.card import ComponentKind, ModelCard
from models.wan.taehv.checkpoint import load_taehv, save_taehv
from models.wan.taehv.config import TAEHVConfig, TAEHVConfigError
from models.wan.taehv.decoder import TAEHVDecoder

__all__ = ["DistillConfig", "DistillError", "PixelLoss", "distill", "draw_latent_clips"]

log = logging.getLogger(__name__)

# Scenes for cards whose own examples are few; what matters is variety of content and motion.
DEFAULT_PROMPTS = (
    "a red fox running through a snowy pine forest, morning light",
    "waves breaking on a rocky coast under storm clouds",
    "a busy night market with neon signs and steam rising from food stalls",
    "a lantern-lit canal town at dusk, gentle rain",
    "a close-up of a woman laughing, soft window light",
    "an astronaut walking on a dusty red planet",
    "a hot air balloon drifting over green hills, aerial view",
    "a cat chasing a ball of yarn across a wooden floor",
    "traffic on a highway at night, long exposure light trails",
    "a chef slicing vegetables in a bright kitchen",
    "a waterfall in a tropical jungle, mist and sunlight",
    "a city skyline at sunset, timelapse clouds",
    "children playing football on a beach",
    "an old man reading a newspaper in a cafe",
    "a field of sunflowers swaying in the wind",
    "a paper boat floating down a rain-filled street",
)


class DistillError(RuntimeError):
    """A card or configuration the recipe cannot run (names what is missing)."""


@dataclass(frozen=True, slots=True)
class PixelLoss:
    """Loss in pixel space ([-1, 1]): ``l1 * L1 + mse * MSE + structure * S``, where ``S`` is the
    L1 between the finite differences (x, y and t) of prediction and target - an LPIPS-free
    proxy for sharpness and temporal steadiness (edges and flicker weigh, flat error less)."""

    l1: float = 1.0
    mse: float = 1.0
    structure: float = 0.5

    def __call__(
        self, pred: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        # pred, target: [B, 3, n, H, W] -> (scalar, parts)
        l1 = (pred - target).abs().mean()
        mse = (pred - target).square().mean()
        structure = pred.new_zeros(())
        dims = [d for d in (2, 3, 4) if pred.shape[d] > 1]
        for d in dims:
            structure = structure + (pred.diff(dim=d) - target.diff(dim=d)).abs().mean()
        structure = structure / max(1, len(dims))
        total = self.l1 * l1 + self.mse * mse + self.structure * structure
        parts = {"l1": l1.item(), "mse": mse.item(), "structure": structure.item()}
        return total, parts


@dataclass(frozen=True, slots=True)
class DistillConfig:
    """What ``distill`` runs (module docstring). ``crop_latent``: side of the square latent crop
    a step trains on (None or larger than the grid: whole frames); ``held_out``: clips kept out
    of training for the PSNR report; ``student_preset``: default the card's tiny decoder's, else
    ``taew2_1``; ``init``: a TAEHV checkpoint to start from."""

    steps: int = 2000
    budget_s: float = 900.0
    clips: int = 16
    chunks_per_clip: int = 2
    held_out: int = 1
    lr: float = 3e-4
    crop_latent: int | None = 24
    seed: int = 0
    student_preset: str | None = None
    init: str | None = None
    prompts: tuple[str, ...] = ()
    loss: PixelLoss = field(default_factory=PixelLoss)

    def __post_init__(self) -> None:
        if self.clips <= self.held_out or self.held_out < 0:
            raise DistillError(f"clips={self.clips} must exceed held_out={self.held_out}")
        if self.chunks_per_clip < 1 or self.steps < 0 or self.budget_s <= 0:
            raise DistillError("chunks_per_clip >= 1, steps >= 0 and budget_s > 0 are needed")


# --------------------------------------------------------------------------------------------
# data


def draw_latent_clips(
    instance: Any,
    prompts: Sequence[str],
    clips: int,
    chunks_per_clip: int,
    *,
    seed: int,
    deadline: float = math.inf,
    clock: Callable[[], float] = time.monotonic,
) -> list[torch.Tensor]:
    """Latent clips of the card's own sessions: ``[1, C, chunks * c, h, w]`` each, in the DiT's
    latent space, from each stream's first frame; stops early (after at least one) once
    ``clock()`` passes ``deadline``."""
    from models.tinyworld.evaluation.stream import (
        LoopStream,  # the model-side synchronous loop driver
    )

    out: list[torch.Tensor] = []
    for i in range(clips):
        if out and clock() > deadline:
            break
        stream = LoopStream(instance, prompts[i % len(prompts)], seed=seed + i)
        parts = []
        for _ in range(chunks_per_clip):
            stream.next_chunk()  # after the chunk's decode, before its KV update
            latents = stream.state.latents
            assert latents is not None  # the chunk's
            parts.append(latents.detach().clone())
        out.append(torch.cat(parts, dim=2))
    return out


@torch.inference_mode()
def teacher_frames(teacher: Any, clip: torch.Tensor, chunk: int) -> torch.Tensor:
    """The full VAE's frames of a latent clip, chunk by chunk as a session decodes it:
    ``[1, C, f, h, w]`` -> ``[1, 3, 1 + 4 (f - 1), 8h, 8w]`` float32 in [-1, 1]."""
    dtype = next(teacher.parameters()).dtype
    cache = teacher.new_decoder_cache(1, clip.shape[3], clip.shape[4])
    parts = [
        teacher.decode_chunk(teacher.denormalize(clip[:, :, s : s + chunk].to(dtype)), cache)
        for s in range(0, clip.shape[2], chunk)
    ]
    return torch.cat(parts, dim=2).float()


def _crop(
    clip: torch.Tensor, target: torch.Tensor, side: int | None, scale: int, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor]:
    # clip: [1, C, f, h, w], target: [1, 3, n, sh, sw] -> the same latent / pixel window
    h, w = clip.shape[3], clip.shape[4]
    ch, cw = (h, w) if side is None else (min(side, h), min(side, w))
    y, x = rng.randrange(h - ch + 1), rng.randrange(w - cw + 1)
    pixels = target[..., y * scale : (y + ch) * scale, x * scale : (x + cw) * scale]
    return clip[..., y : y + ch, x : x + cw], pixels


# --------------------------------------------------------------------------------------------
# components


def _teacher(
    card: ModelCard, instance: Any, checkpoint_dir: Path | None, device: torch.device, seed: int
) -> Any:
    """The card's full VAE: the instance's codec when it decodes with it, else the card's
    ``vae`` component (random from its preset, or from the checkpoint's ``vae`` entry)."""
    from models.checkpoint.load import load_vae
    from models.wan.vae.autoencoder import WanVAE
    from models.wan.vae.config import VAEConfigError, WanVAEConfig

    spec = card.components.get("vae")
    try:
        if spec is None or spec.kind is not ComponentKind.VAE:
            raise VAEConfigError("no vae component")
        WanVAEConfig.preset(spec.preset)
    except VAEConfigError:
        raise DistillError(f"card {card.model_id!r} has no full Wan VAE to distil from") from None
    if card.decoder_component == "vae":
        return instance.vae

    if card.weights.value == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            vae = WanVAE(WanVAEConfig.preset(spec.preset))
        return vae.to(device=device, dtype=instance.dtype).eval()
    entry = card.checkpoint.components.get("vae")
    if checkpoint_dir is None or entry is None or not (checkpoint_dir / entry.path_hint).exists():
        raise DistillError(
            f"card {card.model_id!r}: the teacher VAE is read from <checkpoint-dir>/"
            f"{entry.path_hint if entry else 'vae'} (pass --checkpoint-dir)"
        )
    return load_vae(checkpoint_dir / entry.path_hint, device=device, dtype=instance.dtype)


def _student(card: ModelCard, config: DistillConfig, device: torch.device) -> TAEHVDecoder:
    preset = config.student_preset
    if preset is None:
        spec = card.components.get("tiny_decoder")
        preset = spec.preset if spec is not None else "taew2_1"
    try:
        student_config = TAEHVConfig.preset(preset)
    except TAEHVConfigError as exc:
        raise DistillError(str(exc)) from None
    if student_config.latent_channels != card.latent.channels:
        raise DistillError(
            f"student preset {preset!r} reads {student_config.latent_channels} latent channels, "
            f"card {card.model_id!r} has {card.latent.channels}"
        )
    if config.init is not None:
        return load_taehv(config.init, device=device, config=student_config).train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return TAEHVDecoder(student_config).to(device).train()


@torch.no_grad()
def _psnr(student: TAEHVDecoder, clips: list[torch.Tensor], targets: list[torch.Tensor]) -> float:
    """Mean PSNR (dB, peak = the [-1, 1] range) of the student's whole frames vs the teacher's."""
    student.eval()
    scores = []
    for clip, target in zip(clips, targets, strict=True):
        pred = student.decode(clip.float())
        mse = (pred - target).square().mean().clamp_min(1e-12)
        scores.append(10.0 * math.log10(4.0 / mse.item()))
    student.train()
    return sum(scores) / len(scores)


# --------------------------------------------------------------------------------------------
# the recipe


def distill(
    card: ModelCard,
    config: DistillConfig,
    *,
    out: str | Path,
    device: str = "auto",
    precision: str | None = None,
    checkpoint_dir: str | Path | None = None,
    instance: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, object]:
    """Run the recipe (module docstring) within ``config.budget_s`` of wall time (from this
    call: loading included); write the student to ``out`` (safetensors, published layout) and
    return a JSON-able summary. ``instance``: the card already loaded (tests, notebooks);
    ``clock``: seconds, monotonic (tests pass a fake one)."""
    start = clock()
    deadline = start + config.budget_s
    root = None if checkpoint_dir is None else Path(checkpoint_dir)
    owned = instance is None
    if instance is None:
        from models.instance import load_instance

        instance = load_instance(card, device=device, precision=precision, checkpoint_dir=root)
    dev = instance.device
    teacher = _teacher(card, instance, root, dev, config.seed)
    student = _student(card, config, dev)
    prompts = config.prompts or (*card.ui.examples, *DEFAULT_PROMPTS)
    # the latents get at most half the budget: the rest trains
    clips = draw_latent_clips(
        instance,
        prompts,
        config.clips,
        config.chunks_per_clip,
        seed=config.seed,
        deadline=start + config.budget_s / 2,
        clock=clock,
    )
    chunk = card.default_profile.chunk_latent_frames
    targets = [teacher_frames(teacher, c, chunk) for c in clips]
    clips = [c.float() for c in clips]
    del teacher  # training needs neither the DiT nor the teacher: free their memory
    if owned:
        del instance
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    held = max(0, min(config.held_out, len(clips) - 1))
    train_set = list(zip(clips[held:], targets[held:], strict=True))
    eval_clips, eval_targets = (clips[:held], targets[:held]) if held else (clips, targets)
    t0 = clock()
    generated_s = t0 - start
    psnr_before = _psnr(student, eval_clips, eval_targets)
    now = clock()
    eval_s = now - t0
    optimizer = torch.optim.AdamW(student.parameters(), lr=config.lr, weight_decay=0.0)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda")
    rng = random.Random(config.seed)
    scale = student.config.spatial_factor
    losses: list[float] = []
    step_s = 0.0
    while len(losses) < config.steps:
        if now + step_s + eval_s > deadline:  # the next step, then the evaluation, must fit
            break
        clip, target = train_set[rng.randrange(len(train_set))]
        z, pixels = _crop(clip, target, config.crop_latent, scale, rng)
        with autocast:
            pred = student.decode(z, clamp=False)
        loss, _ = config.loss(pred.float(), pixels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        later = clock()
        step_s, now = max(step_s, later - now), later  # a whole iteration, the longest yet
        if len(losses) % 100 == 0:
            log.info("step %d loss %.4f", len(losses), sum(losses[-100:]) / 100)
    psnr_after = _psnr(student, eval_clips, eval_targets)
    path = save_taehv(student.eval(), out)
    k = max(1, min(10, len(losses) // 4))
    return {
        "card": card.model_id,
        "student": student.config.to_json(),
        "init": config.init,
        "clips": len(clips),
        "held_out": held,
        "latent_frames_per_clip": int(clips[0].shape[2]),
        "steps": len(losses),
        "loss_first": sum(losses[:k]) / k if losses else None,
        "loss_last": sum(losses[-k:]) / k if losses else None,
        "psnr_before_db": psnr_before,
        "psnr_after_db": psnr_after,
        "generate_s": generated_s,
        "wall_s": clock() - start,
        "budget_s": config.budget_s,
        "out": str(path),
    }
