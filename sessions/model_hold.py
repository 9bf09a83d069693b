"""Stop one served model: admission closed, every loop of it held at a boundary.

The first half of a weight sync (``sessions.weight_sync``) and of a sleep
(``sessions.model_sleep``)::

    close admission (sessions: Reject -> 503 + Retry-After; jobs: ModelUnavailableError)
      -> each loop of the model: LoopHandle.at_boundary(hold, after_chunk=?, advance=True)
      -> (the caller changes the model)
      -> release every hold (a queued plan is described again), reopen admission

``after_chunk``: a weight sync waits for chunk boundaries, so every chunk is made by one
version; a sleep stops at the next step boundary. ``advance``: a paused loop standing inside a
chunk runs to that boundary first (then is paused again), so a session without a viewer cannot
keep a chunk half made by the old weights. A loop that ends first is simply not held; a loop
that does not reach its boundary within ``timeout_s`` fails the hold: everything held is
released, admission reopens and ``HoldTimeout`` is raised (the model was not changed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.admission import Reject
from runtime.contract import LoopState
from runtime.errors import DreamrtError
from sessions.loop_handle import LoopHandleLike
from sessions.served_models import ServedModels

__all__ = ["HeldLoop", "HoldTimeout", "ModelControl", "ModelHold"]

log = logging.getLogger(__name__)


class HoldTimeout(DreamrtError, RuntimeError):
    """Some loop did not reach its boundary in time; nothing was changed (503: retry)."""

    code = "busy"
    status = 503
    retry_after_s = 5.0


@dataclass(frozen=True, slots=True)
class HeldLoop:
    """A loop held at a boundary: its owner (a ``Session``, a ``Job``) and the first chunk it
    has not decoded yet (None for a loop without chunks)."""

    owner: object  # a Session or a Job: the caller's, passed back as is
    handle: LoopHandleLike
    chunk: int | None


# model id -> (owner, handle) of every live loop of that model
LoopSource = Callable[[str], list[tuple[object, LoopHandleLike]]]


class ModelHold:
    """See the module docstring. Event-loop thread only; one hold per model at a time (the
    callers serialise them)."""

    def __init__(self, models: ServedModels, loops: LoopSource) -> None:
        self._models = models
        self._loops = loops

    async def hold(
        self,
        model_id: str,
        *,
        reason: str,
        retry_after_s: float,
        after_chunk: bool,
        timeout_s: float,
    ) -> list[HeldLoop]:
        """Close admission for ``model_id`` and hold its loops (module docstring)."""
        self._models.closed[model_id] = Reject(
            reason=reason, retry_after_s=retry_after_s, detail=f"model {model_id} {reason}"
        )
        start_s = time.perf_counter()
        live = [(owner, h) for owner, h in self._loops(model_id) if not h.done]
        paused = [bool(getattr(h, "paused", False)) for _, h in live]  # advance unpauses them
        futures = [
            h.at_boundary(_holder(h), after_chunk=after_chunk, advance=True) for _, h in live
        ]
        done, pending = (
            await asyncio.wait(futures, timeout=timeout_s) if futures else (set(), set())
        )
        held = [
            HeldLoop(owner, h, fut.result())
            for (owner, h), fut in zip(live, futures, strict=True)
            if fut in done and fut.exception() is None  # an ended loop is not held
        ]
        if pending:
            for (_, h), fut, was_paused in zip(live, futures, paused, strict=True):
                if fut in pending:
                    fut.cancel()  # a boundary call never run is skipped (BoundaryCall.run)
                    if was_paused:
                        h.pause()  # as it was before ``advance`` ran it
            self.release(model_id, held)
            raise HoldTimeout(
                f"model {model_id}: {len(pending)} of {len(live)} loops did not reach a "
                f"{'chunk ' if after_chunk else ''}boundary within {timeout_s:.1f} s"
            )
        log.info(
            "model %s: %d loops held for %s in %.3f s",
            model_id,
            len(held),
            reason,
            time.perf_counter() - start_s,
        )
        return held

    def release(self, model_id: str, held: list[HeldLoop], *, reopen: bool = True) -> None:
        """Lift every hold; with ``reopen``, admission too. Idempotent."""
        for loop in held:
            loop.handle.release()
        if reopen:
            self._models.closed.pop(model_id, None)


def _holder(handle: LoopHandleLike) -> Callable[[LoopState], int | None]:
    def hold(state: LoopState) -> int | None:
        handle.hold()
        return getattr(state, "next_chunk", getattr(state, "chunk", None))

    return hold


class ModelControl:
    """Base of the controls that stop a model through a ``ModelHold`` (weight sync, sleep):
    the served models, the hold, the lock they share (one at a time per server), how long a
    loop may take to reach its boundary and the ``Retry-After`` admission answers meanwhile."""

    retry_after_s = 2.0

    def __init__(
        self,
        models: ServedModels,
        hold: ModelHold,
        *,
        lock: asyncio.Lock,
        timeout_s: float = 30.0,
        retry_after_s: float | None = None,
    ) -> None:
        self._models = models
        self._hold = hold
        self.lock = lock
        self.timeout_s = timeout_s
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
