"""The driven-loop contract (docs/architecture.md §2): the one seam between models/ and runtime/.

A *loop* is a serializable state machine that the runtime drives::

    state = loop.init(request, model, ctx)
    while True:
        if inputs := ctx.take_inputs():         # prompts/actions/audio that arrived meanwhile
            state = loop.absorb(state, inputs)  # the loop latches them where its semantics say
        if isinstance(plan := loop.next(state), Done):
            break
        result = await ctx.execute(plan)        # runtime admits, batches, places, runs
        state = loop.advance(state, result)
        for spec in plan.emits: ctx.emit(Emission(spec, result.output))
    return loop.finalize(state)

Rules every loop obeys:

- ``next`` describes the next step and runs no kernels; it may read everything in ``state``,
  including what ``advance`` folded in from the previous result (content-adaptive control flow).
- ``advance`` folds a result into the state and returns the new state. It may do cheap tensor
  bookkeeping (indexing, views) but heavy tensor work belongs in a ``StepOp``.
- All per-request state lives in the loop's ``LoopState`` (a ``msgspec.Struct``; tensor fields are
  annotated ``torch.Tensor``). No module globals, no per-request attributes on ``nn.Module``s.
  The runtime can therefore snapshot a state at any step boundary and resume it elsewhere.
- Live inputs (prompt, action, audio, cut) reach a loop only through ``absorb`` at a step
  boundary, as serializable ``InputEvent``s; the loop decides when they take effect (e.g. at the
  next chunk) and acknowledges that with an ``EmitSpec(stream="applied", ...)`` on a plan.
- A ``StepOp`` runs on the runtime's single executor thread, never on the asyncio loop. It gets
  one argument object per plan in the batch and returns one output per plan, in order.
- An output may be a ``PendingOutput``: work the op left running on the device (e.g. a decode on
  a second CUDA stream) so the loop's next plans start at once. ``advance`` may keep it but
  must not read it; the plan's emissions reach the sink with ``result()``, in plan order.

Units are in the names: ``*_s`` seconds, ``*_bytes`` bytes, ``flops`` floating-point operations,
``pts_90k`` ticks of a 90 kHz clock. This module imports neither torch nor asyncio.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import msgspec

from runtime.errors import DreamrtError  # the root of client-facing errors, every layer's
from runtime.extensions import (  # hook points of the extensions (models implement them)
    BlockInterceptor,
    BlockObserver,
    ExtensionRejected,
    ExtensionSpec,
    HookPoint,
    ScheduleFacts,
    StepInterceptor,
    preflight,
)
from runtime.loop_failures import Cancelled, LoopFailed, PlanWithdrawn
from runtime.media_clock import PTS_HZ, frame_of_pts, pts_of_frame

__all__ = [
    "PTS_HZ",
    "ActionInput",
    "AppliedMeta",
    "AudioInput",
    "BlockInterceptor",
    "BlockObserver",
    "CacheKey",
    "Cancelled",
    "Done",
    "DreamrtError",
    "Emission",
    "EmitSpec",
    "ExtensionRejected",
    "ExtensionSpec",
    "Followup",
    "HookPoint",
    "InputEvent",
    "InputKind",
    "InputTiming",
    "Loop",
    "LoopContext",
    "LoopFailed",
    "LoopResult",
    "LoopState",
    "MediaMeta",
    "ModelState",
    "PendingOutput",
    "PlanKind",
    "PlanWithdrawn",
    "Priority",
    "ProgressMeta",
    "ScheduleFacts",
    "StepInterceptor",
    "PromptInput",
    "PromptMode",
    "StepOp",
    "StepResult",
    "Stream",
    "TimedPendingOutput",
    "WorkPlan",
    "frame_of_pts",
    "preflight",
    "pts_of_frame",
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


class InputKind(str, enum.Enum):
    """Live inputs a loop may absorb."""

    PROMPT = "prompt"
    ACTION = "action"
    AUDIO = "audio"


class PromptMode(str, enum.Enum):
    """How a new prompt takes over (the one name for it, from the API to the loop)."""

    # Either may restart the chunk in flight when the loop's restart policy says so; else:
    SWITCH = "switch"  # at the next chunk boundary; the cached frames are re-cached under it
    CUT = "cut"  # a new segment from the next chunk (no re-cache)


# --------------------------------------------------------------------------------------------
# Loop state


class LoopState(msgspec.Struct, kw_only=True):
    """Base class of every loop's state.

    Subclasses add typed fields; tensor-valued fields are annotated ``torch.Tensor`` (or
    ``dict[str, torch.Tensor]``). ``step`` counts completed plans and is maintained by the loop.
    A state must round-trip through ``runtime.driver.snapshot_state``/``restore_state``
    bit-identically; nothing else (no callables, no open handles) may live in it.
    ``plugin_state``: each active interceptor's state by extension name (``runtime.extensions``).
    """

    step: int = 0
    plugin_state: dict[str, Any] = {}


S = TypeVar("S", bound=LoopState)


class ModelState(Protocol):
    """A resident, loaded model instance as a loop sees it.

    ``components`` maps component ids (``"dit"``, ``"vae"``, ``"text_encoder"`` …) to loaded
    modules. ``device``/``dtype`` are what its weights live on. The instance holds weights and
    preallocated pools only; it holds no per-request state.
    """

    instance_id: str
    components: Mapping[str, Any]
    device: Any
    dtype: Any


@dataclass(frozen=True, slots=True)
class CacheKey:
    """Identifies a cached artifact; every field that can change the cached value is in the key.

    Wrong reuse is worse than no reuse (docs/architecture.md §4): when in doubt, add a field.
    ``input_hash`` is a content hash of the inputs (e.g. sha256 of the prompt text).
    """

    model_id: str
    component: str
    weights_version: str
    precision: str
    shape_sig: str
    input_hash: str


# --------------------------------------------------------------------------------------------
# Plans and results


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


class Stream(str, enum.Enum):
    """The sinks a loop emits to (``EmitSpec.stream``)."""

    MEDIA = "media"  # output: uint8 [n, H, W, 3] RGB frames (or a PendingOutput of them)
    APPLIED = "applied"  # output: None; an input took effect
    PROGRESS = "progress"  # output: None; jobs' plan count


class MediaMeta(msgspec.Struct, frozen=True, kw_only=True):
    """What a loop knows of frames it emits on ``Stream.MEDIA``.

    ``frame_start`` is the stream index of the first frame (from 0), so every frame's PTS is
    ``pts_of_frame(frame_start + i, fps)``; ``pts_90k`` is the first frame's. A chunk may come in
    parts: ``final`` is False on every part but its last.
    """

    chunk: int
    segment: int
    frame_start: int
    pts_90k: int
    num_frames: int
    fps: int
    final: bool = True
    # Behaviour facts of the chunk the loop captured when it described the plan (seeds, noise
    # schedule, conditioning digests...): opaque to the runtime, set on a chunk's final part.
    capture: dict[str, Any] | None = None


class AppliedMeta(msgspec.Struct, frozen=True, kw_only=True):
    """An input (session sequence number ``seq``) first reflected by chunk ``chunk`` whose first
    frame has PTS ``pts_90k``. Emitted on ``Stream.APPLIED`` beside that chunk's first media.
    ``changes``: False when it repeats what the chunk in flight had (a held key sent again); a
    sink shows a changing input's frames at once, a repeat's in playout order."""

    kind: InputKind
    seq: int
    chunk: int
    pts_90k: int
    changes: bool = True


class ProgressMeta(msgspec.Struct, frozen=True, kw_only=True):
    """A job's progress on ``Stream.PROGRESS``: ``done`` of ``total`` plans."""

    done: int
    total: int


@dataclass(frozen=True, slots=True)
class EmitSpec:
    """Declares that a plan's output becomes a stream item once the plan has run.

    ``stream`` names the sink (a ``Stream`` for the model loops; toy and custom loops may use
    any string); ``meta`` is what the loop knew at plan time: a ``MediaMeta`` /
    ``AppliedMeta`` / ``ProgressMeta`` on the standard streams, any plain value otherwise.
    The driver pairs it with the plan's output.
    """

    stream: str
    meta: Any = None


@dataclass(frozen=True, slots=True)
class InputTiming:
    """Seconds after its push, per runtime stage (``runtime.input_trace``; ``None``: not seen)."""

    seq: int
    latched_s: float | None
    started_s: float | None
    generated_s: float | None
    decoded_s: float | None


@dataclass(frozen=True, slots=True)
class Emission:
    """What ``LoopContext.emit`` receives: an EmitSpec plus the output it refers to (and, on an
    ``applied`` emission the engine delivers, the input's runtime stages)."""

    spec: EmitSpec
    output: Any
    timing: InputTiming | None = None


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


@dataclass(frozen=True, slots=True)
class LoopResult:
    """What ``finalize`` returns: named outputs (artifacts, final latents, counters)."""

    outputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Done:
    """Returned by ``next`` when the loop has no more work."""

    reason: str = "complete"


class PromptInput(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    mode: PromptMode = PromptMode.SWITCH


class ActionInput(msgspec.Struct, frozen=True, kw_only=True):
    keys: tuple[str, ...] = ()
    mouse: tuple[float, float] = (0.0, 0.0)  # (dx, dy) pixels since the last action


class AudioInput(msgspec.Struct, frozen=True, kw_only=True):
    """``samples``: float32 ndarray [n], 16 kHz mono in [-1, 1] (passed as is, never listed)."""

    samples: Any


@dataclass(frozen=True, slots=True)
class InputEvent:
    """A live input for a running loop, delivered through ``Loop.absorb`` at a step boundary.

    ``kind`` says which payload struct ``payload`` is (``PromptInput``, ``ActionInput``,
    ``AudioInput``); ``seq`` is the session's input sequence number (echoed in the
    ``AppliedMeta`` acknowledgement); ``received_s`` is the wall time it arrived.
    """

    kind: InputKind
    seq: int
    payload: PromptInput | ActionInput | AudioInput
    received_s: float = 0.0


# --------------------------------------------------------------------------------------------
# Context and loop protocols


class LoopContext(Protocol):
    """What the runtime hands a loop and its driver.

    ``execute`` resolves with the plan's StepResult, or raises ``Cancelled`` / ``LoopFailed``
    (or ``PlanWithdrawn``: the plan did not run; the driver describes the next one again).
    ``emit`` delivers an emission to the loop's sinks without blocking.
    ``take_inputs`` returns (and clears) the inputs that arrived since the last call, in order.
    """

    loop_id: str
    priority: Priority

    def execute(self, plan: WorkPlan) -> Awaitable[StepResult]: ...

    def emit(self, emission: Emission) -> None: ...

    def take_inputs(self) -> list[InputEvent]: ...


@runtime_checkable
class Loop(Protocol, Generic[S]):
    """A model-owned, runtime-driven state machine (see module docstring)."""

    name: str

    def init(self, request: Any, model: ModelState, ctx: LoopContext) -> S: ...

    def next(self, state: S) -> WorkPlan | Done: ...

    def advance(self, state: S, result: StepResult) -> S: ...

    def finalize(self, state: S) -> LoopResult: ...

    def absorb(self, state: S, inputs: Sequence[InputEvent]) -> S:
        """Fold live inputs into the state. Loops without live inputs return ``state`` as is
        (or raise ``ValueError`` naming an input kind they do not accept)."""
        ...


EmitFn = Callable[[Emission], None]


# The driver, for model-side tools that run a loop alone on the calling thread (evaluation,
# distillation): models/ imports only this module, and iteration lives only in the driver.
# Loaded on first use, since the driver needs asyncio and the snapshot codec, which this module
# must not import (it is pure, and runtime/driver.py imports it).
if TYPE_CHECKING:
    from runtime.driver import Driver, InlineContext

__all__ += ["Driver", "InlineContext"]


def __getattr__(name: str) -> Any:
    if name in ("Driver", "InlineContext"):
        from runtime import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
