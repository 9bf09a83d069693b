"""The driven loop itself (part of the loop contract, ``runtime.contract``, whose docstring gives
the rules): its serializable state, the model it runs on, the context the runtime hands it, and
the ``Loop`` protocol. ``runtime.driver`` iterates it; ``runtime.snapshot`` encodes its state.
Imports neither torch nor asyncio.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import msgspec

from runtime.emissions import Emission
from runtime.live_inputs import InputEvent
from runtime.plans import Priority, StepResult, WorkPlan

__all__ = [
    "CacheKey",
    "Done",
    "Loop",
    "LoopContext",
    "LoopResult",
    "LoopState",
    "ModelState",
]


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


@dataclass(frozen=True, slots=True)
class LoopResult:
    """What ``finalize`` returns: named outputs (artifacts, final latents, counters)."""

    outputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Done:
    """Returned by ``next`` when the loop has no more work."""

    reason: str = "complete"


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
