"""Live inputs a running loop absorbs at a step boundary (part of the loop contract,
``runtime.contract``): what kind, its payload, its sequence number. Imports neither torch nor
asyncio.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import msgspec

__all__ = [
    "ActionInput",
    "AudioInput",
    "InputEvent",
    "InputKind",
    "PromptInput",
    "PromptMode",
]


class InputKind(str, enum.Enum):
    """Live inputs a loop may absorb."""

    PROMPT = "prompt"
    ACTION = "action"
    AUDIO = "audio"


class PromptMode(str, enum.Enum):
    """How a new prompt takes over (the one name for it, from the API to the loop)."""

    # Either may restart the chunk in flight when the loop's restart policy says so; else:
    SWITCH = "switch"  # at the next chunk boundary; the cached frames are re-cached under it
    CUT = "cut"  # a new segment from the next chunk (no re-cache)


class PromptInput(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    mode: PromptMode = PromptMode.SWITCH


class ActionInput(msgspec.Struct, frozen=True, kw_only=True):
    keys: tuple[str, ...] = ()
    mouse: tuple[float, float] = (0.0, 0.0)  # (dx, dy) pixels since the last action


class AudioInput(msgspec.Struct, frozen=True, kw_only=True):
    """``samples``: float32 ndarray [n], 16 kHz mono in [-1, 1] (passed as is, never listed)."""

    samples: object  # opaque to the runtime: the loop converts it (torch.as_tensor)


@dataclass(frozen=True, slots=True)
class InputEvent:
    """A live input for a running loop, delivered through ``Loop.absorb`` at a step boundary.

    ``kind`` says which payload struct ``payload`` is (``PromptInput``, ``ActionInput``,
    ``AudioInput``); ``seq`` is the session's input sequence number (echoed in the
    ``AppliedMeta`` acknowledgement); ``received_s`` is the wall time it arrived.
    """

    kind: InputKind
    seq: int
    payload: PromptInput | ActionInput | AudioInput
    received_s: float = 0.0
