"""A hand-driven stand-in for ``runtime.engine.LoopHandle`` (unit tests of pure session logic)."""

from __future__ import annotations

import asyncio

from runtime.contract import Cancelled, InputEvent, LoopFailed, LoopResult


class FakeHandle:
    def __init__(self, loop_id: str = "loop-1") -> None:
        self.loop_id = loop_id
        self.inputs: list[InputEvent] = []
        self.calls: list[tuple] = []
        self.boundary_state = None  # what at_boundary hands its function
        self.input_log = None
        self._result: asyncio.Future[LoopResult] = asyncio.get_running_loop().create_future()

    @property
    def done(self) -> bool:
        return self._result.done()

    def push_input(self, event: InputEvent) -> None:
        self.inputs.append(event)

    def cancel(self, reason: str = "cancelled") -> None:
        self.calls.append(("cancel", reason))
        if not self._result.done():
            self._result.set_exception(Cancelled(self.loop_id, reason))

    def pause(self) -> None:
        self.calls.append(("pause",))

    def resume(self) -> None:
        self.calls.append(("resume",))

    def set_media_t0(self, t0_s: float) -> None:
        self.calls.append(("t0", round(t0_s, 6)))

    def finish(self, outputs: dict | None = None) -> None:
        self._result.set_result(LoopResult(outputs or {}))

    def fail(self, code: str, message: str) -> None:
        self._result.set_exception(LoopFailed(self.loop_id, code, message))

    async def result(self) -> LoopResult:
        return await asyncio.shield(self._result)

    def set_input_log(self, on_inputs) -> None:
        self.input_log = on_inputs

    def set_sink(self, on_emit) -> None:
        self.calls.append(("sink",))

    def at_boundary(self, fn, *, after_chunk: bool = False, advance: bool = False):
        self.calls.append(("at_boundary", after_chunk, advance))
        future = asyncio.get_running_loop().create_future()
        future.set_result(fn(self.boundary_state)) if self.boundary_state is not None else None
        return future
