"""Extensions: observers and interceptors as declared, versioned hook points.

An *extension* is enabled at deploy scope (``dreamrt serve --extension NAME[:k=v,...]``, its
parameters the deploy defaults); a request may only parameterize extensions that are enabled,
through the extension's own ``msgspec`` schema (``ExtensionSpec.params``). Two families:

- observers (read-only): ``runtime.observers`` (Profiler, NaNWatch) and ``runtime.traces``
  (ActivationTrace, ParityAligner) - they see batches and block activations, never change them;
- interceptors (compute-altering), at two hook points: ``HookPoint.STEP`` (a
  ``StepInterceptor`` may skip a denoising step's transformer work or reuse a cached
  prediction) and ``HookPoint.BLOCK`` (a ``BlockInterceptor`` may reuse a block's residual).

Interceptor state lives in ``LoopState.plugin_state[name]`` (per session, per CFG branch),
so it is snapshotted with the loop and two interleaved sessions can never share it; the
interceptor objects themselves are stateless policies. The model family implements the hook
points (``models/``); this module only declares them and runs the pre-flight rules
(``preflight``) that a loop calls *before* it starts: unknown or not-enabled extensions,
invalid parameters, two interceptors that alter the same thing (``claims``), a step-reusing
interceptor on a card whose schedule does not allow skipping (or has fewer steps than it
needs), and distribution-altering parameters on an exact-mode request are each an
``ExtensionRejected`` naming both sides. Imports neither torch nor asyncio.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

if TYPE_CHECKING:
    import torch

__all__ = [
    "BlockInterceptor",
    "BlockObserver",
    "ExtensionRejected",
    "ExtensionSpec",
    "HookPoint",
    "ScheduleFacts",
    "StepInterceptor",
    "parse_extension_arg",
    "preflight",
]


class HookPoint(str, enum.Enum):
    """Where an interceptor acts in a denoising step."""

    STEP = "step"  # before the transformer stack: reuse the step's cached prediction
    BLOCK = "block"  # inside the stack: reuse the residual of the blocks after a probe


class ExtensionRejected(ValueError):
    """A request (or a deploy flag) the extension rules refuse; the message names both sides."""


@dataclass(frozen=True, slots=True)
class ExtensionSpec:
    """What an extension declares about itself (the pre-flight rules read only this).

    ``params``: the msgspec Struct of its parameters (deploy defaults and request overrides
    are converted through it; unknown fields are errors). ``claims``: what it alters; two
    active interceptors with the same claim conflict. ``reuses_steps``: it carries work from
    one denoising step to another (refused where the schedule forbids step skipping);
    ``min_steps``: the fewest schedule steps it is meant for. ``loops``: the loops it hooks.
    """

    name: str
    version: int
    hook: HookPoint
    params: type[msgspec.Struct]
    claims: str
    loops: tuple[str, ...]
    reuses_steps: bool = False
    min_steps: int = 0

    def enabled(self, params: msgspec.Struct) -> bool:
        return bool(getattr(params, "enabled", True))

    def altering(self, params: msgspec.Struct) -> list[str]:
        """The parameters (``name.field=value``) that move outputs off the exact result; a
        params struct declares them with ``altering_fields()``."""
        fields = getattr(params, "altering_fields", None)
        return [f"{self.name}.{field}" for field in (fields() if fields else ())]


@dataclass(frozen=True, slots=True)
class ScheduleFacts:
    """What a card's schedule says to the pre-flight rules."""

    model_id: str
    loop: str
    steps: int
    step_skipping: bool  # the card allows step-reusing interceptors


class StepInterceptor(Protocol):
    """Decides once per denoising step, before any block runs (``probe_blocks == 0``), whether
    the step's transformer work is replaced by the prediction cached in its state.

    Per CFG branch: ``distance`` says how far the branch's ``probe`` moved since what its
    ``cache`` (the branch's ``plugin_state`` entry, as the model holds it) remembers - None:
    nothing to reuse, compute; ``wants`` whether that is close enough; the branches of one
    batch reuse only if all want to, and ``record`` then keeps what the next step compares
    against. No state on the object: the same one serves every loop."""

    spec: ExtensionSpec
    probe_blocks: int

    def distance(self, cache: Any, probe: torch.Tensor, step: int, steps: int) -> float | None: ...

    def wants(self, cache: Any, distance: float | None) -> bool: ...

    def record(
        self, cache: Any, probe: torch.Tensor, distance: float | None, reused: bool
    ) -> None: ...


class BlockInterceptor(StepInterceptor, Protocol):
    """The same decisions after the first ``probe_blocks >= 1`` blocks ran: the remaining
    blocks are replaced by their residual cached in the branch's state."""


class BlockObserver(Protocol):
    """Sees every block's output of a hooked forward (read-only; runs on the executor thread).
    ``key``: (loop_id, step, branch); ``hidden``: the block's output tensor."""

    def on_block(self, key: tuple[str, int, str], block: int, hidden: torch.Tensor) -> None: ...


def parse_extension_arg(arg: str) -> tuple[str, dict[str, object]]:
    """``NAME`` or ``NAME:k=v,k=v`` (a CLI flag) -> (name, raw params); values are JSON
    scalars where they parse as one (``0.05``, ``true``), else strings."""
    name, _, rest = arg.partition(":")
    name = name.strip()
    if not name:
        raise ExtensionRejected(f"--extension {arg!r}: no extension name")
    params: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ExtensionRejected(f"--extension {arg!r}: {item!r} is not key=value")
        try:
            params[key.strip()] = msgspec.json.decode(value.strip())
        except msgspec.DecodeError:
            params[key.strip()] = value.strip()
    return name, params


def convert_params(spec: ExtensionSpec, raw: Mapping[str, object], where: str) -> msgspec.Struct:
    try:
        return msgspec.convert(dict(raw), spec.params)
    except msgspec.ValidationError as exc:
        raise ExtensionRejected(f"{where} extension {spec.name!r}: {exc}") from None


def preflight(
    specs: Mapping[str, ExtensionSpec],
    deployed: Mapping[str, msgspec.Struct],
    requested: Mapping[str, Mapping[str, object]],
    facts: ScheduleFacts,
    *,
    exact: bool = False,
) -> dict[str, msgspec.Struct]:
    """The active extensions of one request, name -> validated params, or ``ExtensionRejected``.

    ``deployed``: the enabled extensions with their deploy defaults; ``requested``: the
    request's overrides (only of enabled ones). An enabled extension that does not hook
    ``facts.loop`` is inactive unless the request names it (then it is an error)."""
    for name in requested:
        if name not in deployed:
            raise ExtensionRejected(
                f"extension {name!r} is not enabled on this server "
                f"(enabled: {sorted(deployed) or 'none'}; dreamrt serve --extension NAME)"
            )
    active: dict[str, msgspec.Struct] = {}
    for name, defaults in deployed.items():
        spec = specs[name]
        params = defaults
        if name in requested:
            merged = {**msgspec.structs.asdict(defaults), **requested[name]}
            params = convert_params(spec, merged, "request")
        if facts.loop not in spec.loops:
            if name in requested:
                raise ExtensionRejected(
                    f"extension {name!r} hooks {list(spec.loops)}, not {facts.loop!r} "
                    f"(model {facts.model_id!r})"
                )
            continue
        if spec.enabled(params):
            active[name] = params
    _check_rules(specs, active, facts, exact)
    return active


def _check_rules(
    specs: Mapping[str, ExtensionSpec],
    active: Mapping[str, msgspec.Struct],
    facts: ScheduleFacts,
    exact: bool,
) -> None:
    names: Sequence[str] = sorted(active)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if specs[a].claims == specs[b].claims:
                raise ExtensionRejected(
                    f"extension {a!r} conflicts with {b!r}: both alter {specs[a].claims} "
                    "(enable one per request)"
                )
    for name in names:
        spec = specs[name]
        if spec.reuses_steps and not facts.step_skipping:
            raise ExtensionRejected(
                f"extension {name!r} reuses work across steps, but model {facts.model_id!r} "
                f"({facts.steps}-step schedule) does not allow step skipping"
            )
        if facts.steps < spec.min_steps:
            raise ExtensionRejected(
                f"extension {name!r} needs >= {spec.min_steps} steps; model "
                f"{facts.model_id!r} samples with {facts.steps}"
            )
        altering = spec.altering(active[name])
        if exact and altering:
            raise ExtensionRejected(
                f"an exact request refuses {', '.join(altering)} of extension {name!r} "
                "(it alters the output distribution)"
            )
