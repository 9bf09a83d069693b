"""A card's checkpoint manifest: which files hold which component, in which format, for which task.

Explicit on purpose: the loader never guesses a component from tensor names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from models.card.vocabulary import CheckpointFormat, coerce, frozen_mapping

__all__ = ["CheckpointManifest", "ComponentEntry"]


@dataclass(frozen=True, slots=True)
class ComponentEntry:
    """Where one component's weights live under the checkpoint root, in which format, and for
    which tasks (capabilities) it is required or merely optional."""

    path_hint: str
    format: CheckpointFormat
    required_for: frozenset[str] = frozenset()
    optional_for: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", coerce(CheckpointFormat, self.format, "format"))
        object.__setattr__(self, "required_for", frozenset(self.required_for))
        object.__setattr__(self, "optional_for", frozenset(self.optional_for))


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    """Explicit components of a checkpoint (no name-detector guessing)."""

    components: Mapping[str, ComponentEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", frozen_mapping(self.components))

    def required_for(self, task: str) -> tuple[str, ...]:
        """Component ids that must be present to run ``task``."""
        return tuple(sorted(c for c, e in self.components.items() if task in e.required_for))
