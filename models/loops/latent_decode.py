"""``latent_decode``: a decoder of the card turning latents into frames, as a program node.

The latents arrive piece by piece (``feed``: what the upstream loop made so far; a rollout's
chunks, or a whole clip) and are decoded in pieces of at most ``decode_chunk`` latent frames
(the stream's first latent frame alone: ``models.loops.pieces.decode_pieces``), in order, through
the decoder's causal feature cache (``vae_decode`` plans on the decoder's own op: a tiny
decoder's decodes never batch with the VAE's). So a decoder fed a rollout's chunks
decodes what that rollout's own decode would have (the same pieces, but for the split of a
chunk that shows a changing input, and the same cache), and its frames equal the decoder's
alone. ``close`` says no more latents come. ``next`` returns None
while it waits for latents: only a program (``models.programs.program_loop``) drives this
loop, and it runs the upstream node meanwhile.

With ``stream`` set, each decode's frames are also emitted on that stream (``MediaMeta``:
frame index, PTS) as soon as they exist: a preview. ``finalize`` gives every frame, trimmed to
``num_frames`` (the last chunk of a rollout may overshoot).
"""

from __future__ import annotations

import torch

from models.loops.chunk_rollout.plans import chunk_shape_sig, decode_shape_sig
from models.loops.model import LoopModel
from models.loops.ops import DecodeArgs
from models.loops.pieces import decode_pieces, fed_pieces
from models.wan.vae.cache import DecoderCache
from runtime.contract import (
    Done,
    EmitSpec,
    LoopResult,
    LoopState,
    MediaMeta,
    PlanKind,
    StepResult,
    WorkPlan,
    pts_of_frame,
)

__all__ = ["DecodeState", "LatentDecode"]


class DecodeState(LoopState, kw_only=True):
    loop_id: str
    decoder: str  # "full" | "tiny": the card's decoder option
    latent_h: int
    latent_w: int
    chunk_frames: int  # the upstream's chunk (latent frames): the decode's shape signature
    decode_chunk: int  # latent frames per decode, at most
    fps: int
    num_frames: int | None = None  # pixel frames to keep (None: all)
    stream: str = ""  # emit each decode's frames on this stream ("": none)
    pending: list[torch.Tensor] = []  # [1, C, <= decode_chunk, h, w] waiting, in order
    closed: bool = False  # the upstream finished: nothing more will be fed
    latent_frames: int = 0  # fed so far
    frames_out: int = 0  # pixel frames decoded so far
    frames: list[torch.Tensor] = []  # uint8 [n, H, W, 3] per decode
    cache: DecoderCache


class LatentDecode:
    """One decoder of a loaded instance as a loop (see the module docstring)."""

    name = "latent_decode"

    def __init__(self, model: LoopModel, decoder: str) -> None:
        self._m = model
        self._decoder = decoder

    def init(
        self,
        *,
        loop_id: str,
        latent_h: int,
        latent_w: int,
        chunk_frames: int,
        decode_chunk: int,
        fps: int,
        num_frames: int | None,
        stream: str = "",
    ) -> DecodeState:
        return DecodeState(
            loop_id=loop_id,
            decoder=self._decoder,
            latent_h=latent_h,
            latent_w=latent_w,
            chunk_frames=chunk_frames,
            decode_chunk=decode_chunk,
            fps=fps,
            num_frames=num_frames,
            stream=stream,
            cache=self._m.new_decoder_cache(latent_h, latent_w, self._decoder),
        )

    @staticmethod
    def feed(state: DecodeState, latents: torch.Tensor) -> None:
        """Queue ``latents`` [1, C, f, h, w] (the next f latent frames of the stream)."""
        frames = latents.shape[2]
        done = state.latent_frames
        for start, stop in decode_pieces(done, done + frames, state.decode_chunk):
            state.pending.append(latents[:, :, start - done : stop - done])
        state.latent_frames += frames

    @staticmethod
    def close(state: DecodeState) -> None:
        state.closed = True

    def next(self, state: DecodeState) -> WorkPlan | Done | None:
        if not state.pending:
            return Done() if state.closed else None
        latents = state.pending[0]
        n = latents.shape[2]
        first = state.frames_out == 0
        pixels = self._m.latent.pixel_frames(n, includes_first=first)
        emits: tuple[EmitSpec, ...] = ()
        if state.stream:
            meta = MediaMeta(
                chunk=state.step,
                segment=0,
                frame_start=state.frames_out,
                pts_90k=pts_of_frame(state.frames_out, state.fps),
                num_frames=pixels,
                fps=state.fps,
            )
            emits = (EmitSpec(state.stream, meta),)
        default = getattr(self._m, "default_decoder", "")
        chunk_sig = chunk_shape_sig(state.chunk_frames, state.latent_h, state.latent_w)
        return WorkPlan(
            loop_id=state.loop_id,
            kind=PlanKind.VAE_DECODE,
            op=self._m.decode_op_for(self._decoder),
            args=DecodeArgs(latents=latents, cache=state.cache),
            shape_sig=decode_shape_sig(
                first, n, chunk_sig, "" if self._decoder == default else self._decoder
            ),
            instance_id=self._m.instance_id,
            precision=self._m.precision,
            emits=emits,
        )

    def advance(self, state: DecodeState, result: StepResult) -> DecodeState:
        state.pending.pop(0)
        state.step += 1
        state.frames.append(result.output)  # uint8 [n, H, W, 3]
        state.frames_out += result.output.shape[0]
        return state

    def finalize(self, state: DecodeState) -> LoopResult:
        frames = torch.cat(state.frames)[: state.num_frames] if state.frames else None
        return LoopResult({"frames": frames})

    def plan_table(
        self, state: DecodeState, latent_frames: int, feed: int = 0
    ) -> list[tuple[str, str, int, float]]:
        """(kind, shape signature, count, FLOPs per plan) of the decodes of the ``latent_frames``
        latent frames not decoded yet (those pending among them), fed ``feed`` at a time (a
        rollout's chunk; 0: at once) and decoded in ``fed_pieces``: a price's part."""
        default = getattr(self._m, "default_decoder", "")
        chunk_sig = chunk_shape_sig(state.chunk_frames, state.latent_h, state.latent_w)
        decoder = "" if self._decoder == default else self._decoder
        rows: dict[str, int] = {}
        start = state.latent_frames - sum(p.shape[2] for p in state.pending)
        for a, b in fed_pieces(start, start + latent_frames, feed, state.decode_chunk):
            sig = decode_shape_sig(a == 0, b - a, chunk_sig, decoder)
            rows[sig] = rows.get(sig, 0) + 1
        return [(PlanKind.VAE_DECODE.value, sig, n, 0.0) for sig, n in rows.items()]
