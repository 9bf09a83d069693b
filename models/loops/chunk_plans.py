"""``ChunkPlans``: the WorkPlans of ``chunk_rollout``, described from its state (no kernels run).

One method per plan kind the loop asks for (``text_encode``, ``recache``, ``denoise``,
``decode``, ``kv_update``); each reads the state and returns a ``WorkPlan`` whose arguments are
views of the state's tensors (the ops write the caches in place). Costs (``flops``), deadlines
(``due_media_s`` and ``followups``: the plans still to come before the plan's media is due) and
emissions (media parts with their PTS, the ``applied`` acks of the inputs a chunk reflects, job
progress) are decided here too, so the loop module keeps only the contract and the inputs.

The loop owns two decisions the plans depend on and hands them in as callables: which part of a
chunk the next decode covers (``decode_part``) and whether this denoising step caches the
chunk's K/V (``writes_kv``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from models.loops.model import LoopModel
from models.loops.ops import ChunkDenoiseArgs, DecodeArgs, KVWriteArgs
from models.loops.sampling import SigmaStep, noise_seed
from models.wan.kv_cache import EMPTY
from models.wan.transformer import CrossKV, dit_flops
from runtime.contract import (
    AppliedMeta,
    EmitSpec,
    Followup,
    MediaMeta,
    PlanKind,
    ProgressMeta,
    Stream,
    WorkPlan,
    pts_of_frame,
)

if TYPE_CHECKING:
    from models.loops.chunk_rollout import ChunkRolloutState

__all__ = ["ChunkPlans"]


class ChunkPlans:
    """Plans of one ``chunk_rollout`` (see module docstring)."""

    def __init__(
        self,
        model: LoopModel,
        steps: Sequence[SigmaStep],
        *,
        decode_part: Callable[[ChunkRolloutState], tuple[int, int]],
        writes_kv: Callable[[ChunkRolloutState], bool],
    ) -> None:
        self._m = model
        self._steps = steps
        self._decode_part = decode_part
        self._writes_kv = writes_kv

    def text_encode(self, state: ChunkRolloutState) -> WorkPlan:
        m = self._m
        return self._plan(
            state, PlanKind.TEXT_ENCODE, m.text_encode_op, state.prompt, f"text:{m.text_len}"
        )

    def kv_update(self, state: ChunkRolloutState) -> WorkPlan:
        args = KVWriteArgs(
            groups=((state.frame_start, state.latents),),
            cross=self.cross(state),
            cache=state.kv,
            reset=False,
            window=state.window_latents,
            action=state.chunk_action,
            audio=state.chunk_audio,
        )
        return self._plan(
            state,
            PlanKind.KV_UPDATE,
            self._m.kv_write_op,
            args,
            self.shape(state),
            flops=self.flops(state),
        )

    def denoise(self, state: ChunkRolloutState) -> WorkPlan:
        step = self._steps[state.denoise_step]
        x = state.latents
        if x is None:  # first step of the chunk: pure noise at sigma = 1
            x = torch.empty(
                (1, self._m.latent.channels, state.chunk_frames, state.latent_h, state.latent_w),
                device=self._m.device,
                dtype=self._m.dtype,
            )
        args = ChunkDenoiseArgs(
            x=x,
            timestep=step.timestep,
            sigma=step.sigma,
            sigma_next=step.sigma_next,
            noise_seed=noise_seed(state.seed, state.segment, state.chunk, state.denoise_step),
            init_seed=(
                noise_seed(state.seed, state.segment, state.chunk, -1)
                if state.latents is None
                else None
            ),
            cross=self.cross(state),
            cache=state.kv,
            frame_start=state.frame_start,
            action=state.chunk_action,
            audio=state.chunk_audio,
            window=state.window_latents if self._writes_kv(state) else None,
        )
        return self._plan(
            state,
            PlanKind.CHUNK_STEP,
            self._m.chunk_step_op,
            args,
            self.shape(state),
            flops=self.flops(state),
        )

    def recache(self, state: ChunkRolloutState) -> WorkPlan:
        # Cached frames in position order, grouped by the chunk they were generated in.
        slots = sorted((p, i) for i, p in enumerate(state.kv.slot_positions) if p != EMPTY)
        groups: list[tuple[int, list[int]]] = []
        for position, slot in slots:
            if (
                groups
                and position // state.chunk_frames == groups[-1][0] // state.chunk_frames
                and position == groups[-1][0] + len(groups[-1][1])
            ):
                groups[-1][1].append(slot)
            else:
                groups.append((position, [slot]))
        window = state.window_latents
        args = KVWriteArgs(
            groups=tuple((start, window[:, :, idx].clone()) for start, idx in groups),
            cross=self.cross(state),
            cache=state.kv,
            reset=True,
            window=window,
        )
        return self._plan(
            state,
            PlanKind.KV_RECACHE,
            self._m.kv_write_op,
            args,
            f"recache:{len(slots)}:{self.shape(state)}",
            flops=self.flops(state) * max(1, len(groups)),
        )

    def decode(self, state: ChunkRolloutState) -> WorkPlan:
        first = state.frames_emitted == 0
        latent, n = self._decode_part(state)
        final = state.decoded + latent == state.chunk_frames
        pts = pts_of_frame(state.frames_emitted, state.fps)
        emits = [
            EmitSpec(
                Stream.MEDIA,
                MediaMeta(
                    chunk=state.chunk,
                    segment=state.segment,
                    frame_start=state.frames_emitted,
                    pts_90k=pts,
                    num_frames=n,
                    fps=state.fps,
                    final=final,
                ),
            )
        ]
        if not state.decoded:  # the chunk's first frames reflect its inputs
            emits += [
                EmitSpec(
                    Stream.APPLIED,
                    AppliedMeta(
                        kind=kind, seq=seq, chunk=state.chunk, pts_90k=pts, changes=changes
                    ),
                )
                for kind, seq, changes in state.acks
            ]
        latents = state.latents[:, :, state.decoded : state.decoded + latent]
        args = DecodeArgs(latents=latents, cache=state.decoder, defer=not state.collect_frames)
        return self._plan(
            state,
            PlanKind.VAE_DECODE,
            self._m.decode_op,
            args,
            f"decode:{int(first)}:{latent}:{self.shape(state)}",
            emits=tuple(emits),
        )

    # ---------------------------------------------------------------------------------------

    def _plan(
        self,
        state: ChunkRolloutState,
        kind: PlanKind,
        op: Any,
        args: Any,
        shape_sig: str,
        *,
        flops: float = 0.0,
        emits: tuple[EmitSpec, ...] = (),
    ) -> WorkPlan:
        if state.collect_frames and state.max_chunks:
            # text encode + per chunk: steps, decode, KV update (none after the last chunk)
            total = state.max_chunks * (len(self._steps) + 2)
            emits = (
                *emits,
                EmitSpec(Stream.PROGRESS, ProgressMeta(done=state.plans_done + 1, total=total)),
            )
        return WorkPlan(
            loop_id=state.loop_id,
            kind=kind,
            op=op,
            args=args,
            shape_sig=shape_sig,
            instance_id=self._m.instance_id,
            precision=self._m.precision,
            flops=flops,
            due_media_s=state.frames_emitted / state.fps,
            followups=self._followups(state, kind),
            emits=emits,
            # the inputs a viewer waits to see: the runtime times them and runs them at once
            inputs=tuple(seq for _, seq, changes in state.acks if changes),
            waiting_inputs=tuple(seq for _, seq, changes in state.next_acks if changes),
        )

    def _followups(self, state: ChunkRolloutState, kind: PlanKind) -> tuple[Followup, ...]:
        """Plans still to come before this plan's media is due: the chunk's remaining steps
        and the decode that emits next; after a KV update, the whole next chunk's."""
        shape, flops = self.shape(state), self.flops(state)
        if kind is PlanKind.VAE_DECODE:
            return ()
        if kind is PlanKind.KV_UPDATE:
            steps_left, latent, first = len(self._steps), state.chunk_frames, 0
        else:
            steps_left = len(self._steps) - state.denoise_step - (kind is PlanKind.CHUNK_STEP)
            latent, first = self._decode_part(state)[0], int(state.frames_emitted == 0)
        steps = tuple(Followup(PlanKind.CHUNK_STEP, shape, flops) for _ in range(steps_left))
        return (*steps, Followup(PlanKind.VAE_DECODE, f"decode:{first}:{latent}:{shape}"))

    # ---------------------------------------------------------------------------------------
    # views of the state's tensors

    @staticmethod
    def cross(state: ChunkRolloutState) -> CrossKV:
        if state.cross_k is None or state.cross_v is None:
            raise RuntimeError(f"loop {state.loop_id}: no prompt encoded before denoising")
        return CrossKV(state.cross_k, state.cross_v)

    @staticmethod
    def shape(state: ChunkRolloutState) -> str:
        return f"c{state.chunk_frames}x{state.latent_h}x{state.latent_w}"

    def flops(self, state: ChunkRolloutState) -> float:
        t = self._m.tokens_per_frame(state.latent_h, state.latent_w)
        q = state.chunk_frames * t
        return dit_flops(self._m.dit_config, q, state.kv.capacity_frames * t + q, self._m.text_len)
