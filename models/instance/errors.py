"""The error a loaded instance raises (``models/instance/resident.py`` and its mixins): a card that
cannot be instantiated here, or a serving lever it cannot take."""

from __future__ import annotations

__all__ = ["InstanceError"]


class InstanceError(RuntimeError):
    """A card that cannot be instantiated here (names the card and the reason)."""
