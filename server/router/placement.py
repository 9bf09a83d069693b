"""Where the fleet router places a session or job: a policy over the engines' DeploymentCards.

Capacity is a value: ``rank`` returns the engines that can take the request, best first (an
empty list means "no room": the router answers 503 + ``Retry-After``). The cards are the only
input, so the policy is pure data in, data out and needs no model, no runtime and no state.

``HeadroomPlacement`` (the default) keeps engines that are healthy, serve the requested model
(or, without one, their default) with the capability the request needs (``session.realtime``
for a session; ``text_to_video`` / ``text_to_image`` for a job, ``text_to_video`` for an
OpenAI-API video), and — for a session — have a
free chunk-KV slab and compute headroom for one more session of that model (``session_share``,
in GPU-s per media second, the unit of the engines' admission). Sessions go to the most
headroom left after placing; a ``batch``-class session is ranked the same way (it still holds
a slab). Jobs are never refused by an engine (they queue and run in slack), so they go to the
engine with the fewest jobs waiting, then the most headroom.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Candidate", "HeadroomPlacement", "PlacementRequest"]

_TASK_CAPABILITY = {"t2v": "text_to_video", "t2i": "text_to_image"}


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What placement needs of a request: its kind, model (None: an engine's default),
    class, and a job's task."""

    kind: str  # "session" | "job" | "video" (a t2v job, from POST /v1/videos)
    model: str | None = None
    priority_class: str = "realtime"
    task: str | None = None

    @classmethod
    def of(cls, kind: str, body: Mapping[str, Any]) -> PlacementRequest:
        return cls(
            kind=kind,
            model=body.get("model"),
            priority_class=str(body.get("class", "realtime")),
            task=body.get("task", "t2v" if kind == "video" else None),
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """An engine that can take the request, and the headroom it keeps after taking it."""

    instance_id: int
    engine_id: str
    url: str
    headroom_after: float


class HeadroomPlacement:
    """See the module docstring."""

    name = "headroom"

    def rank(
        self, cards: Mapping[int, Mapping[str, Any]], request: PlacementRequest
    ) -> list[Candidate]:
        out: list[tuple[tuple[float, ...], Candidate]] = []
        for instance_id, card in cards.items():
            if card.get("health") != "ok":
                continue
            model = _model(card.get("models", ()), request.model)
            if model is None or _capability(request) not in model.get("capabilities", ()):
                continue
            load = card.get("load", {})
            headroom = float(load.get("headroom", 0.0))
            if request.kind == "session":
                share = float(model.get("session_share") or 0.0)
                if load.get("kv_slabs_free", 0) < 1 or share > headroom + 1e-12:
                    continue
                after = headroom - share
                key: tuple[float, ...] = (-after,)
            else:
                after = headroom
                key = (float(load.get("jobs_queued", 0)), -headroom)
            candidate = Candidate(instance_id, str(card["engine_id"]), str(card["url"]), after)
            out.append((key + (float(instance_id),), candidate))
        return [c for _, c in sorted(out, key=lambda kv: kv[0])]


def _model(models: Sequence[Mapping[str, Any]], wanted: str | None) -> Mapping[str, Any] | None:
    for model in models:
        if (wanted is None and model.get("default")) or model.get("id") == wanted:
            return model
    return None


def _capability(request: PlacementRequest) -> str:
    if request.kind == "session":
        return "session.realtime"
    return _TASK_CAPABILITY.get(request.task or "", "")
