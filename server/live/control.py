"""The ``control`` data channel: message schemas (msgspec), size limit and rate limit.

Client -> server messages (docs/api.md "Data channel `control`"): ``prompt`` (``text``,
optional ``mode`` switch|cut), ``action`` (``keys``, optional ``mouse`` [dx, dy]), ``feedback``
(``rating`` -1|0|1, optional ``chunk``, ``note``), ``pause``, ``resume``, ``ping`` (``t``).
Each message is one JSON text of at most ``MAX_MESSAGE_BYTES``; it is decoded straight into a
tagged ``msgspec.Struct``, so a wrong type, a missing field, an unknown ``type`` or an unknown
field is a ``ControlError`` whose message names the field (``$.text``) — the peer then gets an
``error`` event and the session continues.

``TokenBucket`` limits messages per peer: ``rate_per_s`` sustained, ``burst`` at once. Pure
(no asyncio); the clock is injectable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Literal

import msgspec

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ActionMessage",
    "ControlError",
    "ControlMessage",
    "FeedbackMessage",
    "PauseMessage",
    "PingMessage",
    "PromptMessage",
    "ResumeMessage",
    "TokenBucket",
    "decode_control",
]

MAX_MESSAGE_BYTES = 16 * 1024

# No length bound here: a prompt's limit is the server's (``--max-prompt-chars``), checked once,
# by the session's input ledger; the message size bounds the text meanwhile.
Text = Annotated[str, msgspec.Meta(min_length=1)]
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
Delta = Annotated[float, msgspec.Meta(ge=-10_000, le=10_000)]


class _Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, frozen=True):
    pass


class PromptMessage(_Message, tag="prompt", frozen=True):
    text: Text
    mode: Literal["switch", "cut"] = "switch"


class ActionMessage(_Message, tag="action", frozen=True):
    keys: Annotated[list[Key], msgspec.Meta(max_length=16)]
    mouse: tuple[Delta, Delta] | None = None


class FeedbackMessage(_Message, tag="feedback", frozen=True):
    rating: Literal[-1, 0, 1]
    chunk: Annotated[int, msgspec.Meta(ge=0)] | None = None
    note: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class PauseMessage(_Message, tag="pause", frozen=True):
    pass


class ResumeMessage(_Message, tag="resume", frozen=True):
    pass


class PingMessage(_Message, tag="ping", frozen=True):
    t: float


ControlMessage = (
    PromptMessage | ActionMessage | FeedbackMessage | PauseMessage | ResumeMessage | PingMessage
)

_decoder = msgspec.json.Decoder(ControlMessage)


class ControlError(ValueError):
    """A control message that cannot be accepted; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def decode_control(data: str | bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> ControlMessage:
    """Validates one data-channel message (at most ``max_bytes`` of UTF-8); raises
    ``ControlError`` naming the problem."""
    if isinstance(data, str):
        if len(data) > max_bytes:  # a str is at least one byte per character: no encode needed
            raise ControlError(
                "message_too_large", f"message is over {max_bytes} bytes; the limit is {max_bytes}"
            )
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate cannot come from valid UTF-8
            raise ControlError("invalid_json", f"not a UTF-8 message: {exc}") from None
    else:
        raw = data
    if len(raw) > max_bytes:
        raise ControlError(
            "message_too_large", f"message is {len(raw)} bytes; the limit is {max_bytes}"
        )
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ControlError("invalid_message", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ControlError("invalid_json", f"not a JSON message: {exc}") from None


class TokenBucket:
    """``rate_per_s`` tokens per second up to ``burst``; ``take()`` is False when empty."""

    def __init__(
        self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"rate_per_s={rate_per_s} must be > 0 and burst={burst} >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self.refused = 0

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.refused += 1
        return False
