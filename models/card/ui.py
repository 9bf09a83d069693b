"""What a card tells a user interface: example prompts it can draw and the controls it obeys.

A page or CLI speaks the served model's language from this alone: ``examples`` are prompts the
model's vocabulary and training cover (the first is the default prompt of an empty Start), and
``controls`` name each live input the card's session loop absorbs and what it does in the
picture::

    CardUI(examples=("a red ball on grass", ...),
           controls=(Control("key", ("w", "a", "s", "d"), "steer the sprite"),
                     Control("audio", ("talk",), "the sprite pulses with your voice")))

``ModelCard.validate()`` checks that a control's kind is an input the card's session loop
absorbs (a key or mouse control needs ``input.action``, an audio control ``input.audio``). An
empty ``CardUI`` is valid (a client then falls back to its own wording); every built-in card
fills it, which tests/models/test_card.py holds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from models.card.vocabulary import coerce

__all__ = ["MAX_EXAMPLE_CHARS", "CardUI", "Control", "ControlKind"]

# The REST prompt limit is 4000 characters; an example is a one-click chip, so far shorter.
MAX_EXAMPLE_CHARS = 200


class ControlKind(str, enum.Enum):
    """The live input a control drives; each maps to the capability that absorbs it."""

    KEY = "key"  # held keyboard keys (names as the action input takes them: "w", "shift", ...)
    MOUSE = "mouse"  # pointer motion: drag on the video
    AUDIO = "audio"  # microphone (push-to-talk)

    @property
    def capability(self) -> str:
        return "input.audio" if self is ControlKind.AUDIO else "input.action"


@dataclass(frozen=True, slots=True)
class Control:
    """One legend entry: ``inputs`` it names (key names for ``key``; ``"drag"`` for ``mouse``,
    ``"talk"`` for ``audio``) and what they ``do`` in the picture."""

    kind: ControlKind
    inputs: tuple[str, ...]
    does: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", coerce(ControlKind, self.kind, "control kind"))
        object.__setattr__(self, "inputs", tuple(self.inputs))

    def to_public(self) -> dict[str, object]:
        return {"kind": self.kind.value, "inputs": list(self.inputs), "does": self.does}

    def describe(self) -> str:
        """One line, e.g. ``key w/a/s/d: move the sprite``."""
        return f"{self.kind.value} {'/'.join(self.inputs)}: {self.does}"


@dataclass(frozen=True, slots=True)
class CardUI:
    """Example prompts (first = default) and the controls legend of a card."""

    examples: tuple[str, ...] = ()
    controls: tuple[Control, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "controls", tuple(self.controls))

    def problems(self, capabilities: frozenset[str]) -> list[str]:
        """Findings against the card's ``capabilities`` (empty when consistent)."""
        found = []
        for text in self.examples:
            if not text.strip() or len(text) > MAX_EXAMPLE_CHARS:
                found.append(
                    f"ui example {text!r} must be non-blank and at most "
                    f"{MAX_EXAMPLE_CHARS} characters"
                )
        if len(set(self.examples)) != len(self.examples):
            found.append("ui.examples repeats a prompt")
        for control in self.controls:
            where = f"ui control {control.describe()!r}"
            if not control.inputs or not all(i.strip() for i in control.inputs):
                found.append(f"{where} names no inputs")
            if not control.does.strip():
                found.append(f"{where} does not say what it does")
            if control.kind.capability not in capabilities:
                found.append(f"{where} needs {control.kind.capability!r}, which the card lacks")
        return found
