"""What sessions and jobs need from the engine's ``runtime.loop_handle.LoopHandle``.

A structural type, so the session logic is unit-testable with a hand-driven stand-in; the real
handle satisfies it. Call every method on the event loop that owns the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from runtime.contract import Emission, InputEvent, LoopResult, LoopState

__all__ = ["LoopHandleLike"]

T = TypeVar("T")


class LoopHandleLike(Protocol):
    @property
    def loop_id(self) -> str: ...

    @property
    def done(self) -> bool: ...

    def push_input(self, event: InputEvent) -> None: ...

    def cancel(self, reason: str = "cancelled") -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...

    def set_media_t0(self, t0_s: float) -> None: ...

    async def result(self) -> LoopResult: ...

    def at_boundary(
        self, fn: Callable[[LoopState], T], *, after_chunk: bool = False, advance: bool = False
    ) -> asyncio.Future[T]: ...

    def set_sink(self, on_emit: Callable[[Emission], None]) -> None: ...

    def set_input_log(self, on_inputs: Callable[[int, list[InputEvent]], None] | None) -> None: ...
