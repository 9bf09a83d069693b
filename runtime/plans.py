"""Work plans and their results (part of the loop contract, ``runtime.contract``): what a loop
asks the runtime to run, the model-owned op that runs it, the scheduling class, and what
``ctx.execute`` resolves to. Imports neither torch nor asyncio.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from runtime.emissions import EmitSpec

__all__ = [
    "Followup",
    "PendingOutput",
    "PlanKind",
    "Priority",
    "StepOp",
    "StepResult",
    "TimedPendingOutput",
    "WorkPlan",
]


class PlanKind(str, enum.Enum):
    """What a WorkPlan does. Plans batch only with plans of the same kind."""

    TEXT_ENCODE = "text_encode"
    CHUNK_STEP = "chunk_step"
    KV_UPDATE = "kv_update"
    KV_RECACHE = "kv_recache"
    DIFFUSION_STEP = "diffusion_step"
    VAE_DECODE = "vae_decode"
    VAE_ENCODE = "vae_encode"
    AUDIO_FEATURES = "audio_features"
    HOST = "host"  # CPU-only bookkeeping that still must run off the event loop


class Priority(str, enum.Enum):
    """Scheduling class (docs/architecture.md §3)."""

    REALTIME = "realtime"  # a session with a viewer: deadlines from PTS, earliest-deadline first
    BATCH = "batch"  # jobs and idle sessions: run in slack, aged so they never starve


class StepOp(Protocol):
    """Model-owned executable body of a plan; runs on the executor thread.

    ``args`` holds one entry per plan in the batch (``len(args) == 1`` unless the op is
    ``batchable`` and the scheduler grouped compatible plans). Returns one output per entry,
    in the same order. Raising fails every plan in the batch; the engine then re-runs each plan
    alone so one bad plan fails only its own loop (failure isolation).
    ``deterministic=True`` asks for batch-invariant results: each output must be bit-identical
    to what the op returns for that entry alone.

    ``spmd`` says which ranks of an instance spread over a process group run it
    (``runtime.spmd``): ``"all"``, the value for most ops and the one for any op with
    collectives inside, or ``"leader"``, only rank 0 (no collectives; decode, text encode).
    """

    name: str
    batchable: bool
    spmd: str

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]: ...


@runtime_checkable
class PendingOutput(Protocol):
    """An op output still being produced asynchronously (see the module rules).

    ``ready()`` never blocks; ``result()`` blocks until the value exists and returns it (the
    runtime calls it off the event loop). An op returns one only when its consumers need the
    value later than its loop needs to go on, as frames for the encoder.
    """

    def ready(self) -> bool: ...

    def result(self) -> Any: ...


@runtime_checkable
class TimedPendingOutput(PendingOutput, Protocol):
    """A ``PendingOutput`` that knows how long its asynchronous work kept the device busy.

    ``device_s()`` is that time in seconds once ``ready()`` (``None`` before, or when it cannot
    tell). The ``Profiler`` adds it to the cost of the plan that returned it: work on a second
    stream is GPU time a session spends even though its plan returned at once.
    """

    def device_s(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Followup:
    """A plan still to come before this plan's media is due (for least-laxity deadlines)."""

    kind: PlanKind
    shape_sig: str
    flops: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkPlan:
    """One schedulable step: what to run, what it costs, what it may batch with.

    Batching key: ``(instance_id, kind, shape_sig, precision)`` and ``op.batchable``.
    ``flops`` feeds the analytic cost prior; measured times per ``shape_sig`` calibrate it.
    ``due_media_s`` is the media time (seconds from stream start) at which the output this plan
    contributes to must be on the wire; ``None`` for work without a deadline.
    ``followups`` lists the plans still needed after this one before that media is ready, so the
    runtime can subtract their predicted cost from the deadline. ``emits`` become stream items.
    ``inputs``: seqs of changing live inputs first reflected by this plan's chunk (an ``applied``
    emission acknowledges them); ``waiting_inputs``: such inputs waiting for its chunk to end.
    The runtime times them and runs those plans urgently (a viewer waits).
    """

    loop_id: str
    kind: PlanKind
    op: StepOp
    args: Any
    shape_sig: str
    instance_id: str = "default"
    precision: str = "fp32"
    flops: float = 0.0
    due_media_s: float | None = None
    followups: tuple[Followup, ...] = ()
    emits: tuple[EmitSpec, ...] = ()
    inputs: tuple[int, ...] = ()
    waiting_inputs: tuple[int, ...] = ()

    @property
    def batch_key(self) -> tuple[str, str, str, str]:
        return (self.instance_id, self.kind.value, self.shape_sig, self.precision)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What ``ctx.execute(plan)`` resolves to.

    ``output`` is this plan's entry of the op's return list. ``wall_s`` is the wall time of the
    batch it ran in, ``device_s`` the device-event time where measured (CUDA), else ``None``.
    ``kind`` is the kind of the plan that ran (the driver stamps it), so ``advance`` dispatches
    on what ran instead of re-deriving it from the state.
    """

    output: Any
    wall_s: float
    device_s: float | None = None
    batch_size: int = 1
    kind: PlanKind | None = None
