"""``diffusion_denoise``: bidirectional sampling of a whole clip, for jobs of base models.

Plans: ``text_encode`` of the prompt (and of the negative prompt when CFG is on), one
``diffusion_step`` per schedule step over the whole latent clip (CFG as a policy: both branches
in one batch of 2), then the clip's ``vae_decode`` in chunks through the causal decoder cache
(its first latent frame alone, as a session's: ``models.loops.pieces.decode_pieces``).
Distilled few-step schedules (``guidance_scale`` 1, x0-prediction + re-noising) and multi-step
Euler schedules share the same body; ``renoise`` picks the update rule. A job may lower or raise
the guidance scale (``JobRequest.guidance_scale``; 1 turns CFG off); the steps are the recipe's.

Extensions (``models/loops/extensions.py``): a request's interceptors (step/block residual
caches) pass the pre-flight rules in ``init``, before any plan; their state lives in
``plugin_state`` and every step's hooks come from it, so a job with caching interleaves with
others and snapshots like any job. ``finalize`` reports how many steps reused cached work.

Causal (chunk-causal) cards do not use this loop for jobs: their recipe trained chunk by chunk,
so their cards name ``chunk_rollout`` for jobs (``ModelCard.loop_for``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from models.card import LoopSpec
from models.loops.extensions import LoopExtensions, extension_summary
from models.loops.model import LoopModel
from models.loops.ops import DecodeArgs, DiffusionStepArgs
from models.loops.pieces import decode_pieces
from models.loops.requests import JobRequest
from models.loops.sampling import noise_seed, sigma_steps
from models.wan.dit.flops import dit_flops
from models.wan.vae.cache import DecoderCache
from runtime.contract import (
    Done,
    EmitSpec,
    InputEvent,
    LoopContext,
    LoopResult,
    LoopState,
    PlanKind,
    ProgressMeta,
    ScheduleFacts,
    StepOp,
    StepResult,
    Stream,
    WorkPlan,
)

__all__ = ["DiffusionDenoise", "DiffusionState"]

NEGATIVE_PROMPT = ""


class DiffusionState(LoopState, kw_only=True):
    loop_id: str
    seed: int
    prompt: str
    negative_prompt: str = NEGATIVE_PROMPT
    guidance_scale: float
    latent_frames: int
    latent_h: int
    latent_w: int
    num_frames: int  # pixel frames requested (the decode may give a few more; trimmed)
    decode_chunk: int
    decode: bool = True  # False: stop at the latents (a program's decode nodes take them)
    denoise_step: int = 0
    decoded_latents: int = 0
    text: torch.Tensor | None = None  # [1, L, text_dim]
    negative: torch.Tensor | None = None
    latents: torch.Tensor | None = None  # [1, C, f, h, w]
    adapters: list[tuple[str, float]] = []  # LoRA adapters and strengths (models/lora.py)
    decoder: DecoderCache  # advanced in place by each decode
    frames: list[torch.Tensor] = []


class DiffusionDenoise:
    """Bidirectional T2V/T2I sampling (see module docstring)."""

    name = "diffusion_denoise"

    def __init__(self, model: LoopModel, spec: LoopSpec) -> None:
        if spec.schedule is None:
            raise ValueError(f"card {model.card.model_id!r}: {spec.loop_id} has no schedule")
        self._m = model
        self._schedule = spec.schedule
        self._steps = sigma_steps(
            spec.schedule.timesteps, spec.schedule.flow_shift, spec.schedule.num_train_timesteps
        )
        # A distilled schedule (few steps, no CFG) predicts x0 and re-noises; else Euler.
        self._renoise = spec.schedule.guidance_scale == 1.0 and len(self._steps) <= 8
        self._extensions = LoopExtensions(model)

    def init(
        self, request: JobRequest, model: Any, ctx: LoopContext | None = None
    ) -> DiffusionState:
        """Raises ``ValueError`` naming the request field the card cannot honour."""
        m = self._m
        profile = m.card.resolve_profile(width=request.width, height=request.height)
        num_frames = 1 if request.task == "t2i" else (request.num_frames or profile.fps * 2)
        guidance = (
            request.guidance_scale
            if request.guidance_scale is not None
            else self._schedule.guidance_scale
        )
        self._check(request, num_frames, guidance)
        plugin_state = self.check_request(request)
        latent_frames = 1 + math.ceil((num_frames - 1) / m.latent.temporal_stride)
        s = m.latent.spatial_stride
        lh, lw = profile.height // s, profile.width // s
        return DiffusionState(
            loop_id=ctx.loop_id if ctx is not None else "loop",
            seed=request.seed,
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            guidance_scale=guidance,
            latent_frames=latent_frames,
            latent_h=lh,
            latent_w=lw,
            num_frames=num_frames,
            decode_chunk=profile.chunk_latent_frames,
            decode=request.decode,
            adapters=list(request.adapters),
            decoder=m.new_decoder_cache(lh, lw),
            plugin_state=plugin_state,
        )

    def check_request(self, request: JobRequest) -> dict[str, object]:
        """The extension pre-flight of ``request`` (``ExtensionRejected``, a ``ValueError``,
        naming both sides) -> its initial ``plugin_state``; a host calls it before queuing."""
        facts = ScheduleFacts(
            model_id=self._m.card.model_id,
            loop=self.name,
            steps=len(self._steps),
            step_skipping=self._schedule.step_skipping,
        )
        return self._extensions.start(request.extensions, facts, exact=request.exact)

    def absorb(self, state: DiffusionState, inputs: Sequence[InputEvent]) -> DiffusionState:
        kinds = sorted({event.kind for event in inputs})
        raise ValueError(f"diffusion_denoise takes no live inputs (got {kinds})")

    def next(self, state: DiffusionState) -> WorkPlan | Done:
        cfg = state.guidance_scale != 1.0
        if state.text is None:
            return self._plan(
                state, PlanKind.TEXT_ENCODE, self._m.text_embed_op, state.prompt, "embed"
            )
        if cfg and state.negative is None:
            return self._plan(
                state, PlanKind.TEXT_ENCODE, self._m.text_embed_op, state.negative_prompt, "embed"
            )
        if state.denoise_step < len(self._steps):
            step = self._steps[state.denoise_step]
            shape = (
                1,
                self._m.latent.channels,
                state.latent_frames,
                state.latent_h,
                state.latent_w,
            )
            x = state.latents
            init_seed = None
            if x is None:  # first step: pure noise at sigma = 1, drawn by the op
                x = torch.empty(shape, device=self._m.device, dtype=self._m.dtype)
                init_seed = noise_seed(state.seed, -1)
            args = DiffusionStepArgs(
                x=x,
                timestep=step.timestep,
                sigma=step.sigma,
                sigma_next=step.sigma_next,
                noise_seed=noise_seed(state.seed, state.denoise_step),
                init_seed=init_seed,
                text=state.text,
                negative=state.negative if cfg else None,
                guidance_scale=state.guidance_scale,
                renoise=self._renoise,
                hooks=self._extensions.call(
                    state.plugin_state, state.loop_id, state.denoise_step, len(self._steps)
                ),
            )
            # CFG doubles the batch: a different cost, so a different shape signature
            return self._plan(
                state,
                PlanKind.DIFFUSION_STEP,
                self._m.diffusion_step_op,
                args,
                f"clip{state.latent_frames}x{state.latent_h}x{state.latent_w}"
                f"{':cfg' if cfg else ''}",
                flops=self._flops(state) * (2 if cfg else 1),
            )
        if state.decode and state.decoded_latents < state.latent_frames:
            start, end = self._pieces(state)[0]
            assert state.latents is not None  # the steps made them
            decode = DecodeArgs(latents=state.latents[:, :, start:end], cache=state.decoder)
            return self._plan(
                state,
                PlanKind.VAE_DECODE,
                self._m.decode_op,
                decode,
                f"decode:{int(start == 0)}:{end - start}x{state.latent_h}x{state.latent_w}",
            )
        return Done()

    def advance(self, state: DiffusionState, result: StepResult) -> DiffusionState:
        state.step += 1
        if state.text is None:
            state.text = result.output
        elif state.guidance_scale != 1.0 and state.negative is None:
            state.negative = result.output
        elif state.denoise_step < len(self._steps):
            state.plugin_state, state.latents = self._extensions.fold(
                state.plugin_state, result.output
            )
            state.denoise_step += 1
        else:
            state.frames.append(result.output)
            state.decoded_latents = self._pieces(state)[0][1]
        return state

    def finalize(self, state: DiffusionState) -> LoopResult:
        frames = torch.cat(state.frames)[: state.num_frames] if state.frames else None
        outputs: dict[str, object] = {"frames": frames, "latents": state.latents}
        if state.plugin_state:
            outputs["extensions"] = extension_summary(state.plugin_state)
        return LoopResult(outputs)

    # ---------------------------------------------------------------------------------------

    def _check(self, request: JobRequest, num_frames: int, guidance: float) -> None:
        model_id = self._m.card.model_id
        if request.task not in ("t2v", "t2i"):
            raise ValueError(f"model {model_id!r}: task {request.task!r} is not t2v or t2i")
        if num_frames < 1:
            raise ValueError(f"model {model_id!r}: num_frames={num_frames} must be >= 1")
        if request.steps is not None and request.steps != len(self._steps):
            raise ValueError(
                f"model {model_id!r}: steps={request.steps}, but its recipe samples "
                f"with {len(self._steps)} steps"
            )
        if not (math.isfinite(guidance) and guidance >= 1.0):
            raise ValueError(
                f"model {model_id!r}: guidance_scale={guidance} must be finite "
                "and >= 1 (1 turns classifier-free guidance off)"
            )

    def plan_table(self, state: DiffusionState) -> list[tuple[str, str, int, float]]:
        """(kind, shape signature, count, FLOPs per plan) of the plans left: what a price in
        GPU-seconds is made of (``CostModel.gpu_seconds``)."""
        cfg = state.guidance_scale != 1.0
        encodes = (state.text is None) + (cfg and state.negative is None)
        clip = f"clip{state.latent_frames}x{state.latent_h}x{state.latent_w}{':cfg' if cfg else ''}"
        steps = len(self._steps) - state.denoise_step
        table = [
            (PlanKind.TEXT_ENCODE.value, "embed", int(encodes), 0.0),
            (PlanKind.DIFFUSION_STEP.value, clip, steps, self._flops(state) * (2 if cfg else 1)),
        ]
        if state.decode:
            hw = f"{state.latent_h}x{state.latent_w}"
            for start, stop in self._pieces(state):
                sig = f"decode:{int(start == 0)}:{stop - start}x{hw}"
                table.append((PlanKind.VAE_DECODE.value, sig, 1, 0.0))
        return [row for row in table if row[2] > 0]

    def plans_total(self, state: DiffusionState) -> int:
        """The plans this job runs in all (its progress total)."""
        encodes = 2 if state.guidance_scale != 1.0 else 1
        decodes = len(decode_pieces(0, state.latent_frames, state.decode_chunk))
        decodes = decodes if state.decode else 0
        return encodes + len(self._steps) + decodes

    @staticmethod
    def _pieces(state: DiffusionState) -> list[tuple[int, int]]:
        """The decodes left (``decode_pieces``: the clip's first latent frame alone)."""
        return decode_pieces(state.decoded_latents, state.latent_frames, state.decode_chunk)

    def _plan(
        self,
        state: DiffusionState,
        kind: PlanKind,
        op: StepOp,
        args: object,
        shape_sig: str,
        *,
        flops: float = 0.0,
    ) -> WorkPlan:
        progress = EmitSpec(
            Stream.PROGRESS, ProgressMeta(done=state.step + 1, total=self.plans_total(state))
        )
        if state.adapters:  # the job's LoRA adapters active while its plans run
            op = self._m.adapters.bind(op, state.adapters)
        return WorkPlan(
            loop_id=state.loop_id,
            kind=kind,
            op=op,
            args=args,
            shape_sig=shape_sig,
            instance_id=self._m.instance_id,
            precision=self._m.precision,
            flops=flops,
            emits=(progress,),
        )

    def _flops(self, state: DiffusionState) -> float:
        tokens = state.latent_frames * self._m.tokens_per_frame(state.latent_h, state.latent_w)
        return dit_flops(self._m.dit_config, tokens, tokens, self._m.text_len)
