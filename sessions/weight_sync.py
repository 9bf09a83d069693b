"""Weight sync: a trainer's new policy weights into the running server, between two chunks.

``WeightSync.sync(source, mode=, model=)`` (``POST /v1/weights``, or in process)::

    prepare    read + validate the update on a worker thread (models.resident_weights): a bad
               file raises here, before admission or any loop is touched
    hold       admission closed for the model, every loop of it held at its next chunk
               boundary (sessions.model_hold)
    apply      the update written in place on a worker thread; weights_version = content hash;
               the text-embedding entries of the old version dropped
    release    every loop resumes; at its next chunk it re-encodes its prompt and re-caches its
               frames under the new weights (models.loops.chunk_rollout.loop); admission reopens
    announce   ``weights.updated`` on every held session's event stream (from which chunk)

A failed prepare or hold changes nothing (the old weights keep serving); syncs and sleeps of
one model run one at a time (``lock``). Behaviour records carry, per chunk, the version that
made it (the loop's capture).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import DreamrtError
from sessions.events import WeightsUpdated
from sessions.model_hold import ModelControl

__all__ = ["InvalidWeightsError", "SyncResult", "WeightSync", "WeightSyncError"]

log = logging.getLogger(__name__)


class WeightSyncError(DreamrtError, RuntimeError):
    """The model cannot take an update now (e.g. a component is asleep); nothing changed (409)."""

    code = "conflict"
    status = 409


class InvalidWeightsError(DreamrtError, ValueError):
    """The update does not fit the model (the reader's message: names, shapes, values, an
    unreadable file); nothing changed (422)."""

    code = "invalid"
    status = 422


@dataclass(frozen=True, slots=True)
class SyncResult:
    model_id: str
    previous: str
    weights_version: str
    mode: str
    tensors: int
    loops_held: int
    prepare_s: float  # read + validate (admission still open)
    held_s: float  # admission closed and loops held (what sessions wait)
    total_s: float


class WeightSync(ModelControl):
    """See the module docstring. Event-loop thread only."""

    def version(self, model: str | None = None) -> str:
        return str(self._models.resolve(model).weights.version)

    async def sync(
        self,
        source: str | Path | Any,
        *,
        mode: str = "full",
        model: str | None = None,
    ) -> SyncResult:
        """Load ``source`` (a safetensors file or directory, or a mapping of tensors) into the
        model's DiT (module docstring). Raises ``InvalidWeightsError`` (the update does not
        fit), ``WeightSyncError`` (not now) or ``sessions.model_hold.HoldTimeout``; each leaves
        the old weights serving."""
        served = self._models.resolve(model)
        model_id = served.card.model_id
        weights = served.weights
        async with self.lock:
            if weights.asleep:
                raise WeightSyncError(
                    f"model {model_id}: {sorted(weights.asleep)} asleep; wake it before a sync"
                )
            start_s = time.perf_counter()
            try:
                update = await asyncio.to_thread(weights.prepare, source, mode=mode)
            except Exception as exc:  # the reader's errors are the model's types: not ours
                raise InvalidWeightsError(f"{type(exc).__name__}: {exc}") from exc
            prepared_s = time.perf_counter()
            held = await self._hold.hold(
                model_id,
                reason="weights_sync",
                retry_after_s=self.retry_after_s,
                after_chunk=True,
                timeout_s=self.timeout_s,
            )
            previous = weights.version
            try:
                version = await asyncio.to_thread(weights.apply, update)
            finally:
                self._hold.release(model_id, held)
            end_s = time.perf_counter()
        for loop in held:
            publish = getattr(loop.owner, "publish", None)
            if publish is not None:
                publish(
                    WeightsUpdated(
                        weights_version=version, previous=previous, chunk=loop.chunk or 0
                    )
                )
        result = SyncResult(
            model_id=model_id,
            previous=previous,
            weights_version=version,
            mode=mode,
            tensors=len(update.tensors),
            loops_held=len(held),
            prepare_s=prepared_s - start_s,
            held_s=end_s - prepared_s,
            total_s=end_s - start_s,
        )
        log.info("weight sync %s", result)
        return result
