"""Sleep and wake by component: give a served model's GPU memory back between rollouts.

``ModelSleep.sleep(["dit"], model=)`` (``POST /v1/sleep``): admission closes for the model
(sessions 503 + ``Retry-After``, jobs likewise) and every loop of it is held at its next step
boundary (``sessions.model_hold``); then the components move to host memory and their caches
are dropped on a worker thread (``models.resident_weights``: parameters and buffers, the DiT's
captured CUDA graphs, the text encoder's embeddings). The loops stay held while anything
sleeps: a session keeps its state (its chunk-KV slab stays resident) and publishes
``model.sleep``. ``wake([...])`` copies the components back, bit for bit; when nothing sleeps
any more the loops are released where they stood and admission reopens (``model.sleep`` with
``asleep: false``), so a paused session resumes exactly as if it had never slept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessions.events import ModelSleep as ModelSleepEvent
from sessions.model_hold import HeldLoop, ModelControl, ModelHold
from sessions.served_models import ServedModels

__all__ = ["ModelSleep", "SleepResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SleepResult:
    model_id: str
    components: tuple[str, ...]  # what this call put to sleep / woke
    asleep: tuple[str, ...]  # what sleeps now
    loops_held: int
    freed_bytes: int  # device memory the allocator got back (0 off CUDA)
    seconds: float  # hold + offload, or the copy back + release


class ModelSleep(ModelControl):
    """See the module docstring. Event-loop thread only."""

    retry_after_s = 5.0

    def __init__(self, models: ServedModels, hold: ModelHold, **options: Any) -> None:
        super().__init__(models, hold, **options)
        self._held: dict[str, list[HeldLoop]] = {}

    def asleep(self, model: str | None = None) -> tuple[str, ...]:
        return tuple(sorted(self._models.resolve(model).weights.asleep))

    async def sleep(self, components: Sequence[str], *, model: str | None = None) -> SleepResult:
        """Put ``components`` to sleep (module docstring); ``WeightUpdateError`` names an
        unknown component (nothing is held then); ``HoldTimeout`` changes nothing."""
        served = self._models.resolve(model)
        model_id, weights = served.card.model_id, served.weights
        async with self.lock:
            weights.check(components)  # before anything is held
            start_s = time.perf_counter()
            if model_id not in self._held:
                self._held[model_id] = await self._hold.hold(
                    model_id,
                    reason="asleep",
                    retry_after_s=self.retry_after_s,
                    after_chunk=False,
                    timeout_s=self.timeout_s,
                )
                for loop in self._held[model_id]:
                    self._announce(loop, list(components), asleep=True)
            freed = await asyncio.to_thread(weights.sleep, components)
            return SleepResult(
                model_id,
                tuple(components),
                self.asleep(model_id),
                len(self._held[model_id]),
                freed,
                time.perf_counter() - start_s,
            )

    async def wake(self, components: Sequence[str], *, model: str | None = None) -> SleepResult:
        """Wake ``components``; once nothing sleeps, release the loops and reopen admission."""
        served = self._models.resolve(model)
        model_id, weights = served.card.model_id, served.weights
        async with self.lock:
            weights.check(components)
            start_s = time.perf_counter()
            await asyncio.to_thread(weights.wake, components)
            held = self._held.get(model_id, [])
            if not weights.asleep:
                self._held.pop(model_id, None)
                self._hold.release(model_id, held)
                for loop in held:
                    self._announce(loop, list(components), asleep=False)
            return SleepResult(
                model_id,
                tuple(components),
                self.asleep(model_id),
                len(held),
                0,
                time.perf_counter() - start_s,
            )

    @staticmethod
    def _announce(loop: HeldLoop, components: list[str], *, asleep: bool) -> None:
        publish = getattr(loop.owner, "publish", None)
        if publish is not None:
            publish(ModelSleepEvent(components=components, asleep=asleep))
