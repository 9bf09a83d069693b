"""THE INTERLEAVE GATE on the real session loop: several ``chunk_rollout`` sessions of one model,
interleaved step by step by the engine, each produce bit-identical frames to the same session
run alone — with prompt switches, actions, audio and a cut mid-stream, on the tiny Wan card and
on tiny-world, their chunk-KV caches being slabs of one preallocated buffer.

Inputs are scripted by loop step (a wrapper absorbs them just before the loop plans that step),
so "alone" and "interleaved" see them at the same point of the stream whatever the engine's
timing. The real ops do not batch across sessions yet (``batchable = False``), so this gate is
the interleaved one; batched agreement is checked where batching exists (tests/runtime).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.contract import (
    ActionInput,
    AudioInput,
    Emission,
    InputEvent,
    InputKind,
    Priority,
    PromptInput,
    PromptMode,
    Stream,
)
from runtime.cost import CostModel
from runtime.driver import run_inline
from runtime.engine import Engine
from runtime.observers import BatchInfo, Observation
from runtime.step_edf import StepEdfScheduler

pytestmark = pytest.mark.slow

CHUNKS = 3


class ScriptedInputs:
    """A loop that absorbs ``script[step]`` right before planning loop step ``step``."""

    def __init__(self, inner: Any, script: Mapping[int, Sequence[InputEvent]]) -> None:
        self._inner = inner
        self._script = dict(script)
        self.name = inner.name

    def init(self, request: Any, model: Any, ctx: Any = None) -> Any:
        return self._inner.init(request, model, ctx)

    def absorb(self, state: Any, inputs: Sequence[InputEvent]) -> Any:
        return self._inner.absorb(state, inputs)

    def next(self, state: Any) -> Any:
        events = self._script.pop(state.step, ())
        if events:
            state = self._inner.absorb(state, events)
        return self._inner.next(state)

    def advance(self, state: Any, result: Any) -> Any:
        return self._inner.advance(state, result)

    def finalize(self, state: Any) -> Any:
        return self._inner.finalize(state)


def scripts(accepts_audio: bool) -> dict[str, dict[int, list[InputEvent]]]:
    """Per session: what arrives at which loop step (a chunk is ~6-7 plans on these cards)."""
    tone = (0.6 * np.sin(np.arange(8000) * 0.2)).astype(np.float32)
    audio = [InputEvent(InputKind.AUDIO, 3, AudioInput(samples=tone))] if accepts_audio else []
    return {
        "switch": {4: [InputEvent(InputKind.PROMPT, 1, PromptInput(text="a blue square on snow"))]},
        "steer": {
            2: [InputEvent(InputKind.ACTION, 1, ActionInput(keys=("w", "a"))), *audio],
            9: [InputEvent(InputKind.ACTION, 2, ActionInput(keys=("d",), mouse=(4, 0)))],
        },
        "cut": {
            3: [
                InputEvent(
                    InputKind.PROMPT,
                    1,
                    PromptInput(text="a white ball at night", mode=PromptMode.CUT),
                )
            ]
        },
    }


SEEDS = {"switch": 3, "steer": 5, "cut": 8}


class OrderSpy:
    def __init__(self) -> None:
        self.loops: list[str] = []

    def before_batch(self, info: BatchInfo) -> None:
        self.loops.extend(info.loop_ids)

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[Any], wall_s: float
    ) -> Observation | None:
        return None


def media(emissions: Sequence[Emission]) -> list[tuple[int, int, torch.Tensor]]:
    return [
        (e.spec.meta.chunk, e.spec.meta.pts_90k, torch.as_tensor(e.output))
        for e in emissions
        if e.spec.stream == Stream.MEDIA
    ]


def request(loop_id: str, slab: int) -> SessionRequest:
    return SessionRequest(
        prompt="a red ball on grass", seed=SEEDS[loop_id], max_chunks=CHUNKS, kv_slab=slab
    )


async def alone(instance: Any, accepts_audio: bool) -> dict[str, list]:
    out = {}
    for slab, (loop_id, script) in enumerate(scripts(accepts_audio).items()):
        loop = ScriptedInputs(instance.loop("chunk_rollout"), script)
        _, emissions = await run_inline(loop, request(loop_id, slab), instance, loop_id=loop_id)
        out[loop_id] = media(emissions)
    return out


async def interleaved(instance: Any, accepts_audio: bool) -> tuple[dict[str, list], OrderSpy]:
    spy = OrderSpy()
    engine = Engine(
        cost=CostModel(),
        scheduler=StepEdfScheduler(max_batch=1),
        observers=[spy],
        max_lead_s=1000.0,
    )
    await engine.start()
    emitted: dict[str, list[Emission]] = {}
    try:
        t0_s = time.monotonic()
        handles = {}
        for slab, (loop_id, script) in enumerate(scripts(accepts_audio).items()):
            sink = emitted.setdefault(loop_id, [])
            handles[loop_id] = engine.spawn(
                ScriptedInputs(instance.loop("chunk_rollout"), script),
                request(loop_id, slab),
                instance,
                loop_id=loop_id,
                priority=Priority.REALTIME,
                on_emit=sink.append,
                media_t0_s=t0_s,
            )
        for handle in handles.values():
            await asyncio.wait_for(handle.result(), 300)
    finally:
        await engine.close()
    return {k: media(v) for k, v in emitted.items()}, spy


@pytest.mark.parametrize("model_id", ["wan-tiny-random", "tiny-world"])
async def test_interleaved_sessions_with_inputs_equal_each_session_alone(model_id: str) -> None:
    instance = load_instance(get(model_id), device="cpu")
    buffer = instance.reserve_kv_slabs(instance.card.default_profile, 3)
    accepts_audio = "input.audio" in instance.card.capabilities
    want = await alone(instance, accepts_audio)
    got, spy = await interleaved(instance, accepts_audio)
    for loop_id, chunks in want.items():
        assert [(c, p) for c, p, _ in got[loop_id]] == [(c, p) for c, p, _ in chunks]
        for (_, _, a), (_, _, b) in zip(got[loop_id], chunks, strict=True):
            assert torch.equal(a, b), f"{model_id} {loop_id}: frames differ"
    # the sessions really interleaved: all three ran within the first few plans
    assert set(spy.loops[:9]) == set(want)
    # and the inputs really changed the streams (else the gate would prove little)
    for loop_id in want:
        _, plain = await run_inline(
            instance.loop("chunk_rollout"), request(loop_id, 0), instance, loop_id=loop_id
        )
        assert not torch.equal(media(plain)[-1][2], want[loop_id][-1][2]), loop_id
    # every session wrote its own slab of the one buffer, and only its own
    assert all(buffer.valid[i].any() for i in range(3))
