"""Deliberate fault injection: an observer that makes one loop's next step fail.

An operations and test hook, never on by default: the composition root installs it only when
``dreamrt serve --fault-injection`` is given (the admin route ``POST /v1/faults`` then arms
it), so a production engine runs no code of it at all. It exists to prove failure isolation
(docs/architecture.md §3) on a real server: the armed loop fails with a structured error, its
slab and reservation are returned, every other loop keeps running.

``arm(loop_id, kind)`` targets the next denoising step (``chunk_step`` or
``diffusion_step``) executed for ``loop_id``:

- ``"nan"``: the step's output latents are filled with NaN, in place, after the op returned.
  Installed before ``NaNWatch``, so the fault travels the real detection path (the watch
  flags it, the executor re-runs the batch plan by plan, the plan fails ``nan``). Only a
  denoising step's output is touched: it is a fresh tensor of that one plan, never a cache
  another loop could read (a text embedding, for instance, is shared through the encoder's
  cache).
- ``"exception"``: the plan is reported failed with code ``step_exception``, as an op that
  raised is.
- ``"oom"``: reported failed with code ``oom`` and torch's out-of-memory message, as the
  executor reports a real ``torch.cuda.OutOfMemoryError`` (on the CPU nothing runs out).

A fault stays on its plan through the executor's solo re-run (a batched plan is retried alone
and fails again), so the loop fails whether or not it was batched. Runs on the executor thread;
``arm`` is called from the event loop (a lock guards the table).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal

from runtime.observers import BatchInfo, Observation, PlanFault

__all__ = ["FAULT_KINDS", "FaultInjector"]

FaultKind = Literal["nan", "exception", "oom"]
FAULT_KINDS: tuple[str, ...] = ("nan", "exception", "oom")
_STEP_KINDS = frozenset({"chunk_step", "diffusion_step"})
_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (injected by dreamrt's fault injection)"
)


class FaultInjector:
    """See the module docstring. ``injected`` counts plans it made fail (any kind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, str] = {}  # loop id -> kind, until its next step runs
        self._targets: dict[int, str] = {}  # plan id -> kind (kept for its solo re-run)
        self.injected = 0

    def arm(self, loop_id: str, kind: str) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        with self._lock:
            self._armed[loop_id] = kind

    def armed(self) -> dict[str, str]:
        with self._lock:
            return dict(self._armed)

    def before_batch(self, info: BatchInfo) -> None:
        return None

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[object], wall_s: float
    ) -> Observation | None:
        if info.kind not in _STEP_KINDS:
            return None
        faults = []
        with self._lock:
            for index, (plan_id, loop_id) in enumerate(zip(info.plan_ids, info.loop_ids)):
                kind = self._targets.get(plan_id)
                if kind is None and loop_id in self._armed:
                    kind = self._targets[plan_id] = self._armed.pop(loop_id)
                    self.injected += 1
                if kind is None:
                    continue
                if kind == "nan":
                    _poison(outputs[index])
                elif kind == "oom":
                    faults.append(PlanFault(index, "oom", f"{info.op_name}: {_OOM_MESSAGE}"))
                else:
                    faults.append(
                        PlanFault(index, "step_exception", f"{info.op_name} raised InjectedFault")
                    )
            if len(self._targets) > 1024:  # plans long finished; keep the table small
                for plan_id in sorted(self._targets)[:-256]:
                    del self._targets[plan_id]
        return Observation(faults=tuple(faults)) if faults else None


def _poison(output: object) -> None:
    """Fills the floating tensors of a denoising step's output with NaN, in place."""
    import torch

    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            with torch.inference_mode():  # ops run in inference mode: so are their outputs
                output.fill_(float("nan"))
    elif isinstance(output, (list, tuple)):
        for item in output:
            _poison(item)
    elif isinstance(output, dict):
        for item in output.values():
            _poison(item)
