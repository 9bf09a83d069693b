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
``pts_90k`` ticks of a 90 kHz clock.

This module is the contract as models/ import it (their one module of the runtime): the names
are defined below it, each with its noun, and re-exported here: the live inputs
(``runtime.live_inputs``), emissions (``runtime.emissions``), plans and results
(``runtime.plans``), the loop, its state and context (``runtime.loop_protocol``), the PTS clock
(``runtime.media_clock``), the loop failures (``runtime.loop_failures``), the extension hook
points (``runtime.extensions``) and the error root (``runtime.errors``). The runtime's own modules
import those directly, the driver among them, so nothing below this module imports it. It imports
neither torch nor asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.emissions import (
    AppliedMeta,
    Emission,
    EmitSpec,
    InputTiming,
    MediaMeta,
    ProgressMeta,
    Stream,
)
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
from runtime.live_inputs import (
    ActionInput,
    AudioInput,
    InputEvent,
    InputKind,
    PromptInput,
    PromptMode,
)
from runtime.loop_failures import Cancelled, LoopFailed, PlanWithdrawn
from runtime.loop_protocol import (
    CacheKey,
    Done,
    Loop,
    LoopContext,
    LoopResult,
    LoopState,
    ModelState,
)
from runtime.media_clock import PTS_HZ, frame_of_pts, pts_of_frame
from runtime.plans import (
    Followup,
    PendingOutput,
    PlanKind,
    Priority,
    StepOp,
    StepResult,
    TimedPendingOutput,
    WorkPlan,
)

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


# The driver, for model-side tools that run a loop alone on the calling thread (evaluation,
# distillation): models/ imports only this module, and iteration lives only in the driver.
# Loaded on first use, since the driver needs asyncio and the snapshot codec, which this module
# must not import (it is pure). The edge runs one way: the driver imports the modules above, not
# this one.
if TYPE_CHECKING:
    from runtime.driver import Driver, InlineContext

__all__ += ["Driver", "InlineContext"]


def __getattr__(name: str) -> object:
    if name in ("Driver", "InlineContext"):
        from runtime import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
