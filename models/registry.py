"""The card registry: which models this build can serve, looked up by id.

Import-light on purpose (no torch): ``dreamrt models``, ``GET /v1/models`` and admission read
cards without loading a model. ``builtin_registry()`` returns a fresh registry holding every
family's cards, so no process-wide mutable registry exists; a composition root that wants more
cards builds its own ``CardRegistry`` (or registers into the one it got).
"""

from __future__ import annotations

from collections.abc import Iterable

from models.card import CardError, ModelCard
from models.tinyworld import card as tinyworld_card
from models.wan import card as wan_card

__all__ = ["CardRegistry", "UnknownModelError", "builtin_registry", "get", "list_cards"]

# Every family contributes its cards here: one ``cards()`` per family module.
_FAMILY_CARDS = (wan_card.cards, tinyworld_card.cards)


class UnknownModelError(LookupError):
    """No card has the requested id; ``known`` lists the ids that exist."""

    def __init__(self, model_id: str, known: Iterable[str]) -> None:
        self.model_id = model_id
        self.known = tuple(sorted(known))
        super().__init__(f"unknown model {model_id!r}; known models: {list(self.known)}")


class CardRegistry:
    """Validated cards by ``model_id``.

    ``register`` validates the card first (``CardError`` on an invalid card or a duplicate id);
    ``get`` raises ``UnknownModelError`` naming the known ids; ``list_cards`` is sorted by id.
    """

    def __init__(self, cards: Iterable[ModelCard] = ()) -> None:
        self._cards: dict[str, ModelCard] = {}
        for card in cards:
            self.register(card)

    def register(self, card: ModelCard) -> ModelCard:
        card.validate()
        if card.model_id in self._cards:
            raise CardError(
                [f"a card with id {card.model_id!r} is already registered"], card.model_id
            )
        self._cards[card.model_id] = card
        return card

    def get(self, model_id: str) -> ModelCard:
        try:
            return self._cards[model_id]
        except KeyError:
            raise UnknownModelError(model_id, self._cards) from None

    def list_cards(self) -> list[ModelCard]:
        return [self._cards[k] for k in sorted(self._cards)]

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._cards

    def __len__(self) -> int:
        return len(self._cards)


def builtin_registry() -> CardRegistry:
    """A new registry holding every family's cards (validated)."""
    return CardRegistry(card for family in _FAMILY_CARDS for card in family())


def list_cards() -> list[ModelCard]:
    """The built-in cards, sorted by id (what ``dreamrt models`` prints)."""
    return builtin_registry().list_cards()


def get(model_id: str) -> ModelCard:
    """The built-in card ``model_id``; ``UnknownModelError`` lists the known ids."""
    return builtin_registry().get(model_id)
