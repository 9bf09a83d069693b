"""A synchronous stream through the real session loop, for evaluation and tests.

``LoopStream`` drives a card's ``chunk_rollout`` exactly as ``runtime``'s driver does (absorb
inputs at a step boundary, ``next``, run the plan's op, ``advance``, collect emissions), but on
the calling thread with no scheduler: what it measures is the model and its loop, not the
engine. Inputs latch like a session's, when a chunk ends (after its KV update): pushed after
``next_chunk`` returned chunk k, they apply to chunk k + 1 (the loop's "applied" acks say
exactly where).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from models.loops.requests import SessionRequest
from runtime.contract import (
    ActionInput,
    AudioInput,
    Done,
    Emission,
    InputEvent,
    InputKind,
    PromptInput,
    StepResult,
    Stream,
)

__all__ = ["LoopStream", "StreamEndedError"]


class StreamEndedError(RuntimeError):
    """The loop reported Done before the chunk asked for (names how many chunks ran)."""


class LoopStream:
    """One session of ``instance``'s ``chunk_rollout`` (see module docstring)."""

    def __init__(self, instance: Any, prompt: str, *, seed: int = 0) -> None:
        self._loop = instance.loop("chunk_rollout")
        self.state = self._loop.init(SessionRequest(prompt=prompt, seed=seed), instance, None)
        self._pending: list[InputEvent] = []
        self._seq = 0
        self.applied: dict[int, int] = {}  # input seq -> chunk that first reflects it
        self.chunks_done = 0
        self.plan_wall_s: list[tuple[str, float]] = []

    def push(self, payload: PromptInput | ActionInput | AudioInput) -> int:
        """Queue an input; -> its seq."""
        self._seq += 1
        kind = (
            InputKind.PROMPT
            if isinstance(payload, PromptInput)
            else InputKind.ACTION
            if isinstance(payload, ActionInput)
            else InputKind.AUDIO
        )
        self._pending.append(InputEvent(kind, self._seq, payload, time.monotonic()))
        return self._seq

    def push_keys(self, keys: Sequence[str]) -> int:
        return self.push(ActionInput(keys=tuple(keys)))

    def next_chunk(self) -> torch.Tensor:
        """Run plans until the next chunk's frames are all emitted -> uint8 [n, H, W, 3] (a
        chunk may come in parts: media emissions carry ``final``)."""
        parts: list[torch.Tensor] = []
        while True:
            if self._pending:
                self.state = self._loop.absorb(self.state, self._pending)
                self._pending = []
            plan = self._loop.next(self.state)
            match plan:
                case Done():
                    raise StreamEndedError(f"stream ended after {self.chunks_done} chunks")
            start = time.perf_counter()
            output = plan.op([plan.args])[0]
            wall_s = time.perf_counter() - start
            self.plan_wall_s.append((plan.kind.value, wall_s))
            self.state = self._loop.advance(self.state, StepResult(output, wall_s, kind=plan.kind))
            final = False
            for spec in plan.emits:
                emission = Emission(spec, output)
                if spec.stream == Stream.APPLIED:
                    self.applied.setdefault(spec.meta.seq, spec.meta.chunk)
                elif spec.stream == Stream.MEDIA:
                    parts.append(emission.output)
                    final = spec.meta.final
            if final:
                self.chunks_done += 1
                return torch.cat(parts) if len(parts) > 1 else parts[0]
