"""ModelHold with scripted loop handles: admission closes first, loops that reach their boundary
are held, a loop that does not fails the hold and everything is undone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions.model_hold import HoldTimeout, ModelHold
from sessions.served_models import ModelUnavailableError, ServedModels


class FakeHandle:
    def __init__(self, *, reaches: bool, paused: bool = False, chunk: int = 3) -> None:
        self.reaches, self.paused, self.chunk = reaches, paused, chunk
        self.done, self.held, self.calls = False, False, []

    def at_boundary(self, fn: Any, *, after_chunk: bool, advance: bool) -> asyncio.Future:
        self.calls.append((after_chunk, advance))
        future = asyncio.get_running_loop().create_future()
        if advance:
            self.paused = False  # as LoopHandle does for a paused loop
        if self.reaches:
            future.set_result(fn(type("State", (), {"next_chunk": self.chunk})()))
        return future

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False

    def pause(self) -> None:
        self.paused = True


async def test_reached_loops_are_held_and_a_late_one_undoes_everything() -> None:
    models = ServedModels({"m": object()}, default="m")  # type: ignore[dict-item]
    fast, slow = FakeHandle(reaches=True), FakeHandle(reaches=False, paused=True)
    hold = ModelHold(models, lambda model_id: [("a", fast)] if model_id == "m" else [])
    held = await hold.hold(
        "m", reason="weights_sync", retry_after_s=2, after_chunk=True, timeout_s=1
    )
    assert [(h.owner, h.chunk) for h in held] == [("a", 3)] and fast.held
    with pytest.raises(ModelUnavailableError, match="weights_sync"):
        models.check_open("m")
    hold.release("m", held)
    assert not fast.held and not models.closed
    both = ModelHold(models, lambda model_id: [("a", fast), ("b", slow)])
    with pytest.raises(HoldTimeout, match="1 of 2 loops"):
        await both.hold("m", reason="asleep", retry_after_s=5, after_chunk=False, timeout_s=0.05)
    assert not fast.held and slow.paused and not models.closed, "undone, paused as it was"
    assert slow.calls == [(False, True)]
