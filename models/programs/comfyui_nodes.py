"""What of ComfyUI's API-format graph the workflow compiler covers: node classes, their inputs,
and the checkpoint file names each card serves.

``COVERED`` maps each covered ``class_type`` to its inputs, each with what it becomes in the
program (docs/api.md "ComfyUI workflows" prints this table). An input that is not listed, or a
class that is not, is a coverage rejection: the compiler never guesses what a foreign node does.

Checkpoint names: a loader names a file; it is served when its stem (the name without folders,
extension and a precision suffix such as ``_fp16`` or ``_fp8_e4m3fn_scaled``) is one the card
answers to: its ``model_id`` for the diffusion model, plus the file names ComfyUI publishes for
the same weights (``FILE_STEMS``). The card's own weights and serving precision are used either
way; equivalence with a ComfyUI render is a quality claim, never bit parity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from models.card import LoopKind, ModelCard

__all__ = ["COVERED", "FILE_STEMS", "SCHEDULERS", "file_stem", "sampler_names", "served_stems"]

# class_type -> input name -> what it becomes ("link": an edge of the graph, checked by type)
COVERED: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "UNETLoader": {
            "unet_name": "the served card (its diffusion model file)",
            "weight_dtype": "'default' only: the card serves its own precision",
        },
        "CLIPLoader": {
            "clip_name": "the served card (its text encoder file)",
            "type": "'wan' only",
            "device": "ignored: placement, not semantics",
        },
        "VAELoader": {"vae_name": "the served card (its VAE file): the full decoder"},
        "CLIPTextEncode": {
            "text": "the loop's prompt (positive) or negative_prompt (negative)",
            "clip": "link",
        },
        "EmptyHunyuanLatentVideo": {
            "width": "width",
            "height": "height",
            "length": "num_frames: 1 + 4 * ((length - 1) // 4), the frames ComfyUI makes",
            "batch_size": "1 only",
        },
        "EmptyLatentImage": {"width": "width", "height": "height", "batch_size": "1 only"},
        "EmptySD3LatentImage": {"width": "width", "height": "height", "batch_size": "1 only"},
        "ModelSamplingSD3": {"shift": "must equal the card schedule's flow_shift", "model": "link"},
        "LoraLoaderModelOnly": {
            "lora_name": "a registered adapter (its name, or its file stem)",
            "strength_model": "the adapter's strength",
            "model": "link",
        },
        "KSampler": {
            "seed": "seed",
            "steps": "must equal the card schedule's steps",
            "cfg": "guidance_scale (1: no CFG; a loop without CFG takes only 1)",
            "sampler_name": "one the card's loop implements (euler | lcm)",
            "scheduler": "'simple' (the card's evenly spaced, shifted timesteps)",
            "denoise": "1.0 only (from an empty latent)",
            "model": "link",
            "positive": "link",
            "negative": "link",
            "latent_image": "link",
        },
        "KSamplerAdvanced": {
            "add_noise": "'enable' only",
            "noise_seed": "seed",
            "steps": "must equal the card schedule's steps",
            "cfg": "guidance_scale (1: no CFG; a loop without CFG takes only 1)",
            "sampler_name": "one the card's loop implements (euler | lcm)",
            "scheduler": "'simple' (the card's evenly spaced, shifted timesteps)",
            "start_at_step": "0 only",
            "end_at_step": ">= steps (the whole schedule)",
            "return_with_leftover_noise": "'disable' only",
            "model": "link",
            "positive": "link",
            "negative": "link",
            "latent_image": "link",
        },
        "VAEDecode": {"samples": "link", "vae": "link"},
        "CreateVideo": {"images": "link", "fps": "must equal the card profile's fps"},
        "SaveVideo": {
            "video": "link",
            "filename_prefix": "ignored: the artifact is the job's",
            "format": "'auto' or 'mp4': the MP4 artifact",
            "codec": "'auto' or 'h264'",
        },
        "SaveImage": {
            "images": "link",
            "filename_prefix": "ignored: the artifact is the job's (PNG)",
        },
    }
)

SAMPLERS = ("KSampler", "KSamplerAdvanced")
LATENTS = ("EmptyHunyuanLatentVideo", "EmptyLatentImage", "EmptySD3LatentImage")
SCHEDULERS = ("simple",)

# stems ComfyUI publishes for the weights a card serves: by model_id (diffusion models: the
# same architecture preset can hold different weights), by preset (text encoders, VAEs)
FILE_STEMS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "dit": {"wan2.1-t2v-1.3b": ("wan2.1_t2v_1.3b",)},
        "text_encoder": {"umt5-xxl": ("umt5_xxl",), "umt5-tiny": ("umt5_tiny",)},
        "vae": {"wan2.1": ("wan_2.1_vae", "wan2.1_vae"), "tiny": ("wan_tiny_vae",)},
    }
)

_PRECISION_SUFFIX = re.compile(r"(_(fp16|bf16|fp32|fp8_e4m3fn|fp8_e5m2|fp8|scaled))+$")
_EXTENSIONS = (".safetensors", ".pth", ".pt", ".ckpt", ".gguf", ".bin")


def file_stem(name: str) -> str:
    """``"split/umt5_xxl_fp8_e4m3fn_scaled.safetensors"`` -> ``"umt5_xxl"``."""
    stem = name.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for ext in _EXTENSIONS:
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    return _PRECISION_SUFFIX.sub("", stem)


def served_stems(card: ModelCard, kind: str) -> tuple[str, ...]:
    """The file stems a loader of ``kind`` (dit | text_encoder | vae) may name for ``card``."""
    if kind == "dit":
        return (card.model_id.lower(), *FILE_STEMS["dit"].get(card.model_id, ()))
    spec = card.components.get(kind)
    if spec is None:
        return ()
    return (f"{card.model_id.lower()}_{kind}", *FILE_STEMS[kind].get(spec.preset, ()))


def sampler_names(card: ModelCard, loop_id: str) -> tuple[str, ...]:
    """The ComfyUI sampler that matches the update rule of ``card``'s loop ``loop_id``: a
    distilled few-step schedule predicts x0 and re-noises (``lcm``), a chunk rollout always;
    a many-step schedule takes Euler steps of the flow (``euler``)."""
    spec = card.loops[loop_id]
    schedule = spec.schedule
    if spec.kind is LoopKind.CHUNK_ROLLOUT:
        return ("lcm",)
    if schedule is not None and schedule.guidance_scale == 1.0 and schedule.steps <= 8:
        return ("lcm",)
    return ("euler",)
