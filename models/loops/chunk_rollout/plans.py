"""The work plans of ``chunk_rollout``: for each phase of a chunk, the plan the loop returns.

``ChunkPlanner`` builds every ``WorkPlan`` of one chunk-causal stream from its state (the loop
decides *which* plan comes next; this module says what it runs, on which arguments, at what
predicted cost, what it emits and what must still follow it before its media is due):

    text_encode   the prompt's cross-attention K/V
    kv_recache    the cached frames re-written under a switched prompt, grouped by chunk
    chunk_step    one denoising step of the chunk (the first one draws the chunk's noise)
    vae_decode    the chunk's next part, emitting its media (PTS from ``pts_of_frame``) and, on
                  its first part, the ``applied`` acks of the inputs it reflects
    kv_update     the clean chunk's K/V written into the session's slab

Jobs (``collect_frames``) also emit ``progress`` on every plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.loops.chunk_rollout.capture import chunk_capture
from models.loops.chunk_rollout.state import ChunkRolloutState
from models.loops.model import LoopModel
from models.loops.ops import ChunkDenoiseArgs, DecodeArgs, KVWriteArgs
from models.loops.sampling import SigmaStep, noise_seed
from models.wan.dit.flops import dit_flops
from models.wan.dit.transformer import CrossKV
from models.wan.kv.cache import EMPTY
from runtime.contract import (
    AppliedMeta,
    EmitSpec,
    Followup,
    MediaMeta,
    PlanKind,
    ProgressMeta,
    StepOp,
    Stream,
    WorkPlan,
    pts_of_frame,
)

__all__ = ["ChunkPlanner"]


def chunk_shape_sig(chunk_frames: int, latent_h: int, latent_w: int) -> str:
    """Shape signature of a chunk's DiT plans (steps, KV update): ``c{frames}x{h}x{w}``."""
    return f"c{chunk_frames}x{latent_h}x{latent_w}"


def decode_shape_sig(first: bool, latent_frames: int, chunk_sig: str, decoder: str = "") -> str:
    """Shape signature of a decode of ``latent_frames`` (``first``: a stream's first part);
    ``decoder``: a decoder other than the model's default (``":tiny"`` / ``":full"`` appended:
    its cost is another's)."""
    return f"decode:{int(first)}:{latent_frames}:{chunk_sig}" + (f":{decoder}" if decoder else "")


def steady_chunk_plans(
    chunk_frames: int, latent_h: int, latent_w: int, *, steps: int, fold: bool, decoder: str = ""
) -> tuple[tuple[PlanKind, str, int], ...]:
    """(kind, shape signature, count) of the plans of one steady-state chunk of a stream: the
    denoising steps, the KV update (none when the last step writes the cache) and one decode
    of the whole chunk (``decoder``: as in ``decode_shape_sig``). Admission prices a
    session's compute share from these."""
    sig = chunk_shape_sig(chunk_frames, latent_h, latent_w)
    plans = [(PlanKind.CHUNK_STEP, sig, steps)]
    if not fold:
        plans.append((PlanKind.KV_UPDATE, sig, 1))
    plans.append((PlanKind.VAE_DECODE, decode_shape_sig(False, chunk_frames, sig, decoder), 1))
    return tuple(plans)


class ChunkPlanner:
    """Plans of one loop's streams (one planner per loop, the state says whose stream).

    ``steps``: the card schedule's denoising steps; ``fold``: the card's ``kv_update =
    last_step`` (the last step writes the chunk's K/V, no separate KV update);
    ``restart_policy``: the name of the loop's ``RestartPolicy``, a fact of every chunk's capture.
    """

    def __init__(
        self,
        model: LoopModel,
        steps: Sequence[SigmaStep],
        *,
        fold: bool,
        restart_policy: str = "",
    ) -> None:
        self._m = model
        self._steps = tuple(steps)
        self._fold = fold
        self._restart_policy = restart_policy

    def text_encode(self, state: ChunkRolloutState) -> WorkPlan:
        return self._plan(
            state,
            PlanKind.TEXT_ENCODE,
            self._m.text_encode_op,
            state.prompt,
            f"text:{self._m.text_len}",
        )

    def kv_update(self, state: ChunkRolloutState) -> WorkPlan:
        assert state.latents is not None  # a chunk in flight
        args = KVWriteArgs(
            groups=((state.frame_start, state.latents),),
            cross=self._cross(state),
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
            self._shape(state),
            flops=self._flops(state),
        )

    def writes_kv(self, state: ChunkRolloutState) -> bool:
        """Whether this denoising step caches the chunk's K/V (``KVUpdate.LAST_STEP``)."""
        return (
            self._fold and state.denoise_step == len(self._steps) - 1 and not self.last_chunk(state)
        )

    @staticmethod
    def last_chunk(state: ChunkRolloutState) -> bool:
        return state.max_chunks is not None and state.chunk + 1 >= state.max_chunks

    def decode_part(self, state: ChunkRolloutState) -> tuple[int, int]:
        """(latent frames, pixel frames) the next decode plan of the current chunk covers: a
        stream's very first latent frame alone (a session's first frame out soonest; a job's
        too, so its decodes after it run the compiled graphs a session's do:
        ``models.loops.pieces.decode_pieces``), and so a session's first latent frame of a chunk
        that shows a changing input (a switch, a cut, a changed key: its first picture goes out
        one part's decode sooner, time to steer), else the rest of the chunk."""
        first = state.frames_emitted == 0
        latent = state.chunk_frames - state.decoded
        steered = state.decoded == 0 and any(changes for _, _, changes in state.acks)
        if first or (steered and not state.collect_frames):
            latent = 1
        return latent, self._m.latent.pixel_frames(latent, includes_first=first)

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
            cross=self._cross(state),
            cache=state.kv,
            frame_start=state.frame_start,
            action=state.chunk_action,
            audio=state.chunk_audio,
            window=state.window_latents if self.writes_kv(state) else None,
        )
        return self._plan(
            state,
            PlanKind.CHUNK_STEP,
            self._m.chunk_step_op,
            args,
            self._shape(state),
            flops=self._flops(state),
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
            cross=self._cross(state),
            cache=state.kv,
            reset=True,
            window=window,
        )
        return self._plan(
            state,
            PlanKind.KV_RECACHE,
            self._m.kv_write_op,
            args,
            f"recache:{len(slots)}:{self._shape(state)}",
            flops=self._flops(state) * max(1, len(groups)),
        )

    def decode(self, state: ChunkRolloutState) -> WorkPlan:
        first = state.frames_emitted == 0
        latent, n = self.decode_part(state)
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
                    capture=self._capture(state) if final else None,
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
        assert state.latents is not None  # a chunk in flight
        latents = state.latents[:, :, state.decoded : state.decoded + latent]
        args = DecodeArgs(latents=latents, cache=state.decoder, defer=not state.collect_frames)
        return self._plan(
            state,
            PlanKind.VAE_DECODE,
            self._decode_op(state),
            args,
            decode_shape_sig(first, latent, self._shape(state), self._decoder_sig(state)),
            emits=tuple(emits),
        )

    def _decode_op(self, state: ChunkRolloutState) -> StepOp:
        """The op of the stream's decoder (the model's default one for a state without)."""
        if not state.codec:
            return self._m.decode_op
        return self._m.decode_op_for(state.codec)

    def _decoder_sig(self, state: ChunkRolloutState) -> str:
        """The stream's decoder where it is not the model's default (``decode_shape_sig``)."""
        return state.codec if state.codec and state.codec != self._m.default_decoder else ""

    def _plan(
        self,
        state: ChunkRolloutState,
        kind: PlanKind,
        op: StepOp,
        args: object,
        shape_sig: str,
        *,
        flops: float = 0.0,
        emits: tuple[EmitSpec, ...] = (),
    ) -> WorkPlan:
        if state.collect_frames and state.max_chunks:
            # text encode + per chunk: steps, decode, KV update (none after the last chunk);
            # the first chunk decodes in two parts (``decode_part``) when it has two frames
            total = state.max_chunks * (len(self._steps) + 2) + int(state.chunk_frames > 1)
            emits = (
                *emits,
                EmitSpec(Stream.PROGRESS, ProgressMeta(done=state.plans_done + 1, total=total)),
            )
        if not state.decode and self._ends_chunk(state, kind):
            emits = (*emits, self._chunk_end(state))
        if state.adapters:  # the session's LoRA adapters active while its plans run
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
            due_media_s=state.frames_emitted / state.fps,
            followups=self._followups(state, kind),
            emits=emits,
            # the inputs a viewer waits to see: the runtime times them and runs them at once
            inputs=tuple(seq for _, seq, changes in state.acks if changes),
            waiting_inputs=tuple(seq for _, seq, changes in state.next_acks if changes),
        )

    def _ends_chunk(self, state: ChunkRolloutState, kind: PlanKind) -> bool:
        """Whether a plan of ``kind`` finishes the chunk of a stream that does not decode:
        its KV update, or its last step where no KV update follows."""
        if kind is PlanKind.KV_UPDATE:
            return True
        last_step = kind is PlanKind.CHUNK_STEP and state.denoise_step + 1 == len(self._steps)
        return last_step and (self._fold or self.last_chunk(state))

    @staticmethod
    def _chunk_end(state: ChunkRolloutState) -> EmitSpec:
        """The mark of a chunk's end on a stream that does not decode: final media of no frames
        (the runtime's chunk boundary, where a weight sync holds the loop and a moment is
        taken; its frames come from a program's decoders)."""
        meta = MediaMeta(
            chunk=state.chunk,
            segment=state.segment,
            frame_start=state.frames_emitted,
            pts_90k=pts_of_frame(state.frames_emitted, state.fps),
            num_frames=0,
            fps=state.fps,
        )
        return EmitSpec(Stream.MEDIA, meta)

    def _followups(self, state: ChunkRolloutState, kind: PlanKind) -> tuple[Followup, ...]:
        """Plans still to come before this plan's media is due: the chunk's remaining steps
        and the decode that emits next; after a KV update, the whole next chunk's."""
        shape, flops = self._shape(state), self._flops(state)
        if kind is PlanKind.VAE_DECODE:
            return ()
        if kind is PlanKind.KV_UPDATE:
            steps_left, latent, first = len(self._steps), state.chunk_frames, 0
        else:
            steps_left = len(self._steps) - state.denoise_step - (kind is PlanKind.CHUNK_STEP)
            latent, first = self.decode_part(state)[0], int(state.frames_emitted == 0)
        steps = tuple(Followup(PlanKind.CHUNK_STEP, shape, flops) for _ in range(steps_left))
        decode = decode_shape_sig(bool(first), latent, shape, self._decoder_sig(state))
        return (*steps, Followup(PlanKind.VAE_DECODE, decode))

    def _capture(self, state: ChunkRolloutState) -> dict[str, object]:
        facts = chunk_capture(state, self._steps, self._m.precision)
        if state.adapters:  # name@content-version:strength of each LoRA adapter it ran with
            facts["adapters"] = self._m.adapters.versions(state.adapters)
        if state.keep_latents:  # the tensors themselves (no device read here)
            facts["step_latents"] = list(state.step_latents)
        if state.codec:  # the decoder that turned its latents into frames
            facts["decoder"] = state.codec
        facts["step_batch"] = state.step_batch
        return {**facts, "restart_policy": self._restart_policy}

    # views of the state's tensors

    @staticmethod
    def _cross(state: ChunkRolloutState) -> CrossKV:
        if state.cross_k is None or state.cross_v is None:
            raise RuntimeError(f"loop {state.loop_id}: no prompt encoded before denoising")
        return CrossKV(state.cross_k, state.cross_v)

    def step_work(self, state: ChunkRolloutState) -> tuple[str, float]:
        """(shape signature, FLOPs) of one denoising step or KV update of ``state``'s chunk."""
        return self._shape(state), self._flops(state)

    def decode_sig(self, state: ChunkRolloutState, first: bool, latent: int = 0) -> str:
        """The shape signature of a decode of ``latent`` frames (0: the whole chunk) of
        ``state``'s stream."""
        frames = latent or state.chunk_frames
        return decode_shape_sig(first, frames, self._shape(state), self._decoder_sig(state))

    def _shape(self, state: ChunkRolloutState) -> str:
        return chunk_shape_sig(state.chunk_frames, state.latent_h, state.latent_w)

    def _flops(self, state: ChunkRolloutState) -> float:
        t = self._m.tokens_per_frame(state.latent_h, state.latent_w)
        q = state.chunk_frames * t
        return dit_flops(self._m.dit_config, q, state.kv.capacity_frames * t + q, self._m.text_len)
