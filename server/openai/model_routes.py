"""``GET /v1/models`` and ``GET /v1/models/{id}``: the model cards in OpenAI's model shape.

    GET /v1/models       -> {"object": "list", "data": [model, ...]}  every card of this build
    GET /v1/models/{id}  -> model                                       404 for an unknown id

A model is ``{"id", "object": "model", "created", "owned_by": "dreamrt"}`` (what the official
client parses) followed by the card's public fields as before (family, capabilities,
default_profile, examples, controls, ...), ``served`` (this process serves it) and ``label``
(``"random weights"`` on cards that show noise). ``created`` is when this server process
started: a card has no creation date of its own. Errors answer in OpenAI's shape.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request

from server.api.deps import AuthGrant, ctx_of, require_general
from server.openai.errors import OpenAIError, OpenAIRoute
from server.openai.schemas import ModelList, ModelObject

__all__ = ["router"]

if TYPE_CHECKING:
    from models.card import ModelCard
    from sessions.served_models import ServedModel

router = APIRouter(prefix="/v1/models", route_class=OpenAIRoute)

_STARTED_AT = int(time.time())


def _model(card: ModelCard, served: Mapping[str, ServedModel]) -> dict[str, object]:
    # a served card as this process serves it (e.g. its chunk length in the latency mode)
    public = (served[card.model_id].card if card.model_id in served else card).to_public()
    entry = {"id": card.model_id, "object": "model", "created": _STARTED_AT, "owned_by": "dreamrt"}
    entry |= {k: v for k, v in public.items() if k != "id"}
    entry["served"] = card.model_id in served
    if card.weights.value == "random":
        entry["label"] = "random weights"
    return entry


@router.get("", response_model=ModelList, response_model_exclude_none=True)
async def list_models(request: Request, grant: AuthGrant) -> dict[str, object]:
    """Every card; ``served`` marks those this process serves, ``examples`` and ``controls``
    are what a page shows of a card (example prompts, the controls legend)."""
    require_general(grant)
    from models import registry

    served = ctx_of(request).host.models
    return {"object": "list", "data": [_model(c, served) for c in registry.list_cards()]}


@router.get("/{model_id}", response_model=ModelObject, response_model_exclude_none=True)
async def get_model(model_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
    require_general(grant)
    from models import registry

    served = ctx_of(request).host.models
    for card in registry.list_cards():
        if card.model_id == model_id:
            return _model(card, served)
    raise OpenAIError(404, f"no model {model_id!r}", param="model", code="model_not_found")
