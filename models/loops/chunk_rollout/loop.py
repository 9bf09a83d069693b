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
as soon as possible) and then the rest; so does a chunk that shows a changing input (its first
four frames out a part's decode sooner). The causal decoder makes the parts equal to one decode
(up to float rounding).
Media emissions carry ``final`` (False on a part that leaves frames of the chunk to come).

Live inputs (``absorb``) are latched for the *next* chunk when the current one ends (after its
KV update): a prompt switch, the latest action (none -> no-op), the audio that arrived. An
input that changes the picture (a switch, a *cut*, an action whose keys differ from the chunk
in flight) may instead restart the in-flight chunk at this step boundary, when the model's
``RestartPolicy`` says regenerating shows it sooner than finishing (``models.loops.
chunk_rollout.restart``; never once the chunk's frames are decoded or its K/V cached): the chunk
starts again at its position with everything pending latched. A cut starts a new segment,
continuing from the session's chunk-KV without a re-cache; a switch re-caches first. Plans
list the changing inputs their chunk reflects (``WorkPlan.inputs``) so the runtime can time
them and run them at once; ``AppliedMeta.changes`` tells a sink to show them at once.

Every tensor of a session lives in ``ChunkRolloutState`` (latents, cross K/V, the clean latents
of the cached frames for re-caching) and its two caches are members of it: the chunk-KV cache
(a view of the session's slab of the model's preallocated K/V buffer; ``SessionRequest.kv_slab``)
and the VAE decoder cache. Ops write both in place and a snapshot serializes them with the rest,
so a state can be snapshotted at any step boundary and resumed in another process. ``advance``
dispatches on the kind of plan that ran (``StepResult.kind``). Noise is a pure function of
(seed, segment, chunk, step), so interleaving and resuming never change a frame.

Weight syncs: the state names the model's ``weights_version`` its cross K/V were made with;
when the model's differs at a chunk's start (a sync held the loop at the chunk boundary), the
prompt is encoded again and the cached frames re-cached under the new weights before the chunk
is denoised, so every chunk is made by one version, which its capture names.

Behaviour capture: a chunk's final media emission carries ``MediaMeta.capture``, the facts the
loop used for it as it described the decode (seed and the noise seeds drawn, timesteps and
sigmas, the prompt and the digest of its embedding, digests of the latched action vector and
audio features, segment, latent position, K/V window, precision, the restart policy that
decided its inputs' latching): recorded at generation time, never reconstructed (a restarted
chunk's are those of the attempt that was decoded). ``fork`` continues a state as a new stream
(fork candidates; ``models.loops.chunk_rollout.fork``).

This module is the state machine (which plan comes next, how a result and an input move the
state); the plans themselves are built by ``models.loops.chunk_rollout.plans.ChunkPlanner`` and the
state is ``models.loops.chunk_rollout.state.ChunkRolloutState``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from models.card import KVUpdate, LoopSpec
from models.loops.chunk_rollout.fork import fork_state
from models.loops.chunk_rollout.plans import ChunkPlanner
from models.loops.chunk_rollout.restart import ChunkProgress, RestartKind
from models.loops.chunk_rollout.state import ChunkRolloutState, Phase
from models.loops.digests import host_digest
from models.loops.inputs import AUDIO_SAMPLE_RATE, action_vector, audio_features, normalize_keys
from models.loops.model import LoopModel
from models.loops.requests import JobRequest, SessionRequest
from models.loops.sampling import sigma_steps
from models.wan.dit.transformer import CrossKV
from runtime.contract import (
    ActionInput,
    AudioInput,
    Done,
    InputEvent,
    InputKind,
    LoopContext,
    LoopResult,
    PlanKind,
    PromptInput,
    PromptMode,
    StepResult,
    WorkPlan,
)

__all__ = ["ChunkRollout", "ChunkRolloutState", "Phase"]

# Audio kept waiting for the next chunks at most this long; older samples are dropped.
MAX_AUDIO_BACKLOG_S = 2.0


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
        self._restart = model.chunk_restart
        self._plans = ChunkPlanner(
            model, self._steps, fold=self._fold, restart_policy=self._restart.name
        )

    # ---------------------------------------------------------------------------------------
    # contract

    def init(
        self, request: SessionRequest | JobRequest, model: Any, ctx: LoopContext | None = None
    ) -> ChunkRolloutState:
        m = self._m
        max_chunks: int | None  # None: unbounded (a session)
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
        codec = self._codec(request)
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
            decoder=_decoder_cache(m, lh, lw, codec),
            codec=codec,
            adapters=list(request.adapters),
            keep_latents=isinstance(request, JobRequest) and request.keep_latents,
            decode=not isinstance(request, JobRequest) or request.decode,
        )

    def _codec(self, request: SessionRequest | JobRequest) -> str:
        """The decoder option the stream decodes with: a session's ``decoder`` (checked
        against the model's), a job's full VAE where the model has one (an artifact gets the
        best frames the latents give), else the default; "" for a model with one decoder."""
        options = self._m.decoder_options()
        if not options:
            return ""
        if isinstance(request, JobRequest):
            return "full" if "full" in options else self._m.default_decoder
        return self._m.resolve_decoder(request.decoder)

    def absorb(self, state: ChunkRolloutState, inputs: Sequence[InputEvent]) -> ChunkRolloutState:
        restart: RestartKind | None = None
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
            if isinstance(payload, PromptInput):
                state.next_prompt, state.next_prompt_is_cut = payload.text, cut
                state.next_acks.append((InputKind.PROMPT, event.seq, True))
                restart = "cut" if cut or restart == "cut" else "switch"
            elif isinstance(payload, ActionInput):
                vec = action_vector(payload.keys, payload.mouse)  # [ACTION_DIM]
                state.next_action_digest = host_digest(vec)
                # held keys only: mouse motion is continuous, latched per chunk, never a change
                state.next_keys = normalize_keys(payload.keys)
                changes = set(state.next_keys) != set(state.chunk_keys)
                state.next_action = vec[None].to(self._m.device, self._m.dtype)
                state.next_acks = [a for a in state.next_acks if a[0] is not InputKind.ACTION]
                state.next_acks.append((InputKind.ACTION, event.seq, changes))
                restart = restart or ("action" if changes else None)
            elif isinstance(payload, AudioInput):
                samples = torch.as_tensor(payload.samples, dtype=torch.float32).flatten()
                keep = int(MAX_AUDIO_BACKLOG_S * AUDIO_SAMPLE_RATE)
                state.audio_pending = torch.cat((state.audio_pending, samples))[-keep:]
                state.next_acks.append((InputKind.AUDIO, event.seq, False))
            else:
                raise ValueError(f"input {event.kind!r} has an unknown payload {type(payload)}")
        if restart is not None and self._restart.restart(restart, self._progress(state)):
            self._latch(state, boundary=False)
        return state

    def next(self, state: ChunkRolloutState) -> WorkPlan | Done:
        plans = self._plans
        if state.phase is Phase.START:
            if state.max_chunks is not None and state.chunk >= state.max_chunks:
                return Done()
            if state.active_prompt != state.prompt or self._stale(state):
                return plans.text_encode(state)
            if state.recache_needed:
                return plans.recache(state)
            return plans.denoise(state)
        if state.phase is Phase.DENOISE:
            return plans.denoise(state)
        if state.phase is Phase.DECODE:
            return plans.decode(state)
        if state.phase is Phase.KV_UPDATE:
            return plans.kv_update(state)
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
            if self._stale(state):  # new weights: the cached frames' K/V are the old ones'
                state.recache_needed = state.recache_needed or state.kv.frames_written > 0
                state.weights_version = self._version()
        elif kind is PlanKind.KV_RECACHE:
            state.recache_needed = False
        elif kind is PlanKind.CHUNK_STEP:
            state.latents = result.output
            state.step_batch = max(state.step_batch, result.batch_size)
            if state.keep_latents:  # a copy: a captured graph may reuse its output buffer
                state.step_latents.append(result.output.clone())
            state.denoise_step += 1
            state.phase = Phase.DECODE if state.denoise_step == len(self._steps) else Phase.DENOISE
            if state.phase is Phase.DECODE and not state.decode:
                # a copy: a captured graph may reuse its output buffer
                state.latent_chunks.append(result.output.clone())
                state.decoded = state.chunk_frames
                if self._fold or self._plans.last_chunk(state):
                    self._end_chunk(state)
                else:
                    state.phase = Phase.KV_UPDATE
        elif kind is PlanKind.VAE_DECODE:
            if state.collect_frames:
                state.frames.append(result.output)
            latent, pixel = self._plans.decode_part(state)
            state.frames_emitted += pixel
            state.decoded += latent
            if state.decoded == state.chunk_frames:  # else the chunk's next part follows
                if self._fold or self._plans.last_chunk(state):
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
        outputs: dict[str, object] = {
            "chunks": state.chunk,
            "frames_emitted": state.frames_emitted,
            "segment": state.segment,
        }
        if state.collect_frames and state.frames:
            outputs["frames"] = torch.cat(state.frames)[: state.target_frames]
        if state.latent_chunks:
            outputs["latents"] = torch.cat(state.latent_chunks, dim=2)  # [1, C, f, h, w]
        return LoopResult(outputs)

    def plans_total(self, state: ChunkRolloutState) -> int:
        """The plans a bounded stream runs in all: a prompt encode, each chunk's steps, the
        KV updates (none after the last chunk, none where the last step writes the cache) and,
        when it decodes, one decode per chunk (a job's), two for the stream's first chunk (its
        first frame alone: ``decode_part``)."""
        chunks = (state.max_chunks or 1) - state.next_chunk  # a continued stream: what is left
        kv_updates = 0 if self._fold else chunks - 1
        kv_updates += state.phase is Phase.KV_UPDATE  # at a chunk boundary before its update
        encode = int(state.active_prompt != state.prompt)
        decodes = chunks + self._split_first(state) if state.decode else 0
        return encode + chunks * len(self._steps) + kv_updates + decodes

    @staticmethod
    def _split_first(state: ChunkRolloutState) -> int:
        """1 where the stream's first chunk is still to decode in two parts, else 0."""
        return int(state.frames_emitted == 0 and state.chunk_frames > 1)

    def plan_table(self, state: ChunkRolloutState) -> list[tuple[str, str, int, float]]:
        """(kind, shape signature, count, FLOPs per plan) of the plans a bounded stream has
        left: what a price in GPU-seconds is made of (``CostModel.gpu_seconds``)."""
        chunks = (state.max_chunks or 1) - state.next_chunk
        sig, flops = self._plans.step_work(state)
        kv_updates = (0 if self._fold else chunks - 1) + (state.phase is Phase.KV_UPDATE)
        table = [
            (PlanKind.TEXT_ENCODE.value, "embed", int(state.active_prompt != state.prompt), 0.0),
            (PlanKind.CHUNK_STEP.value, sig, chunks * len(self._steps), flops),
            (PlanKind.KV_UPDATE.value, sig, kv_updates, flops),
        ]
        if state.decode:
            # the stream's first chunk: its first frame alone, then the rest (``decode_part``)
            first = int(state.frames_emitted == 0)
            split = self._split_first(state)
            decode = PlanKind.VAE_DECODE.value
            table += [
                (decode, self._plans.decode_sig(state, True, 1), first, 0.0),
                (decode, self._plans.decode_sig(state, False, state.chunk_frames - 1), split, 0.0),
                (decode, self._plans.decode_sig(state, False), chunks - first, 0.0),
            ]
        return [row for row in table if row[2] > 0]

    # ---------------------------------------------------------------------------------------
    # chunk boundary and inputs

    def _end_chunk(self, state: ChunkRolloutState) -> None:
        state.chunk += 1
        state.frame_start += state.chunk_frames
        state.restarts = 0
        self._latch(state, boundary=True)

    def _version(self) -> str:
        return self._m.weights_digest

    def _stale(self, state: ChunkRolloutState) -> bool:
        """The model's weights changed since the state's cross K/V were made (a weight sync
        holds every loop at a chunk boundary, so a chunk is made by one version only)."""
        return state.weights_version != self._version()

    def _progress(self, state: ChunkRolloutState) -> ChunkProgress:
        return ChunkProgress(
            steps_done=state.denoise_step,
            steps_total=len(self._steps),
            decoded=state.decoded > 0 or state.phase is Phase.KV_UPDATE,
            kv_written=self._fold and state.phase is Phase.DECODE,
            kv_update_units=0 if self._fold else 1,
            restarts=state.restarts,
        )

    def _latch(self, state: ChunkRolloutState, *, boundary: bool) -> None:
        """Start the current chunk position with the pending inputs latched: at a chunk
        ``boundary`` (the previous chunk ended), or a restart of the chunk in flight (its
        finished steps are dropped; its audio and the audio still pending stay as they are,
        and an input latched anew replaces its kind's earlier ack)."""
        state.phase, state.denoise_step, state.latents = Phase.START, 0, None
        state.decoded, state.step_latents, state.step_batch = 0, [], 1
        if state.next_prompt is not None:
            if state.next_prompt_is_cut:
                state.segment += 1
                state.recache_needed = False
            else:
                state.recache_needed = state.kv.frames_written > 0
            state.prompt, state.next_prompt = state.next_prompt, None
        if boundary:
            state.chunk_action, state.next_action = state.next_action, None
            state.chunk_keys, state.next_keys = state.next_keys, []
            state.chunk_action_digest, state.next_action_digest = state.next_action_digest, ""
            state.chunk_audio = self._take_audio(state)
            state.acks, state.next_acks = state.next_acks, []
            return
        state.restarts += 1
        if state.next_action is not None:  # the restarted chunk sees (and records) it
            state.chunk_action, state.next_action = state.next_action, None
            state.chunk_keys, state.next_keys = state.next_keys, []
            state.chunk_action_digest, state.next_action_digest = state.next_action_digest, ""
        moved = [a for a in state.next_acks if a[0] is not InputKind.AUDIO]
        kinds = {a[0] for a in moved}
        state.acks = [a for a in state.acks if a[0] not in kinds] + moved
        state.next_acks = [a for a in state.next_acks if a[0] is InputKind.AUDIO]

    def _take_audio(self, state: ChunkRolloutState) -> torch.Tensor | None:
        state.chunk_audio_digest = ""
        if state.audio_pending.numel() == 0 or "audio" not in self._inputs:
            return None
        seconds = self._m.latent.pixel_frames(state.chunk_frames, includes_first=False) / state.fps
        need = int(round(seconds * AUDIO_SAMPLE_RATE))
        taken, state.audio_pending = state.audio_pending[:need], state.audio_pending[need:]
        features = audio_features(taken, state.chunk_frames)  # [c, AUDIO_DIM]
        state.chunk_audio_digest = host_digest(features)
        return features[None].to(self._m.device, self._m.dtype)

    def fork(
        self, state: ChunkRolloutState, request: SessionRequest, model: Any = None
    ) -> ChunkRolloutState:
        """A continuation of ``state`` as a new stream (``models.loops.chunk_rollout.fork``)."""
        return fork_state(self._m, state, request)

    def _chunks_for(self, num_frames: int, c: int) -> int:
        first = self._m.latent.pixel_frames(c, includes_first=True)
        later = self._m.latent.pixel_frames(c, includes_first=False)
        return 1 + max(0, math.ceil((num_frames - first) / later))


def _decoder_cache(model: Any, latent_h: int, latent_w: int, codec: str) -> Any:
    """A fresh decoder cache of ``codec`` ("": the model's only decoder)."""
    if not codec:
        return model.new_decoder_cache(latent_h, latent_w)
    return model.new_decoder_cache(latent_h, latent_w, codec)
