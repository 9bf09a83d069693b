"""A synchronous stream through the real session loop, for evaluation and tests.

``LoopStream`` runs a card's ``chunk_rollout`` through the runtime's driver with an inline
context (every plan runs at once, alone, on the calling thread; no scheduler): what it measures
is the model and its loop, not the engine. Inputs latch like a session's, when a chunk ends
(after its KV update): pushed after ``next_chunk`` returned chunk k, they apply to chunk k + 1
(the loop's "applied" acks say exactly where).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import torch

from models.loops.chunk_rollout.state import ChunkRolloutState
from models.loops.requests import SessionRequest
from runtime.contract import (
    ActionInput,
    AudioInput,
    Driver,
    Emission,
    InlineContext,
    InputEvent,
    InputKind,
    PromptInput,
    Stream,
)

__all__ = ["LoopStream", "StreamEndedError"]


class StreamEndedError(RuntimeError):
    """The loop reported Done before the chunk asked for (names how many chunks ran)."""


class LoopStream:
    """One session of ``instance``'s ``chunk_rollout`` (see module docstring)."""

    def __init__(self, instance: Any, prompt: str, *, seed: int = 0) -> None:
        self._ctx = InlineContext("stream", on_emit=self._collect)
        self._driver = Driver(instance.loop("chunk_rollout"), self._ctx)
        self._driver.init(SessionRequest(prompt=prompt, seed=seed), instance)
        self._seq = 0
        self._parts: list[torch.Tensor] = []
        self._final = False
        self.applied: dict[int, int] = {}  # input seq -> chunk that first reflects it
        self.chunks_done = 0
        self.plan_wall_s: list[tuple[str, float]] = []  # (plan kind, wall seconds), in order

    @property
    def state(self) -> ChunkRolloutState:
        """The loop's state at the boundary the stream stands at."""
        return self._driver.state

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
        self._ctx.push_input(InputEvent(kind, self._seq, payload, time.monotonic()))
        return self._seq

    def push_keys(self, keys: Sequence[str]) -> int:
        return self.push(ActionInput(keys=tuple(keys)))

    def next_chunk(self) -> torch.Tensor:
        """Run plans until the next chunk's frames are all emitted -> uint8 [n, H, W, 3] (a
        chunk may come in parts: media emissions carry ``final``)."""
        self._parts, self._final = [], False
        try:
            asyncio.run(self._until_final_media())
        finally:  # the stream hands frames out and keeps neither them nor the plans' arguments
            ctx = self._ctx
            ran = zip(ctx.executed, ctx.wall_s, strict=True)
            self.plan_wall_s += [(plan.kind.value, wall_s) for plan, wall_s in ran]
            for kept in (ctx.executed, ctx.wall_s, ctx.emissions):
                kept.clear()
        self.chunks_done += 1
        parts = self._parts
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    async def _until_final_media(self) -> None:
        while not self._final:
            if not await self._driver.step():
                raise StreamEndedError(f"stream ended after {self.chunks_done} chunks")

    def _collect(self, emission: Emission) -> None:
        spec = emission.spec
        if spec.stream == Stream.APPLIED:
            self.applied.setdefault(spec.meta.seq, spec.meta.chunk)
        elif spec.stream == Stream.MEDIA:
            self._parts.append(emission.output)
            self._final = spec.meta.final
