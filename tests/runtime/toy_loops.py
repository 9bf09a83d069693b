"""A small real torch denoiser loop for runtime tests (the interleave gate, driver snapshots).

``ToyDenoiser``: one attention block + MLP over ``[B, T, C]`` tokens with a sinusoidal time
embedding, random weights from a seeded generator. ``EulerStepOp`` runs one Euler step with
stochastic churn: each item draws its noise from its own generator state, carried in the
loop state (``rng_state``), so a loop's trajectory depends only on its own state.
``ToyDenoiseLoop`` drives ``num_steps`` such steps and emits a progress item per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from runtime.contract import (
    Done,
    EmitSpec,
    InputEvent,
    LoopContext,
    LoopResult,
    LoopState,
    PlanKind,
    StepResult,
    WorkPlan,
)

TOKENS = 8
CHANNELS = 16
HIDDEN = 32


class ToyDenoiser(nn.Module):
    def __init__(
        self, seed: int = 0, tokens: int = TOKENS, channels: int = CHANNELS, hidden: int = HIDDEN
    ):
        super().__init__()
        self.tokens, self.channels = tokens, channels
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.fc = nn.Linear(channels, hidden)
        self.out = nn.Linear(hidden, channels)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[-1]))

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        # t: [B] -> [B, C]
        half = self.channels // 2
        steps = torch.arange(half, dtype=torch.float32, device=t.device)
        freqs = torch.exp(-math.log(1000.0) * steps / half)
        angles = t[:, None] * freqs[None, :] * 1000.0
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # x: [B, T, C], t: [B] -> velocity [B, T, C]
        h = x + self.time_embedding(t)[:, None, :]
        q, k, v = self.qkv(h).chunk(3, dim=-1)  # each [B, T, C]
        attn = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]  # [B, T, C]
        h = h + self.proj(attn)
        return self.out(F.gelu(self.fc(h)))


@dataclass(frozen=True)
class EulerArgs:
    x: torch.Tensor  # [T, C]
    t: float
    t_next: float
    rng_state: torch.Tensor  # torch.Generator state (uint8)
    churn: float
    scale: float = 1.0
    poison: str | None = None  # "raise" | "nan": make this item fail (isolation tests)


@dataclass(frozen=True)
class EulerOut:
    x: torch.Tensor  # [T, C]
    rng_state: torch.Tensor


class EulerStepOp:
    """One stochastic Euler step for a batch of independent items.

    Batched mode stacks the items into one forward (outputs agree with solo runs within
    float32 rounding); ``deterministic=True`` runs each item alone (bit-identical to solo).
    """

    name = "toy_euler"
    batchable = True

    def __init__(self, model: ToyDenoiser) -> None:
        self.model = model
        self.calls: list[
            int
        ] = []  # batch size of every call (test spy; model-wide, not per request)

    def __call__(self, args: Sequence[EulerArgs], *, deterministic: bool = False) -> list[EulerOut]:
        if deterministic and len(args) > 1:
            return [self._run([a])[0] for a in args]
        return self._run(list(args))

    def _run(self, args: list[EulerArgs]) -> list[EulerOut]:
        self.calls.append(len(args))
        if any(a.poison == "raise" for a in args):
            raise RuntimeError("poisoned step")
        device = next(self.model.parameters()).device
        with torch.no_grad():
            x = torch.stack([a.x for a in args])  # [B, T, C]
            t = torch.tensor([a.t for a in args], dtype=torch.float32, device=device)  # [B]
            dt = _column([a.t_next - a.t for a in args], device)  # [B, 1, 1]
            scale = _column([a.scale for a in args], device)
            velocity = self.model(x, t) * scale  # [B, T, C]
            gens = [torch.Generator().set_state(a.rng_state) for a in args]
            # CPU generators (their state lives in the loop state), noise moved to the device
            noise = torch.stack(
                [torch.randn(a.x.shape, generator=g) for a, g in zip(args, gens, strict=True)]
            ).to(device)
            churn = _column([a.churn for a in args], device)
            x_next = x + dt * velocity + churn * dt.abs().sqrt() * noise  # [B, T, C]
            outs = []
            for i, (a, g) in enumerate(zip(args, gens, strict=True)):
                xi = x_next[i].clone()
                if a.poison == "nan":
                    xi[0, 0] = float("nan")
                outs.append(EulerOut(xi, g.get_state()))
            return outs


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    # -> [B, 1, 1] float32 on ``device``
    return torch.tensor(values, dtype=torch.float32, device=device)[:, None, None]


@dataclass
class ToyModel:
    """A resident instance as a loop sees it (``ModelState``)."""

    denoiser: ToyDenoiser
    instance_id: str = "toy"
    device: Any = "cpu"
    dtype: Any = torch.float32
    op: EulerStepOp = field(init=False)

    def __post_init__(self) -> None:
        self.denoiser.to(self.device)
        self.op = EulerStepOp(self.denoiser)

    @property
    def components(self) -> dict[str, Any]:
        return {"denoiser": self.denoiser}


@dataclass(frozen=True)
class ToyRequest:
    seed: int
    num_steps: int = 6
    churn: float = 0.5
    dt_media_s: float = 0.04
    poison_step: int | None = None
    poison: str | None = None


class ToyState(LoopState, kw_only=True):
    x: torch.Tensor  # [T, C]
    rng_state: torch.Tensor
    sigmas: list[float]
    churn: float
    dt_media_s: float
    scale: float = 1.0
    applied_seqs: list[int] = []
    poison_step: int | None = None
    poison: str | None = None
    x_init: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = {}


class ToyDenoiseLoop:
    """``num_steps`` Euler steps from seeded noise; inputs ``"scale"`` change the velocity scale."""

    name = "toy_denoise"
    state_type = ToyState

    def __init__(self, model: ToyModel) -> None:
        self.model = model

    def init(self, request: ToyRequest, model: ToyModel, ctx: LoopContext) -> ToyState:
        gen = torch.Generator().manual_seed(request.seed)
        x = torch.randn(model.denoiser.tokens, model.denoiser.channels, generator=gen)
        x = x.to(model.device)
        sigmas = torch.linspace(1.0, 0.0, request.num_steps + 1).tolist()
        return ToyState(
            x=x,
            rng_state=gen.get_state(),
            sigmas=sigmas,
            churn=request.churn,
            dt_media_s=request.dt_media_s,
            poison_step=request.poison_step,
            poison=request.poison,
            x_init=x.clone(),
            extras={"seed": torch.tensor([request.seed])},
        )

    def absorb(self, state: ToyState, inputs: Sequence[InputEvent]) -> ToyState:
        scale, seqs = state.scale, list(state.applied_seqs)
        for event in inputs:
            if event.kind != "scale":
                raise ValueError(f"toy_denoise accepts 'scale' inputs, not {event.kind!r}")
            scale = float(event.payload)
            seqs.append(event.seq)
        return msgspec.structs.replace(state, scale=scale, applied_seqs=seqs)

    def next(self, state: ToyState) -> WorkPlan | Done:
        if state.step >= len(state.sigmas) - 1:
            return Done()
        k = state.step
        poison = state.poison if state.poison_step == k else None
        return WorkPlan(
            loop_id="toy",
            kind=PlanKind.DIFFUSION_STEP,
            op=self.model.op,
            args=EulerArgs(
                state.x,
                state.sigmas[k],
                state.sigmas[k + 1],
                state.rng_state,
                state.churn,
                state.scale,
                poison,
            ),
            shape_sig=f"{tuple(state.x.shape)}",
            instance_id=self.model.instance_id,
            flops=2.0 * state.x.numel() * 4 * CHANNELS,
            due_media_s=k * state.dt_media_s,
            emits=(EmitSpec("progress", {"step": k}),),
        )

    def advance(self, state: ToyState, result: StepResult) -> ToyState:
        out: EulerOut = result.output
        return msgspec.structs.replace(state, x=out.x, rng_state=out.rng_state, step=state.step + 1)

    def finalize(self, state: ToyState) -> LoopResult:
        return LoopResult(
            outputs={"x": state.x, "steps": state.step, "applied_seqs": list(state.applied_seqs)}
        )
