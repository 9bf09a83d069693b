"""The served models as the session and job hosts see them, and what the hosts refuse with.

The composition root (``server.app``) loads the models and hands them to both hosts as a
``ServedModels`` (id -> model, and the default), so the hosts import no model code: a served
model is anything with the ``ServedModel`` methods (``models.instance.WanInstance`` and the
tiny-world instance have them).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from models.card import ModelCard, Profile
from runtime.admission import AdmissionController, Reject
from runtime.contract import Emission, Loop, LoopState, Priority
from runtime.cost import CostModel
from runtime.errors import DreamrtError
from sessions.loop_handle import LoopHandleLike

__all__ = [
    "SESSION_LOOP",
    "EngineLike",
    "HostError",
    "ModelAdapters",
    "ModelUnavailableError",
    "ModelWeights",
    "ServedModel",
    "ServedModels",
    "UnsupportedTaskError",
    "new_id",
    "record_template",
    "session_decoder",
]

SESSION_LOOP = "chunk_rollout"  # the loop of a realtime session


class HostError(RuntimeError):
    """A host is closed, or an id is already in use."""


class UnsupportedTaskError(DreamrtError, ValueError):
    """The model card cannot serve this request (capability or recipe); ``field`` names the
    request field at fault (a 422)."""

    code = "invalid_field"
    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ModelWeights(Protocol):
    """A served model's resident weights as the trainer controls use them
    (``models.resident_weights.ResidentWeights``): updates, sleep and wake."""

    @property
    def asleep(self) -> Mapping[str, Any]: ...  # component -> its host copies

    @property
    def version(self) -> str: ...

    def prepare(self, source: Any, *, mode: Any = ...) -> Any: ...

    def apply(self, update: Any) -> str: ...

    def sleep(self, components: Iterable[str]) -> int: ...

    def wake(self, components: Iterable[str]) -> float: ...

    def check(self, components: Iterable[str]) -> list[str]: ...


class ModelAdapters(Protocol):
    """A served model's LoRA adapters as the session host checks a request's (``models.lora``)."""

    def check(self, requested: Sequence[tuple[str, float]]) -> None: ...


class ServedModel(Protocol):
    """A loaded model as the hosts need it (``models.instance.WanInstance`` satisfies it)."""

    card: ModelCard
    # the content hash of the loaded weights (``""``: not computed; records then name the
    # card's ``weights_version``)
    weights_digest: str

    @property
    def weights(self) -> ModelWeights: ...

    @property
    def adapters(self) -> ModelAdapters: ...

    def loop(self, loop_id: str) -> Loop[Any]: ...

    def group_loop(self, capability: str) -> Loop[Any]:
        """``capability``'s loop for a rollout group's samples (their steps batch together)."""
        ...

    def kv_slab_bytes(self, profile: Profile) -> int: ...

    def slab_geometry(self, profile: Profile) -> Any: ...

    def reserve_kv_slabs(self, profile: Profile, num_slabs: int) -> Any: ...

    def peak_bytes(self, profile: Profile) -> int: ...

    def chunk_flops(self, profile: Profile, decoder: str | None = None) -> float: ...

    def steady_chunk_plans(
        self, profile: Profile, decoder: str | None = None
    ) -> tuple[tuple[str, str, int], ...]: ...

    def resolve_decoder(self, decoder: str | None) -> str: ...

    def chunk_seconds(self, profile: Profile) -> float: ...

    def program_loop(self, program: Any) -> Loop[Any]: ...


class EngineLike(Protocol):
    """What the hosts use of ``runtime.engine.Engine``."""

    admission: AdmissionController | None
    cost: CostModel

    def spawn(
        self,
        loop: Loop[Any],
        request: object,
        model: Any,
        *,
        loop_id: str,
        priority: Priority,
        on_emit: Callable[[Emission], None],
        media_t0_s: float | None = None,
        reservation_id: str | None = None,
        restore_from: bytes | None = None,
        state_type: type[LoopState] | None = None,
        fork_from: LoopState | None = None,
    ) -> LoopHandleLike: ...


class ModelUnavailableError(DreamrtError, HostError):
    """The model takes no new work for now (a weight sync, a sleeping component): retry after
    ``retry_after_s`` seconds (a 503 + ``Retry-After``)."""

    code = "unavailable"
    status = 503

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServedModels(Mapping[str, ServedModel]):
    """The models of one server by id, and the one a request without ``model`` gets.

    ``closed`` holds the models that admit nothing new for now, with the ``Reject`` the hosts
    answer (``sessions.model_hold``: a weight sync, a sleeping component)."""

    def __init__(self, models: Mapping[str, ServedModel], default: str) -> None:
        if default not in models:
            raise HostError(f"default model {default!r} is not among the served {sorted(models)}")
        self._models = dict(models)
        self.default = default
        self.closed: dict[str, Reject] = {}

    def check_open(self, model_id: str) -> None:
        """Raises ``ModelUnavailableError`` while ``model_id`` admits nothing new."""
        closed = self.closed.get(model_id)
        if closed is not None:
            raise ModelUnavailableError(
                f"model {model_id!r}: {closed.reason} ({closed.detail})", closed.retry_after_s
            )

    def __getitem__(self, model_id: str) -> ServedModel:
        return self._models[model_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def resolve(self, model_id: str | None) -> ServedModel:
        """The served model ``model_id`` (the default when None); ``KeyError`` names the served
        ids."""
        key = model_id or self.default
        if key not in self._models:
            raise KeyError(f"model {key!r} is not served here; served: {sorted(self._models)}")
        return self._models[key]


def new_id(prefix: str) -> str:
    """A fresh session or job id: ``<prefix>_`` and 64 random bits in hex."""
    return f"{prefix}_{secrets.token_hex(8)}"


def session_decoder(served: ServedModel, decoder: str | None) -> str:
    """A session's decoder: ``decoder`` if ``served`` serves it (None: its default);
    ``UnsupportedTaskError`` on field ``decoder`` otherwise."""
    resolve = getattr(served, "resolve_decoder", None)
    if resolve is None:  # a model with one codec and no decoder options
        if decoder not in (None, "full"):
            raise UnsupportedTaskError(
                "decoder", f"decoder {decoder!r}: model {served.card.model_id!r} has one"
            )
        return "full"
    try:
        return str(resolve(decoder))
    except ValueError as exc:
        raise UnsupportedTaskError("decoder", str(exc)) from None


def record_template(served: ServedModel, profile: Profile) -> dict[str, Any]:
    """The static facts of a stream's behaviour records (sessions, rollout samples)."""
    card = served.card
    spec = card.loops.get(SESSION_LOOP)
    schedule = spec.schedule if spec is not None else None
    return {
        # the content hash of the loaded weights; the card's version is its label
        "weights_version": served.weights_digest or card.weights_version,
        "weights_label": card.weights_version,
        "recipe_id": card.recipe.method,
        "fps": profile.fps,
        "width": profile.width,
        "height": profile.height,
        "loop_id": SESSION_LOOP,
        "sampler": spec.describe() if spec is not None else "",
        "steps": schedule.steps if schedule is not None else profile.steps,
        "timesteps": list(schedule.timesteps) if schedule is not None else [],
        "precision": str(getattr(served, "precision", card.recipe.assumes_precision)),
        "attention": str(getattr(served, "levers", {}).get("attention", "")),
    }
