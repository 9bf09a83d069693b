"""What produced a card's weights and what keeps them valid: recipe, parity and precisions.

``RecipeSpec`` is the teeth of a card: ``ModelCard.check_serving`` refuses a loop or precision
the recipe does not assume (a 4-step distilled checkpoint cannot silently run under a 50-step
sampler, nor a bf16 recipe under fp16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from models.card.vocabulary import ParityLevel, coerce, frozen_mapping

__all__ = ["ParitySpec", "PrecisionContract", "RecipeSpec"]


@dataclass(frozen=True, slots=True)
class RecipeSpec:
    """What produced the weights (docs/architecture.md §7). ``assumes_loop`` is the loop id
    whose sampler the weights require; ``assumes_precision`` the precision the recipe baked in;
    ``consistency_required`` the lowest parity level under which its outputs are valid."""

    method: str
    parents: tuple[str, ...]
    data_contract: str
    assumes_loop: str
    assumes_precision: str
    consistency_required: ParityLevel
    training_command: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(self.parents))
        object.__setattr__(
            self,
            "consistency_required",
            coerce(ParityLevel, self.consistency_required, "consistency_required"),
        )


@dataclass(frozen=True, slots=True)
class ParitySpec:
    """The parity level the card's implementation is tested to, and the tolerances (max relative
    error per named check, e.g. ``"dit_vs_reference"``) its tests hold."""

    level: ParityLevel
    tolerances: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", coerce(ParityLevel, self.level, "parity level"))
        object.__setattr__(self, "tolerances", frozen_mapping(self.tolerances))


@dataclass(frozen=True, slots=True)
class PrecisionContract:
    """Precisions the card may be served under; each must keep the recipe's outputs valid
    (e.g. fp32 widens a bf16 recipe; fp16 does not)."""

    allowed: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", tuple(self.allowed))
