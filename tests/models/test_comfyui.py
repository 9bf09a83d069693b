"""ComfyUI API-format workflows compile to a program: each covered parameter arrives where it
should, everything else is one rejection listing every node and parameter not covered, and a
compiled workflow runs to the frames of the equivalent plain job."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from models.instance import load_instance
from models.loops.requests import JobRequest, ProgramRequest
from models.programs.comfyui import WorkflowCoverageError, compile_workflow
from models.programs.comfyui_nodes import COVERED, file_stem
from models.programs.program_loop import ProgramLoop
from models.registry import get
from runtime.driver import run_inline

WORKFLOWS = Path(__file__).parent / "workflows"
WAN_T2V = get("wan2.1-t2v-1.3b")


def load(name: str) -> dict[str, Any]:
    return json.loads((WORKFLOWS / name).read_text())


def rejected(workflow: Any, card: Any = WAN_T2V, **kwargs: Any) -> list[tuple[str, str | None]]:
    with pytest.raises(WorkflowCoverageError) as err:
        compile_workflow(workflow, card, **kwargs)
    assert err.value.status == 422 and err.value.code == "workflow_not_covered"
    return [(u["node"], u["input"]) for u in err.value.uncovered]


def test_the_wan_t2v_workflow_lands_every_parameter_where_it_belongs() -> None:
    compiled = compile_workflow(load("wan21_t2v.json"), WAN_T2V, adapters=("watercolor",))
    program = compiled.program.to_dict()
    assert program["nodes"] == {
        "sampler_3": {
            "kind": "loop",
            "loop": "diffusion_denoise",
            "prompt": "a red fox running through a snowy pine forest",  # node 6 (positive)
            "negative_prompt": "blurry, static, low quality",  # node 7 (negative)
            "num_frames": 33,  # length 35: the 33 frames ComfyUI makes of it
            "width": 832,
            "height": 480,
            "seed": 4242,
            "steps": 50,
            "guidance_scale": 5.0,  # cfg
            "adapters": [["watercolor", 0.75]],  # LoraLoaderModelOnly
        },
        "decode_3": {"kind": "decode", "decoder": "full"},  # VAEDecode
        "save_58": {"kind": "artifact", "format": "mp4"},  # CreateVideo + SaveVideo
    }
    assert [(e["from"], e["to"], e["kind"]) for e in program["edges"]] == [
        ("sampler_3.latents", "decode_3.latents", "tensor"),
        ("decode_3.frames", "save_58.frames", "artifact"),
    ]
    assert sorted(compiled.mapping) == sorted(load("wan21_t2v.json"))  # every node accounted
    assert compiled.mapping["52"] == "adapter watercolor"
    assert compiled.job["task"] == "t2v"


def test_the_wan_t2i_workflow_with_the_advanced_sampler() -> None:
    compiled = compile_workflow(load("wan21_t2i.json"), WAN_T2V)
    (loop,) = [n for n in compiled.program.nodes if n.kind.value == "loop"]
    assert dict(loop.params) == {
        "loop": "diffusion_denoise",
        "prompt": "a lighthouse on a cliff at dusk, oil painting",
        "negative_prompt": "",
        "num_frames": 1,
        "width": 832,
        "height": 480,
        "seed": 7,  # noise_seed
        "steps": 50,
        "guidance_scale": 3.5,
    }
    assert compiled.program.node("save_9").params["format"] == "png"
    assert compiled.job["task"] == "t2i"


def test_comfyuis_own_example_is_rejected_naming_every_difference() -> None:
    assert rejected(load("wan21_t2v_comfyui_example.json")) == [
        ("28", None),  # SaveAnimatedWEBP: not covered
        ("3", "steps"),  # 30, the card samples 50
        ("3", "sampler_name"),  # uni_pc, the card's loop is Euler
        ("48", "shift"),  # 8, the card's schedule 5
        ("-", None),  # no covered save node
    ]


def mutate(workflow: dict[str, Any], node: str, **inputs: Any) -> dict[str, Any]:
    out = copy.deepcopy(workflow)
    out[node]["inputs"].update(inputs)
    return out


def test_each_uncovered_node_and_parameter_is_named() -> None:
    base = load("wan21_t2v.json")
    cases = [
        (("37", "unet_name"), mutate(base, "37", unet_name="wan2.1_t2v_14B_fp16.safetensors")),
        (("37", "weight_dtype"), mutate(base, "37", weight_dtype="fp8_e4m3fn")),
        (("38", "clip_name"), mutate(base, "38", clip_name="t5xxl_fp16.safetensors")),
        (("38", "type"), mutate(base, "38", type="sd3")),
        (("39", "vae_name"), mutate(base, "39", vae_name="wan2.2_vae.safetensors")),
        (("40", "batch_size"), mutate(base, "40", batch_size=2)),
        (("40", "width"), mutate(base, "40", width=830)),
        (("3", "scheduler"), mutate(base, "3", scheduler="karras")),
        (("3", "denoise"), mutate(base, "3", denoise=0.6)),
        (("3", "cfg"), mutate(base, "3", cfg=0.5)),
        (("3", "seed"), mutate(base, "3", seed=["6", 0])),
        (("3", "seed"), mutate(base, "3", seed=2**64 - 1)),
        (("57", "fps"), mutate(base, "57", fps=24)),
        (("58", "format"), mutate(base, "58", format="webm")),
        (("52", "lora_name"), mutate(base, "52", lora_name="unknown_style.safetensors")),
        (("3", "eta"), mutate(base, "3", eta=0.5)),
    ]
    for expected, workflow in cases:
        found = rejected(workflow, adapters=("watercolor",))
        assert found == [expected], (expected, found)
    foreign = copy.deepcopy(base)
    foreign["99"] = {"class_type": "TeaCacheForVideo", "inputs": {"model": ["37", 0]}}
    assert rejected(foreign, adapters=("watercolor",)) == [("99", None)]
    two = copy.deepcopy(base)
    two["4"] = copy.deepcopy(two["3"])
    assert rejected(two, adapters=("watercolor",)) == [("-", None)]
    with pytest.raises(WorkflowCoverageError) as err:
        compile_workflow(mutate(base, "37", unet_name="other.safetensors"), WAN_T2V)
    reasons = " | ".join(u["reason"] for u in err.value.uncovered)
    assert "'other.safetensors' is not served by model 'wan2.1-t2v-1.3b'" in reasons
    assert "'watercolor.safetensors' is not a registered adapter" in reasons
    assert "other.safetensors" in str(err.value)  # the message names it too


def test_a_few_step_causal_card_takes_its_own_sampler_and_no_cfg() -> None:
    card = get("wan-tiny-taehv-random")
    workflow = load("wan21_t2v_tiny.json")["prompt"]
    workflow["37"]["inputs"]["unet_name"] = "wan-tiny-taehv-random.safetensors"
    workflow["38"]["inputs"]["clip_name"] = "umt5_tiny_fp16.safetensors"
    workflow["3"]["inputs"].update(steps=4, cfg=1, sampler_name="lcm")
    compiled = compile_workflow(workflow, card)
    loop = compiled.program.node("sampler_3")
    assert loop.params["loop"] == "chunk_rollout" and loop.params["negative_prompt"] == ""
    assert "negative prompt is unused" in compiled.mapping["3"]
    workflow["3"]["inputs"].update(cfg=5, sampler_name="euler")
    assert rejected(workflow, card) == [("3", "cfg"), ("3", "sampler_name")]


def test_the_coverage_table_and_file_names() -> None:
    assert file_stem("split_files/umt5_xxl_fp8_e4m3fn_scaled.safetensors") == "umt5_xxl"
    assert file_stem("wan2.1_t2v_1.3B_bf16.safetensors") == "wan2.1_t2v_1.3b"
    for name in ("UNETLoader", "CLIPLoader", "VAELoader", "CLIPTextEncode", "KSampler"):
        assert name in COVERED
    assert rejected({"1": {"inputs": {}}}) == [("1", None)]
    assert rejected([]) == [("-", None)]


def test_a_compiled_workflow_runs_to_the_frames_of_its_plain_job() -> None:
    instance = load_instance(get("wan2.1-t2v-tiny-random"), device="cpu")
    compiled = compile_workflow(load("wan21_t2v_tiny.json"), instance.card)
    job = JobRequest(task="t2v", prompt="ignored: the program's loop node says", seed=0)
    request = ProgramRequest(program=compiled.program.to_dict(), job=job)
    result, _ = asyncio.run(run_inline(ProgramLoop(instance, compiled.program), request, instance))
    plain = JobRequest(
        task="t2v",
        prompt="a red kite over a beach",
        negative_prompt="blurry",
        num_frames=9,
        width=64,
        height=64,
        seed=11,
        guidance_scale=5.0,
    )
    alone, _ = asyncio.run(run_inline(instance.loop("diffusion_denoise"), plain, instance))
    assert result.outputs["frames"].shape == (9, 64, 64, 3)
    assert torch.equal(result.outputs["frames"], alone.outputs["frames"])


def test_a_workflows_lora_reaches_the_denoising_steps(tmp_path: Path) -> None:
    """LoraLoaderModelOnly -> a registered adapter, active on the job's denoising steps: the
    compiled text-to-image program equals the plain job with that adapter, not the one without."""
    from tests.models.test_lora import lora_tensors, write_peft

    instance = load_instance(get("wan2.1-t2v-tiny-random"), device="cpu")
    layers = lora_tensors(instance.dit, ["blocks.0.self_attn.q", "blocks.0.ffn.0"], seed=2)
    instance.adapters.register("watercolor", write_peft(tmp_path / "wc", layers, alpha=4.0))
    workflow = load("wan21_t2v_tiny.json")["prompt"]
    workflow["40"]["inputs"]["length"] = 1  # one frame: text-to-image, saved as an image
    del workflow["57"], workflow["58"]
    workflow["9"] = {
        "class_type": "SaveImage",
        "inputs": {"images": ["8", 0], "filename_prefix": "x"},
    }
    workflow["52"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {
            "lora_name": "watercolor.safetensors",
            "strength_model": 0.8,
            "model": ["37", 0],
        },
    }
    workflow["48"]["inputs"]["model"] = ["52", 0]
    compiled = compile_workflow(workflow, instance.card, adapters=("watercolor",))
    assert compiled.program.node("sampler_3").params["adapters"] == [["watercolor", 0.8]]
    request = ProgramRequest(
        program=compiled.program.to_dict(), job=JobRequest(task="t2i", prompt="x")
    )
    result, _ = asyncio.run(run_inline(ProgramLoop(instance, compiled.program), request, instance))
    fields = dict(prompt="a red kite over a beach", negative_prompt="blurry", seed=11)
    plain = JobRequest(task="t2i", width=64, height=64, guidance_scale=5.0, **fields)
    loop = instance.loop("diffusion_denoise")
    with_lora, _ = asyncio.run(
        run_inline(loop, msgspec.structs.replace(plain, adapters=(("watercolor", 0.8),)), instance)
    )
    without, _ = asyncio.run(run_inline(loop, plain, instance))
    assert result.outputs["frames"].shape == (1, 64, 64, 3)
    assert torch.equal(result.outputs["frames"], with_lora.outputs["frames"])
    assert not torch.equal(result.outputs["frames"], without.outputs["frames"])
