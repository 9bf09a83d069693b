"""``ProgramLoop``: an InlineProgram run as one driven loop on one resident instance.

The program's loop nodes (``chunk_rollout`` / ``diffusion_denoise``, told to stop at latents)
and decode nodes (``models.loops.latent_decode``) are loops of their own; this loop is their
composition. ``next`` moves what the loops made along the tensor edges (a rollout's chunks as
each is denoised; a clip's latents when its loop finished), then asks the nodes for a plan,
downstream first, so a decoder takes each piece as soon as it exists and the previews of a
rollout come out while it still runs::

    denoise ──latents──┬──► preview (tiny) ──stream──► "preview" emissions, per chunk
                       └──► final (full)   ──artifact─► LoopResult "frames" -> the MP4

Every plan of every node goes through the same engine, scheduler, admission and cancellation
as a lone loop's; the program replaces the nodes' progress emissions by its own (done / total
plans of all its nodes). Its state is the nodes' loop states plus how many pieces each tensor
edge delivered, one ``msgspec`` struct: a snapshot of a half-run program resumes like a job.

A ``ProgramLoop`` checks its program against the card first
(``models.programs.validation.check``); the request (``ProgramRequest``) carries the program's
wire form and the job's fields, the defaults of every loop node (a node's own parameters,
``adapters`` included, override them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgspec
import torch

from models.loops.chunk_rollout.state import ChunkRolloutState
from models.loops.diffusion_denoise import DiffusionState
from models.loops.latent_decode import DecodeState, LatentDecode
from models.loops.pieces import fed_pieces
from models.loops.requests import JobRequest, ProgramRequest
from models.programs.graph import EdgeKind, NodeKind, Program
from models.programs.validation import check, loop_spec_id, task_of
from runtime.contract import (
    Done,
    EmitSpec,
    InputEvent,
    LoopContext,
    LoopResult,
    LoopState,
    ProgressMeta,
    StepResult,
    Stream,
    WorkPlan,
)

__all__ = ["ProgramLoop", "ProgramState"]

# the loop node parameters that override the job's request fields of the same name
_REQUEST_FIELDS = (
    "prompt",
    "negative_prompt",
    "num_frames",
    "width",
    "height",
    "seed",
    "steps",
    "guidance_scale",
)


class ProgramState(LoopState, kw_only=True):
    loop_id: str
    program: dict[str, Any]  # the wire form (Program.to_dict): what the state is a run of
    rollouts: dict[str, ChunkRolloutState] = {}
    denoises: dict[str, DiffusionState] = {}
    decodes: dict[str, DecodeState] = {}
    finished: list[str] = []  # nodes whose loop is done
    delivered: dict[str, int] = {}  # tensor edge key -> latent pieces it delivered
    current: str = ""  # the node whose plan is in flight
    plans_total: int = 0


class ProgramLoop:
    """Runs one validated ``Program`` on ``model`` (see the module docstring)."""

    name = "program"
    state_type = ProgramState

    def __init__(self, model: Any, program: Program) -> None:
        check(program, model.card)
        self._m = model
        self._program = program
        depth = program.depth()
        # downstream first (stable: declaration order among equals)
        self._priority = sorted(program.order(), key=lambda node_id: -depth[node_id])
        self._loops: dict[str, Any] = {}
        for node in program.nodes:
            if node.kind is NodeKind.LOOP:
                loop_id = loop_spec_id(model.card, node.get("loop"), task_of(program, node.node_id))
                self._loops[node.node_id] = model.loop(loop_id)
            elif node.kind is NodeKind.DECODE:
                self._loops[node.node_id] = LatentDecode(model, node.get("decoder"))
        self._tensor_edges = [e for e in program.edges if e.kind is EdgeKind.TENSOR]
        artifact = program.of_kind(NodeKind.ARTIFACT)[0]
        self._artifact_source = program.into(artifact.node_id)[0].source
        self._streams = {
            e.source: program.node(e.target).get("name", e.target)
            for e in program.edges
            if e.kind is EdgeKind.STREAM
        }

    @property
    def program(self) -> Program:
        return self._program

    # ---------------------------------------------------------------------------------------
    # contract

    def init(self, request: ProgramRequest, model: Any, ctx: LoopContext | None = None) -> Any:
        return self._build(request, model, ctx.loop_id if ctx is not None else "loop", ctx)

    def fork(self, source: Any, request: ProgramRequest, model: Any = None) -> ProgramState:
        """The program started from another loop's state at a chunk boundary (the engine's
        ``spawn(fork_from=...)``): its loop node continuing a session (parameter ``session``)
        goes on from ``source`` (a ``ChunkRolloutState``, a copy the caller made) for its
        ``chunks`` more chunks, without decoding: the program's decoders decode them from
        fresh caches. ``request.loop_id`` (the job's id) names the state."""
        (node,) = [n for n in self._program.of_kind(NodeKind.LOOP) if n.get("session")]
        if not isinstance(source, ChunkRolloutState):
            raise ValueError(f"program {self._program.name!r}: a session's state continues here")
        start = source.next_chunk
        moment = msgspec.structs.replace(
            source,
            loop_id=request.loop_id,
            max_chunks=start + int(node.get("chunks")),
            collect_frames=False,
            target_frames=None,
            decode=False,
            latent_chunks=[],
            frames=[],
            keep_latents=False,
            step_latents=[],
        )
        return self._build(request, model, request.loop_id, None, {node.node_id: moment})

    def _build(
        self,
        request: ProgramRequest,
        model: Any,
        loop_id: str,
        ctx: LoopContext | None,
        sources: dict[str, Any] | None = None,
    ) -> ProgramState:
        state = ProgramState(loop_id=loop_id, program=self._program.to_dict())
        sources = sources or {}
        for node in self._program.nodes:
            if node.kind is NodeKind.LOOP:
                sub = sources.get(node.node_id)
                if sub is None and node.get("session"):
                    raise ValueError(
                        f"program {self._program.name!r}: node {node.node_id!r} continues "
                        f"session {node.get('session')!r} and needs its state (fork)"
                    )
                if sub is None:
                    sub = self._loops[node.node_id].init(
                        self._node_request(request, node), model, ctx
                    )
                if isinstance(sub, ChunkRolloutState):
                    state.rollouts[node.node_id] = sub
                else:
                    state.denoises[node.node_id] = sub
        for node in self._program.of_kind(NodeKind.DECODE):
            source = self._program.into(node.node_id)[0].source
            state.decodes[node.node_id] = self._loops[node.node_id].init(
                loop_id=state.loop_id,
                stream=self._streams.get(node.node_id, ""),
                **self._geometry(state, source),
            )
        state.plans_total = sum(self._plans_of(state, n) for n in self._loops)
        return state

    def absorb(self, state: ProgramState, inputs: Sequence[InputEvent]) -> ProgramState:
        kinds = sorted({event.kind for event in inputs})
        raise ValueError(f"program {self._program.name!r} takes no live inputs (got {kinds})")

    def next(self, state: ProgramState) -> WorkPlan | Done:
        self._deliver(state)
        moved = True
        while moved:
            moved = False
            for node_id in self._priority:
                if node_id not in self._loops or node_id in state.finished:
                    continue
                plan = self._loops[node_id].next(self._sub(state, node_id))
                if isinstance(plan, Done):
                    state.finished.append(node_id)
                    self._deliver(state)
                    moved = True
                    break
                if plan is not None:
                    state.current = node_id
                    return self._wrap(state, plan)
        waiting = [n for n in self._loops if n not in state.finished]
        if waiting:  # a validated program cannot get here: every decoder has a loop upstream
            raise RuntimeError(f"program {self._program.name!r}: nodes {waiting} wait on nothing")
        return Done()

    def advance(self, state: ProgramState, result: StepResult) -> ProgramState:
        node_id, state.current = state.current, ""
        sub = self._loops[node_id].advance(self._sub(state, node_id), result)
        self._put(state, node_id, sub)
        state.step += 1
        return state

    def finalize(self, state: ProgramState) -> LoopResult:
        outputs: dict[str, object] = {}
        for node_id, loop in self._loops.items():
            result = loop.finalize(self._sub(state, node_id)).outputs
            if node_id in state.decodes:
                outputs[f"frames.{node_id}"] = result["frames"]
            else:
                outputs[f"latents.{node_id}"] = result.get("latents")
        outputs["frames"] = outputs[f"frames.{self._artifact_source}"]
        return LoopResult(outputs)

    # ---------------------------------------------------------------------------------------
    # nodes

    def _node_request(self, request: ProgramRequest, node: Any) -> JobRequest:
        fields = {k: node.get(k) for k in _REQUEST_FIELDS if node.get(k) is not None}
        if node.get("adapters"):  # [[name, strength], ...] in the wire form
            fields["adapters"] = tuple((str(n), float(s)) for n, s in node.get("adapters"))
        task = task_of(self._program, node.node_id)
        return msgspec.structs.replace(request.job, task=task, decode=False, **fields)

    def _sub(self, state: ProgramState, node_id: str) -> Any:
        for table in (state.decodes, state.rollouts, state.denoises):
            if node_id in table:
                return table[node_id]
        raise KeyError(f"program {self._program.name!r}: no state for node {node_id!r}")

    @staticmethod
    def _put(state: ProgramState, node_id: str, sub: Any) -> None:
        for table in (state.decodes, state.rollouts, state.denoises):
            if node_id in table:
                table[node_id] = sub

    def _latents(self, state: ProgramState, node_id: str) -> list[torch.Tensor]:
        """What loop node ``node_id`` made so far, in order: a rollout's finished chunks; a
        clip's latents once its loop is done."""
        if node_id in state.rollouts:
            return state.rollouts[node_id].latent_chunks
        clip = state.denoises[node_id]
        return [clip.latents] if node_id in state.finished and clip.latents is not None else []

    def _deliver(self, state: ProgramState) -> None:
        for edge in self._tensor_edges:
            made = self._latents(state, edge.source)
            sent = state.delivered.get(edge.key, 0)
            target = state.decodes[edge.target]
            for latents in made[sent:]:
                LatentDecode.feed(target, latents)
            state.delivered[edge.key] = len(made)
            if edge.source in state.finished and not target.closed:
                LatentDecode.close(target)

    def _geometry(self, state: ProgramState, source: str) -> dict[str, object]:
        """The decode geometry of loop node ``source``'s latents (its chunks: what its own
        decode would have decoded, piece for piece)."""
        if source in state.rollouts:
            r = state.rollouts[source]
            return {
                "latent_h": r.latent_h,
                "latent_w": r.latent_w,
                "chunk_frames": r.chunk_frames,
                "decode_chunk": r.chunk_frames,
                "fps": r.fps,
                "num_frames": r.target_frames,
            }
        d = state.denoises[source]
        profile = self._m.card.resolve_profile(
            width=d.latent_w * self._m.latent.spatial_stride,
            height=d.latent_h * self._m.latent.spatial_stride,
        )
        return {
            "latent_h": d.latent_h,
            "latent_w": d.latent_w,
            "chunk_frames": d.decode_chunk,
            "decode_chunk": d.decode_chunk,
            "fps": profile.fps,
            "num_frames": d.num_frames,
        }

    def _plans_of(self, state: ProgramState, node_id: str) -> int:
        """The plans node ``node_id`` runs in all (the program's progress total)."""
        loop, sub = self._loops[node_id], self._sub(state, node_id)
        if node_id in state.decodes:
            source = self._program.into(node_id)[0].source
            if source in state.rollouts:  # fed chunk by chunk
                r = state.rollouts[source]
                f = r.chunk_frames
                pieces = fed_pieces(r.next_chunk * f, (r.max_chunks or 1) * f, f, sub.decode_chunk)
            else:  # fed whole
                pieces = fed_pieces(0, state.denoises[source].latent_frames, 0, sub.decode_chunk)
            return len(pieces)
        return loop.plans_total(sub)

    def plan_table(self, state: ProgramState) -> list[tuple[str, str, int, float]]:
        """(kind, shape signature, count, FLOPs per plan) of every plan the program's nodes
        have left: its price is the sum of their cost models' GPU-seconds (the engine's
        ``CostModel.gpu_seconds`` of each row, times its count). Boundary calls only."""
        table: list[tuple[str, str, int, float]] = []
        for node_id, loop in self._loops.items():
            if node_id in state.finished:
                continue
            sub = self._sub(state, node_id)
            if node_id not in state.decodes:
                table += loop.plan_table(sub)
                continue
            source = self._program.into(node_id)[0].source
            feed = 0
            if source in state.rollouts:
                r = state.rollouts[source]
                left = ((r.max_chunks or 1) - r.next_chunk) * r.chunk_frames
                left += sum(p.shape[2] for p in r.latent_chunks) - sub.latent_frames
                feed = r.chunk_frames
            else:
                left = state.denoises[source].latent_frames - sub.latent_frames
            table += loop.plan_table(sub, left + sum(p.shape[2] for p in sub.pending), feed)
        return table

    def _wrap(self, state: ProgramState, plan: WorkPlan) -> WorkPlan:
        """``plan`` with the program's progress instead of its node's."""
        total = max(state.plans_total, state.step + 1)
        progress = EmitSpec(Stream.PROGRESS, ProgressMeta(done=state.step + 1, total=total))
        emits = tuple(e for e in plan.emits if e.stream != Stream.PROGRESS)
        return dataclasses.replace(plan, emits=(*emits, progress))
