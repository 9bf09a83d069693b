"""The errors a model card raises: an inconsistent card, a recipe/serving mismatch, a bad profile.

``CardError`` is raised by ``ModelCard.validate()`` (and by a part whose enum field is not one of
its choices); ``RecipeMismatchError`` by ``ModelCard.check_serving()``; ``ProfileError`` by
``ModelCard.resolve_profile()``. All are ``ValueError``s: they describe bad data, not bugs.
"""

from __future__ import annotations

from runtime.contract import DreamrtError

__all__ = ["CardError", "ProfileError", "RecipeMismatchError"]


class CardError(ValueError):
    """A card is inconsistent; ``problems`` lists every finding, the message joins them."""

    def __init__(self, problems: list[str] | tuple[str, ...], model_id: str = "") -> None:
        self.model_id = model_id
        self.problems = tuple(problems)
        where = f"model card {model_id!r}" if model_id else "model card part"
        super().__init__(f"{where} is invalid: " + "; ".join(self.problems))


class RecipeMismatchError(ValueError):
    """A card was asked to serve under a loop or precision its recipe does not assume."""

    def __init__(
        self,
        model_id: str,
        *,
        requested_loop: str,
        requested_precision: str,
        assumed_loop: str,
        assumed_precision: str,
        reason: str,
    ) -> None:
        self.model_id = model_id
        self.requested_loop = requested_loop
        self.requested_precision = requested_precision
        self.assumed_loop = assumed_loop
        self.assumed_precision = assumed_precision
        self.reason = reason
        super().__init__(
            f"model {model_id!r} cannot be served under loop {requested_loop!r} at "
            f"{requested_precision!r}: its recipe assumes loop {assumed_loop!r} at "
            f"{assumed_precision!r} ({reason})"
        )


class ProfileError(DreamrtError, ValueError):
    """A requested profile field is invalid for the card (``field`` names it): a 422."""

    code = "invalid_field"
    status = 422

    def __init__(self, model_id: str, field_name: str, message: str) -> None:
        self.model_id = model_id
        self.field = field_name
        super().__init__(f"model {model_id!r}: {field_name}: {message}")
