"""ComfyUI workflows compile to a Program: a pure function of the API-format graph and a card.

``compile_workflow(workflow, card, adapters=...)`` reads the graph ComfyUI's ``/prompt`` takes
(``{node id: {"class_type", "inputs": {name: value | [node id, output index]}}}``) and maps the
Wan text-to-video / text-to-image subset (``comfyui_nodes.COVERED``) onto one program: the
loaders name the served card, the sampler becomes the card's loop node (seed, steps, CFG,
sampler and scheduler checked against what its schedule implements), the text encodes its
prompt and negative prompt, the empty latent its size and length, ``VAEDecode`` a ``full``
decode node, the save node the artifact. It runs nothing and never interprets a node it does
not know: every node, parameter and link that is not covered is collected, and if any is, the
answer is one ``WorkflowCoverageError`` listing them all (before any job exists).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from models.card import ModelCard, ProfileError
from models.programs.comfyui_nodes import (
    COVERED,
    LATENTS,
    SAMPLERS,
    SCHEDULERS,
    file_stem,
    sampler_names,
    served_stems,
)
from models.programs.graph import Program
from models.programs.validation import check, loop_spec_id
from runtime.contract import DreamrtError

__all__ = ["COMFYUI_WAN_SHIFT", "CompiledWorkflow", "WorkflowCoverageError", "compile_workflow"]

# ComfyUI samples Wan models with this flow shift unless a ModelSamplingSD3 node sets one
COMFYUI_WAN_SHIFT = 8.0


class WorkflowCoverageError(DreamrtError, ValueError):
    """A workflow with nodes or parameters the compiler does not cover (a 422): ``uncovered``
    lists each as ``{"node", "class_type", "input", "reason"}`` (``input`` None for a whole
    node)."""

    code = "workflow_not_covered"
    status = 422

    def __init__(self, uncovered: list[dict[str, Any]]) -> None:
        items = "; ".join(
            f"{u['node']} ({u['class_type']})"
            + (f".{u['input']}" if u["input"] else "")
            + f": {u['reason']}"
            for u in uncovered
        )
        super().__init__(
            f"the workflow has what dreamrt does not cover: {items}", uncovered=uncovered
        )
        self.uncovered = uncovered


@dataclass(frozen=True, slots=True)
class CompiledWorkflow:
    """The program, the job fields it starts from, and where each node went (``mapping``:
    ComfyUI node id -> what it became)."""

    program: Program
    job: dict[str, Any]
    mapping: dict[str, str] = field(default_factory=dict)


class _Compiler:
    def __init__(self, workflow: Any, card: ModelCard, adapters: Collection[str]) -> None:
        self.card = card
        self.adapters = tuple(adapters)
        self.uncovered: list[dict[str, Any]] = []
        self.mapping: dict[str, str] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        if isinstance(workflow, Mapping) and isinstance(workflow.get("prompt"), Mapping):
            workflow = workflow["prompt"]  # the body of ComfyUI's POST /prompt
        if not isinstance(workflow, Mapping) or not workflow:
            self._miss(
                "-", "-", None, "a workflow is ComfyUI's API format: {id: {class_type, inputs}}"
            )
            return
        for node_id, node in workflow.items():
            if not isinstance(node, Mapping) or not isinstance(node.get("class_type"), str):
                self._miss(str(node_id), "-", None, "a node needs 'class_type' and 'inputs'")
                continue
            self.nodes[str(node_id)] = {
                "class_type": node["class_type"],
                "inputs": dict(node.get("inputs") or {}),
            }

    def _miss(self, node: str, class_type: str, name: str | None, reason: str) -> None:
        entry = {"node": node, "class_type": class_type, "input": name, "reason": reason}
        if entry not in self.uncovered:  # a node two links reach is checked twice
            self.uncovered.append(entry)

    def _class(self, node_id: str) -> str:
        return self.nodes[node_id]["class_type"]

    def _link(self, node_id: str, name: str, expected: tuple[str, ...]) -> str | None:
        """The node an input links to, if it is one of the ``expected`` classes."""
        value = self.nodes[node_id]["inputs"].get(name)
        cls = self._class(node_id)
        if not (isinstance(value, list) and len(value) == 2 and str(value[0]) in self.nodes):
            self._miss(node_id, cls, name, f"must link to a node of {list(expected)}")
            return None
        target = str(value[0])
        if self._class(target) not in expected:
            self._miss(
                node_id, cls, name, f"links to a {self._class(target)}; covered: {list(expected)}"
            )
            return None
        return target

    def _value(self, node_id: str, name: str, types: tuple[type, ...]) -> Any:
        value = self.nodes[node_id]["inputs"].get(name)
        if isinstance(value, bool) or not isinstance(value, types):
            self._miss(node_id, self._class(node_id), name, f"needs a literal value, got {value!r}")
            return None
        return value

    def _expect(self, node_id: str, name: str, allowed: tuple[Any, ...], why: str) -> None:
        value = self.nodes[node_id]["inputs"].get(name, allowed[0])
        if value not in allowed:
            self._miss(node_id, self._class(node_id), name, f"{value!r}: {why}")

    # ---------------------------------------------------------------------------------------

    def run(self) -> CompiledWorkflow:
        for node_id, node in self.nodes.items():  # every node and input must be covered
            inputs = COVERED.get(node["class_type"])
            if inputs is None:
                self._miss(node_id, node["class_type"], None, "this node class is not covered")
                continue
            for name in node["inputs"]:
                if name not in inputs:
                    self._miss(node_id, node["class_type"], name, "this input is not covered")
            self._check_loader(node_id)  # reached from the sampler or not: each is checked
        outputs = [
            i for i, n in self.nodes.items() if n["class_type"] in ("SaveVideo", "SaveImage")
        ]
        samplers = [i for i, n in self.nodes.items() if n["class_type"] in SAMPLERS]
        if len(samplers) != 1:
            self._miss("-", "-", None, f"one sampler is covered; the workflow has {samplers}")
            raise WorkflowCoverageError(self.uncovered)
        job = self._sampler(samplers[0])
        if len(outputs) == 1:
            self._output(outputs[0], samplers[0], job)
        else:
            self._miss(
                "-", "-", None, f"one SaveVideo or SaveImage is covered; the workflow has {outputs}"
            )
        if self.uncovered:
            raise WorkflowCoverageError(self.uncovered)
        program = self._program(samplers[0], outputs[0], job)
        check(program, self.card)  # a compiled program is valid by construction
        return CompiledWorkflow(program, job, self.mapping)

    def _sampler(self, sid: str) -> dict[str, object]:
        cls = self._class(sid)
        advanced = cls == "KSamplerAdvanced"
        job: dict[str, Any] = {}
        latent = self._link(sid, "latent_image", LATENTS)
        if latent is not None:
            job |= self._latent(latent)
        task = job.get("task", "t2v")
        loop_id = loop_spec_id(self.card, None, task)
        if loop_id is None:
            self._miss(sid, cls, None, f"model {self.card.model_id!r} runs no {task} loop")
            return job
        schedule = self.card.loops[loop_id].schedule
        assert schedule is not None  # a serving loop of a validated card has one
        seed_name = "noise_seed" if advanced else "seed"
        job["seed"] = self._value(sid, seed_name, (int,))
        if job["seed"] is not None and not 0 <= job["seed"] < 2**63:
            self._miss(sid, cls, seed_name, f"{job['seed']}: seeds are 0 .. 2**63 - 1 here")
        steps = self._value(sid, "steps", (int,))
        if steps is not None and steps != schedule.steps:
            self._miss(
                sid, cls, "steps", f"{steps}: the card's {loop_id} samples {schedule.steps} steps"
            )
        job["steps"] = schedule.steps
        cfg = self._value(sid, "cfg", (int, float))
        if cfg is not None and self.card.loops[loop_id].kind.value == "chunk_rollout" and cfg != 1:
            self._miss(sid, cls, "cfg", f"{cfg}: {loop_id} samples without CFG (cfg 1 only)")
        elif cfg is not None and cfg < 1:
            self._miss(sid, cls, "cfg", f"{cfg}: must be >= 1 (1 turns CFG off)")
        job["guidance_scale"] = float(cfg) if cfg is not None else schedule.guidance_scale
        names = sampler_names(self.card, loop_id)
        self._expect(sid, "sampler_name", names, f"the card's {loop_id} implements {list(names)}")
        self._expect(sid, "scheduler", SCHEDULERS, f"the card's schedule is {list(SCHEDULERS)}")
        if advanced:
            self._expect(sid, "add_noise", ("enable",), "sampling starts from noise")
            self._expect(sid, "start_at_step", (0,), "the whole schedule runs")
            end = self.nodes[sid]["inputs"].get("end_at_step", 10000)
            if not isinstance(end, int) or end < schedule.steps:
                self._miss(sid, cls, "end_at_step", f"{end!r}: the whole schedule runs")
            self._expect(sid, "return_with_leftover_noise", ("disable",), "the output is clean")
        else:
            self._expect(sid, "denoise", (1, 1.0), "sampling starts from an empty latent")
        job |= self._model_chain(sid, schedule.flow_shift)
        for name, key in (("positive", "prompt"), ("negative", "negative_prompt")):
            text = self._link(sid, name, ("CLIPTextEncode",))
            if text is not None:
                job[key] = self._value(text, "text", (str,))
                self.mapping[text] = f"loop {key}"
                self._link(text, "clip", ("CLIPLoader",))
        if self.card.loops[loop_id].kind.value == "chunk_rollout" and job.get("negative_prompt"):
            job["negative_prompt"] = ""  # no CFG: the negative branch never runs
            self.mapping[sid] = " (no CFG: the negative prompt is unused)"
        job["loop"] = loop_id
        return job

    def _latent(self, lid: str) -> dict[str, object]:
        cls = self._class(lid)
        width = self._value(lid, "width", (int,))
        height = self._value(lid, "height", (int,))
        self._expect(lid, "batch_size", (1,), "one sample per job")
        try:
            self.card.resolve_profile(width=width, height=height)
        except ProfileError as exc:
            self._miss(lid, cls, exc.field or "width", str(exc))
        frames = 1
        if cls == "EmptyHunyuanLatentVideo":
            length = self._value(lid, "length", (int,))
            frames = 1 + 4 * ((length - 1) // 4) if isinstance(length, int) and length > 0 else 1
        self.mapping[lid] = f"loop width={width} height={height} num_frames={frames}"
        return {
            "task": "t2i" if frames == 1 else "t2v",
            "width": width,
            "height": height,
            "num_frames": frames,
        }

    def _model_chain(self, sid: str, flow_shift: float) -> dict[str, object]:
        """Walk sampler.model back to the UNETLoader: ModelSamplingSD3 (shift) and LoRA
        loaders (adapters) on the way."""
        shift, adapters, shift_node = COMFYUI_WAN_SHIFT, [], None
        node, name = sid, "model"
        while True:
            nxt = self._link(node, name, ("UNETLoader", "ModelSamplingSD3", "LoraLoaderModelOnly"))
            if nxt is None:
                break
            cls = self._class(nxt)
            if cls == "UNETLoader":
                break
            if cls == "ModelSamplingSD3":
                value = self._value(nxt, "shift", (int, float))
                shift, shift_node = (float(value) if value is not None else shift), nxt
                self.mapping[nxt] = f"the card schedule's flow_shift ({flow_shift:g})"
            else:
                adapters.append(self._lora(nxt))
            node = nxt
        if shift != flow_shift:
            at = (shift_node, "shift") if shift_node else (sid, "model")
            origin = "" if shift_node else "no ModelSamplingSD3: ComfyUI's Wan default, "
            self._miss(
                at[0],
                self._class(at[0]),
                at[1],
                f"{origin}shift {shift:g}: the card's schedule samples with {flow_shift:g}",
            )
        return {"adapters": [a for a in reversed(adapters) if a is not None]} if adapters else {}

    def _lora(self, node_id: str) -> list[Any] | None:
        name = self._value(node_id, "lora_name", (str,))
        strength = self._value(node_id, "strength_model", (int, float))
        match = next(
            (a for a in self.adapters if name is not None and a in (name, file_stem(name))), None
        )
        if name is not None and match is None:
            self._miss(
                node_id,
                "LoraLoaderModelOnly",
                "lora_name",
                f"{name!r} is not a registered adapter (registered: {list(self.adapters)})",
            )
            return None
        self.mapping[node_id] = f"adapter {match}"
        return [match, float(strength if strength is not None else 1.0)]

    def _check_loader(self, node_id: str) -> None:
        cls = self._class(node_id)
        if cls == "UNETLoader":
            self._loader(node_id, "unet_name", "dit")
            self._expect(node_id, "weight_dtype", ("default",), "the card serves its own precision")
        elif cls == "CLIPLoader":
            self._loader(node_id, "clip_name", "text_encoder")
            self._expect(node_id, "type", ("wan",), "the card's text encoder is Wan's UMT5")
        elif cls == "VAELoader":
            self._loader(node_id, "vae_name", "vae")

    def _loader(self, node_id: str, name: str, kind: str) -> None:
        value = self._value(node_id, name, (str,))
        stems = served_stems(self.card, kind)
        if value is not None and file_stem(value) not in stems:
            self._miss(
                node_id,
                self._class(node_id),
                name,
                f"{value!r} is not served by model {self.card.model_id!r} "
                f"(it serves {list(stems)})",
            )
        self.mapping[node_id] = f"the served card {self.card.model_id!r}"

    def _output(self, oid: str, sid: str, job: dict[str, Any]) -> None:
        cls = self._class(oid)
        task = job.get("task", "t2v")
        if cls == "SaveImage":
            images = self._link(oid, "images", ("VAEDecode",))
            if task != "t2i":
                self._miss(oid, cls, None, "a video's frames: save it with CreateVideo + SaveVideo")
        else:
            self._expect(oid, "format", ("auto", "mp4"), "the artifact is an MP4")
            self._expect(oid, "codec", ("auto", "h264"), "the artifact is H.264")
            video = self._link(oid, "video", ("CreateVideo",))
            images = None
            if video is not None:
                fps = self._value(video, "fps", (int, float))
                profile_fps = self.card.default_profile.fps
                if fps is not None and fps != profile_fps:
                    self._miss(
                        video, "CreateVideo", "fps", f"{fps}: the card makes {profile_fps} fps"
                    )
                images = self._link(video, "images", ("VAEDecode",))
                self.mapping[video] = "artifact (MP4)"
        self.mapping[oid] = "artifact"
        if images is not None:
            if self._link(images, "samples", SAMPLERS) not in (sid, None):
                self._miss(images, "VAEDecode", "samples", "decodes another sampler's latents")
            self._link(images, "vae", ("VAELoader",))
            self.mapping[images] = "decode node (full)"

    def _program(self, sid: str, oid: str, job: dict[str, Any]) -> Program:
        loop = {
            k: job[k]
            for k in (
                "prompt",
                "negative_prompt",
                "num_frames",
                "width",
                "height",
                "seed",
                "steps",
                "guidance_scale",
                "adapters",
            )
            if k in job
        }
        self.mapping[sid] = f"loop node (the card's {job['loop']})" + self.mapping.get(sid, "")
        fmt = "png" if job["task"] == "t2i" else "mp4"
        return Program.from_dict(
            {
                "name": "comfyui",
                "nodes": {
                    f"sampler_{sid}": {"kind": "loop", "loop": job["loop"], **loop},
                    f"decode_{sid}": {"kind": "decode", "decoder": "full"},
                    f"save_{oid}": {"kind": "artifact", "format": fmt},
                },
                "edges": [
                    {"from": f"sampler_{sid}.latents", "to": f"decode_{sid}.latents"},
                    {
                        "from": f"decode_{sid}.frames",
                        "to": f"save_{oid}.frames",
                        "kind": "artifact",
                    },
                ],
            }
        )


def compile_workflow(
    workflow: Any, card: ModelCard, *, adapters: Collection[str] = ()
) -> CompiledWorkflow:
    """``workflow`` (ComfyUI's API format, or the ``/prompt`` body holding it under
    ``"prompt"``) as a program for ``card``; ``WorkflowCoverageError`` listing everything it
    does not cover. ``adapters``: the LoRA adapters registered for the card's model."""
    compiler = _Compiler(workflow, card, adapters)
    if compiler.uncovered:
        raise WorkflowCoverageError(compiler.uncovered)
    return compiler.run()
