"""``chunk_rollout``: chunk-causal, KV-cached generation of an unbounded stream (sessions).

Per chunk (``c`` latent frames) the loop plans, in order::

    text_encode   only when the prompt changed (cross-attention K/V of the new prompt)
    kv_recache    only after a prompt *switch*: the cached frames' K/V recomputed under the new
                  prompt (LongLive), so the stream continues smoothly in the new direction
    chunk_step    x steps of the card's schedule: predict x0, re-noise with fresh noise
    vae_decode    the chunk through the causal VAE decoder (per-session feature cache) -> frames,
                  emitted on "media" with their PTS, plus the "applied" acks of inputs it reflects
    kv_update     the clean chunk at t=0 through the DiT, its K/V written into the rolling cache
                  (skipped after the last chunk of a bounded stream: nothing will read it; and
                  for a card with ``kv_update = last_step``, whose last chunk_step writes it)

Decoding before the KV update puts frames out one DiT forward earlier (first frame and every
chunk); nothing else changes, since both read only the chunk's final latents. A session's first
chunk decodes in two parts, its first latent frame (one picture: the stream's first frame out
as soon as possible) and then the rest; the causal decoder makes the parts equal to one decode
(up to float rounding).
Media emissions carry ``final`` (False on a part that leaves frames of the chunk to come).

Live inputs (``absorb``) are latched for the *next* chunk when the current one ends (after its
KV update): a prompt switch, the latest action (none -> no-op), the audio that arrived. A *cut*
abandons the in-flight chunk at the next step boundary (unless its frames are already decoded)
and restarts it under the new prompt as a new segment, continuing from the session's chunk-KV
without a re-cache.

Every tensor of a session lives in ``ChunkRolloutState`` (latents, cross K/V, the clean latents
of the cached frames for re-caching) and its two caches are members of it: the chunk-KV cache
(a view of the session's slab of the model's preallocated K/V buffer; ``SessionRequest.kv_slab``)
and the VAE decoder cache. Ops write both in place and a snapshot serializes them with the rest,
so a state can be snapshotted at any step boundary and resumed in another process. ``advance``
dispatches on the kind of plan that ran (``StepResult.kind``). Noise is a pure function of
(seed, segment, chunk, step), so interleaving and resuming never change a frame.

Behaviour capture: a chunk's final media emission carries ``MediaMeta.capture``, the facts the
loop used for it as it described the decode (seed and the noise seeds drawn, timesteps and
sigmas, the prompt and the digest of its embedding, digests of the latched action vector and
audio features, segment, latent position, K/V window, precision): recorded at generation time,
never reconstructed. ``fork`` continues a state as a new stream (fork candidates).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import torch

from models.card import KVUpdate, LoopSpec
from models.loops.digests import host_digest
from models.loops.inputs import AUDIO_SAMPLE_RATE, action_vector, audio_features
from models.loops.model import LoopModel
from models.loops.ops import ChunkDenoiseArgs, DecodeArgs, KVWriteArgs
from models.loops.requests import JobRequest, SessionRequest
from models.loops.rollout_capture import chunk_capture
from models.loops.rollout_fork import fork_state
from models.loops.sampling import noise_seed, sigma_steps
from models.wan.kv_cache import EMPTY, ChunkKVCache
from models.wan.transformer import CrossKV, dit_flops
from models.wan.vae_cache import DecoderCache
from runtime.contract import (
    ActionInput,
    AppliedMeta,
    AudioInput,
    Done,
    EmitSpec,
    Followup,
    InputEvent,
    InputKind,
    LoopContext,
    LoopResult,
    LoopState,
    MediaMeta,
    PlanKind,
    ProgressMeta,
    PromptInput,
    PromptMode,
    StepResult,
    Stream,
    WorkPlan,
    pts_of_frame,
)

__all__ = ["ChunkRollout", "ChunkRolloutState", "Phase"]

# Audio kept waiting for the next chunks at most this long; older samples are dropped.
MAX_AUDIO_BACKLOG_S = 2.0


class Phase(str, enum.Enum):
    START = "start"  # chunk boundary: text encode / re-cache if needed, then denoise
    DENOISE = "denoise"
    KV_UPDATE = "kv_update"
    DECODE = "decode"


class ChunkRolloutState(LoopState, kw_only=True):
    """All of one stream's state (see module docstring). Shapes: C latent channels, c latent
    frames per chunk, (h, w) latent grid, S sink + W ring frames in the K/V cache."""

    loop_id: str
    seed: int
    fps: int
    width: int
    height: int
    chunk_frames: int
    latent_h: int
    latent_w: int
    max_chunks: int | None = None
    collect_frames: bool = False
    target_frames: int | None = None  # jobs: frames to return (the last chunk may overshoot)
    # progress
    phase: Phase = Phase.START
    chunk: int = 0
    segment: int = 0
    denoise_step: int = 0
    frame_start: int = 0  # absolute latent frame index (RoPE position) of the current chunk
    frames_emitted: int = 0
    decoded: int = 0  # latent frames of the current chunk decoded so far
    plans_done: int = 0
    # prompt memory
    prompt: str
    active_prompt: str | None = None  # the prompt whose cross K/V is held
    recache_needed: bool = False
    next_prompt: str | None = None  # a switch waiting for the next chunk boundary
    next_prompt_is_cut: bool = False
    # inputs latched for the current chunk, and those waiting for the next one
    acks: list[tuple[InputKind, int]] = []  # (kind, seq) reflected by the current chunk
    next_acks: list[tuple[InputKind, int]] = []
    chunk_action: torch.Tensor | None = None  # [1, ACTION_DIM]
    next_action: torch.Tensor | None = None
    chunk_audio: torch.Tensor | None = None  # [1, c, AUDIO_DIM]
    audio_pending: torch.Tensor  # [n] float32, 16 kHz mono
    # digests of the conditioning, for behaviour records (computed on the host copies)
    prompt_digest: str = ""  # of the active prompt's text-encoder embedding
    chunk_action_digest: str = ""
    next_action_digest: str = ""
    chunk_audio_digest: str = ""
    # tensors
    latents: torch.Tensor | None = None  # [1, C, c, h, w] current chunk
    cross_k: torch.Tensor | None = None  # [layers, 1, L, heads, head_dim]
    cross_v: torch.Tensor | None = None
    kv: ChunkKVCache  # the session's chunk-KV (a slab view), written in place by the ops
    window_latents: torch.Tensor  # [1, C, S + W, h, w] clean latents of the cached frames
    decoder: DecoderCache  # the session's VAE decoder cache, advanced in place by decodes
    frames: list[torch.Tensor] = []  # collected uint8 [n, H, W, 3] chunks (jobs only)


class ChunkRollout:
    """The session loop of a chunk-causal card (see module docstring)."""

    name = "chunk_rollout"

    def __init__(self, model: LoopModel, spec: LoopSpec) -> None:
        self._m = model
        if spec.schedule is None:
            raise ValueError(f"card {model.card.model_id!r}: {spec.loop_id} has no schedule")
        self._steps = sigma_steps(
            spec.schedule.timesteps, spec.schedule.flow_shift, spec.schedule.num_train_timesteps
        )
        self._inputs = spec.inputs
        self._fold = spec.kv_update is KVUpdate.LAST_STEP

    # ---------------------------------------------------------------------------------------
    # contract

    def init(
        self, request: SessionRequest | JobRequest, model: Any, ctx: LoopContext | None = None
    ) -> ChunkRolloutState:
        m = self._m
        if isinstance(request, JobRequest):
            profile = m.card.resolve_profile(width=request.width, height=request.height)
            frames = 1 if request.task == "t2i" else (request.num_frames or profile.fps * 2)
            max_chunks = self._chunks_for(frames, profile.chunk_latent_frames)
            collect, seed, target = True, request.seed, frames
        else:
            profile = m.card.resolve_profile(
                fps=request.fps, width=request.width, height=request.height
            )
            max_chunks, collect, seed, target = request.max_chunks, False, request.seed, None
        slab = None if isinstance(request, JobRequest) else request.kv_slab
        c = profile.chunk_latent_frames
        lh, lw = profile.height // m.latent.spatial_stride, profile.width // m.latent.spatial_stride
        cache = m.kv_cache(m.slab_geometry(profile), slab)
        window = torch.zeros(
            (1, m.latent.channels, cache.capacity_frames, lh, lw), device=m.device, dtype=m.dtype
        )
        return ChunkRolloutState(
            loop_id=ctx.loop_id if ctx is not None else "loop",
            seed=seed,
            fps=profile.fps,
            width=profile.width,
            height=profile.height,
            chunk_frames=c,
            latent_h=lh,
            latent_w=lw,
            max_chunks=max_chunks,
            collect_frames=collect,
            target_frames=target,
            prompt=request.prompt,
            audio_pending=torch.zeros(0, dtype=torch.float32),
            kv=cache,
            window_latents=window,
            decoder=m.new_decoder_cache(lh, lw),
        )

    def absorb(self, state: ChunkRolloutState, inputs: Sequence[InputEvent]) -> ChunkRolloutState:
        for event in inputs:
            payload = event.payload
            cut = isinstance(payload, PromptInput) and payload.mode is PromptMode.CUT
            # The card lists the cut prompt mode as the input "cut" (its capability prompt.cut).
            needed = "cut" if cut else getattr(event.kind, "value", event.kind)
            if needed not in self._inputs:
                raise ValueError(
                    f"chunk_rollout of {self._m.card.model_id!r} does not accept "
                    f"input {needed!r}; it accepts {sorted(self._inputs)}"
                )
            if isinstance(payload, PromptInput) and cut:
                self._cut(state, payload.text, event.seq)
            elif isinstance(payload, PromptInput):
                state.next_prompt, state.next_prompt_is_cut = payload.text, False
                state.next_acks.append((InputKind.PROMPT, event.seq))
            elif isinstance(payload, ActionInput):
                vec = action_vector(payload.keys, payload.mouse)
                state.next_action_digest = host_digest(vec)
                state.next_action = vec[None].to(self._m.device, self._m.dtype)
                state.next_acks = [a for a in state.next_acks if a[0] is not InputKind.ACTION]
                state.next_acks.append((InputKind.ACTION, event.seq))
            elif isinstance(payload, AudioInput):
                samples = torch.as_tensor(payload.samples, dtype=torch.float32).flatten()
                keep = int(MAX_AUDIO_BACKLOG_S * AUDIO_SAMPLE_RATE)
                state.audio_pending = torch.cat((state.audio_pending, samples))[-keep:]
                state.next_acks.append((InputKind.AUDIO, event.seq))
            else:
                raise ValueError(f"input {event.kind!r} has an unknown payload {type(payload)}")
        return state

    def next(self, state: ChunkRolloutState) -> WorkPlan | Done:
        if state.phase is Phase.START:
            if state.max_chunks is not None and state.chunk >= state.max_chunks:
                return Done()
            if state.active_prompt != state.prompt:
                return self._plan(
                    state,
                    PlanKind.TEXT_ENCODE,
                    self._m.text_encode_op,
                    state.prompt,
                    f"text:{self._m.text_len}",
                )
            if state.recache_needed:
                return self._recache_plan(state)
            return self._denoise_plan(state)
        if state.phase is Phase.DENOISE:
            return self._denoise_plan(state)
        if state.phase is Phase.DECODE:
            return self._decode_plan(state)
        if state.phase is Phase.KV_UPDATE:
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
        raise RuntimeError(f"loop {state.loop_id}: no plan for phase {state.phase}")

    def advance(self, state: ChunkRolloutState, result: StepResult) -> ChunkRolloutState:
        """Fold the result of the plan that ran in; the caches were written in place."""
        state.step += 1
        state.plans_done += 1
        kind = result.kind
        if kind is PlanKind.TEXT_ENCODE:
            cross: CrossKV = result.output
            state.cross_k, state.cross_v = cross.k, cross.v
            state.active_prompt = state.prompt
            state.prompt_digest = cross.digest
        elif kind is PlanKind.KV_RECACHE:
            state.recache_needed = False
        elif kind is PlanKind.CHUNK_STEP:
            state.latents = result.output
            state.denoise_step += 1
            state.phase = Phase.DECODE if state.denoise_step == len(self._steps) else Phase.DENOISE
        elif kind is PlanKind.VAE_DECODE:
            if state.collect_frames:
                state.frames.append(result.output)
            latent, pixel = self._decode_part(state)
            state.frames_emitted += pixel
            state.decoded += latent
            if state.decoded == state.chunk_frames:  # else the chunk's next part follows
                if self._fold or self._last_chunk(state):
                    self._end_chunk(state)
                else:
                    state.phase = Phase.KV_UPDATE
        elif kind is PlanKind.KV_UPDATE:
            self._end_chunk(state)
        else:
            raise RuntimeError(
                f"loop {state.loop_id}: no result expected from a {kind} plan "
                f"in phase {state.phase}"
            )
        return state

    def finalize(self, state: ChunkRolloutState) -> LoopResult:
        outputs: dict[str, Any] = {
            "chunks": state.chunk,
            "frames_emitted": state.frames_emitted,
            "segment": state.segment,
        }
        if state.collect_frames and state.frames:
            outputs["frames"] = torch.cat(state.frames)[: state.target_frames]
        return LoopResult(outputs)

    # ---------------------------------------------------------------------------------------
    # chunk boundary and inputs

    def _writes_kv(self, state: ChunkRolloutState) -> bool:
        """Whether this denoising step caches the chunk's K/V (``KVUpdate.LAST_STEP``)."""
        return (
            self._fold
            and state.denoise_step == len(self._steps) - 1
            and not self._last_chunk(state)
        )

    @staticmethod
    def _last_chunk(state: ChunkRolloutState) -> bool:
        return state.max_chunks is not None and state.chunk + 1 >= state.max_chunks

    def _decode_part(self, state: ChunkRolloutState) -> tuple[int, int]:
        """(latent frames, pixel frames) the next decode plan of the current chunk covers: a
        session's very first latent frame alone, else the rest of the chunk."""
        first = state.frames_emitted == 0
        latent = state.chunk_frames - state.decoded
        if first and not state.collect_frames:
            latent = 1
        return latent, self._m.latent.pixel_frames(latent, includes_first=first)

    def _end_chunk(self, state: ChunkRolloutState) -> None:
        state.chunk += 1
        state.frame_start += state.chunk_frames
        self._start_chunk(state)

    def _start_chunk(self, state: ChunkRolloutState) -> None:
        """Latch the inputs that arrived during the last chunk for the next one."""
        state.phase, state.denoise_step, state.latents = Phase.START, 0, None
        state.decoded = 0
        if state.next_prompt is not None:
            if state.next_prompt_is_cut:
                state.segment += 1
            else:
                state.recache_needed = state.kv.frames_written > 0
            state.prompt, state.next_prompt = state.next_prompt, None
        state.chunk_action, state.next_action = state.next_action, None
        state.chunk_action_digest, state.next_action_digest = state.next_action_digest, ""
        state.chunk_audio_digest = ""
        state.chunk_audio = self._take_audio(state)
        state.acks, state.next_acks = state.next_acks, []

    def _cut(self, state: ChunkRolloutState, text: str, seq: int) -> None:
        """A new segment: abandon the in-flight chunk unless its frames are decoded or its K/V
        cached, even in part (then the cut starts the next chunk)."""
        kv_written = self._fold and state.phase is Phase.DECODE
        if state.phase is Phase.KV_UPDATE or state.decoded or kv_written:
            state.next_prompt, state.next_prompt_is_cut = text, True
            state.next_acks.append((InputKind.PROMPT, seq))
            return
        state.segment += 1
        state.prompt, state.next_prompt, state.recache_needed = text, None, False
        state.phase, state.denoise_step, state.latents = Phase.START, 0, None
        state.acks.append((InputKind.PROMPT, seq))

    def _take_audio(self, state: ChunkRolloutState) -> torch.Tensor | None:
        if state.audio_pending.numel() == 0 or "audio" not in self._inputs:
            return None
        seconds = self._m.latent.pixel_frames(state.chunk_frames, includes_first=False) / state.fps
        need = int(round(seconds * AUDIO_SAMPLE_RATE))
        taken, state.audio_pending = state.audio_pending[:need], state.audio_pending[need:]
        features = audio_features(taken, state.chunk_frames)  # [c, AUDIO_DIM]
        state.chunk_audio_digest = host_digest(features)
        return features[None].to(self._m.device, self._m.dtype)

    def _chunks_for(self, num_frames: int, c: int) -> int:
        first = self._m.latent.pixel_frames(c, includes_first=True)
        later = self._m.latent.pixel_frames(c, includes_first=False)
        return 1 + max(0, math.ceil((num_frames - first) / later))

    # ---------------------------------------------------------------------------------------
    # plans

    def _denoise_plan(self, state: ChunkRolloutState) -> WorkPlan:
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
            window=state.window_latents if self._writes_kv(state) else None,
        )
        return self._plan(
            state,
            PlanKind.CHUNK_STEP,
            self._m.chunk_step_op,
            args,
            self._shape(state),
            flops=self._flops(state),
        )

    def _recache_plan(self, state: ChunkRolloutState) -> WorkPlan:
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

    def _decode_plan(self, state: ChunkRolloutState) -> WorkPlan:
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
                    capture=self._capture(state) if final else None,
                ),
            )
        ]
        if not state.decoded:  # the chunk's first frames reflect its inputs
            emits += [
                EmitSpec(
                    Stream.APPLIED, AppliedMeta(kind=kind, seq=seq, chunk=state.chunk, pts_90k=pts)
                )
                for kind, seq in state.acks
            ]
        latents = state.latents[:, :, state.decoded : state.decoded + latent]
        args = DecodeArgs(latents=latents, cache=state.decoder, defer=not state.collect_frames)
        return self._plan(
            state,
            PlanKind.VAE_DECODE,
            self._m.decode_op,
            args,
            f"decode:{int(first)}:{latent}:{self._shape(state)}",
            emits=tuple(emits),
        )

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
        )

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
            latent, first = self._decode_part(state)[0], int(state.frames_emitted == 0)
        steps = tuple(Followup(PlanKind.CHUNK_STEP, shape, flops) for _ in range(steps_left))
        return (*steps, Followup(PlanKind.VAE_DECODE, f"decode:{first}:{latent}:{shape}"))

    def _capture(self, state: ChunkRolloutState) -> dict[str, Any]:
        return chunk_capture(state, self._steps, self._m.precision)

    def fork(
        self, state: ChunkRolloutState, request: SessionRequest, model: Any = None
    ) -> ChunkRolloutState:
        """A continuation of ``state`` as a new stream (``models.loops.rollout_fork``)."""
        return fork_state(self._m, state, request)

    # ---------------------------------------------------------------------------------------
    # views of the state's tensors

    @staticmethod
    def _cross(state: ChunkRolloutState) -> CrossKV:
        if state.cross_k is None or state.cross_v is None:
            raise RuntimeError(f"loop {state.loop_id}: no prompt encoded before denoising")
        return CrossKV(state.cross_k, state.cross_v)

    def _shape(self, state: ChunkRolloutState) -> str:
        return f"c{state.chunk_frames}x{state.latent_h}x{state.latent_w}"

    def _flops(self, state: ChunkRolloutState) -> float:
        t = self._m.tokens_per_frame(state.latent_h, state.latent_w)
        q = state.chunk_frames * t
        return dit_flops(self._m.dit_config, q, state.kv.capacity_frames * t + q, self._m.text_len)
