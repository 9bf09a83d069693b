"""Hypothesis strategies for control-protocol fuzzing, and the server's verdict on a message.

``control_messages()`` draws what a buggy or hostile client could put on the ``control`` data
channel: well-formed messages of every type with values in and out of range (unknown keys,
bad modes, huge prompts), arbitrary JSON values, JSON with wrong types or unknown fields,
raw text, truncated JSON, oversized messages and non-UTF-8 bytes. ``expected_error`` says
which ``error`` code the server must answer a message with (None: accepted), by the documented
rules: the decoder (``server.live.control``), the prompt length limit, the card's capabilities and
its action check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from hypothesis import strategies as st

from models.loops.inputs import action_vector, normalize_keys
from server.live.control import ActionMessage, ControlError, PromptMessage, decode_control

__all__ = ["control_messages", "expected_error"]

KEYS = ["w", "a", "s", "d", "shift", "space", "q", "e", "ArrowUp", "arrowleft", "W"]
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=6,
)
_number = st.one_of(
    st.integers(-20_000, 20_000),
    st.floats(-20_000, 20_000, allow_nan=False),
    st.text(max_size=4),
)


def _message(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


_structured = st.one_of(
    st.builds(
        lambda text, mode: _message(
            "prompt", text=text, **({} if mode is None else {"mode": mode})
        ),
        st.one_of(st.text(max_size=60), st.integers(3990, 4010).map(lambda n: "ab"[n % 2] * n)),
        st.sampled_from([None, "switch", "cut", "fade", ""]),
    ),
    st.builds(
        lambda keys, mouse: _message(
            "action", keys=keys, **({} if mouse is None else {"mouse": mouse})
        ),
        st.lists(st.sampled_from(KEYS) | st.text(max_size=40), max_size=18),
        st.none() | st.lists(_number, min_size=0, max_size=3),
    ),
    st.builds(
        lambda rating, chunk, note: _message("feedback", rating=rating, chunk=chunk, note=note),
        st.integers(-2, 2) | st.text(max_size=2),
        st.none() | st.integers(-5, 10**6),
        st.none() | st.text(max_size=50) | st.integers(1999, 2001).map(lambda n: "n" * n),
    ),
    st.builds(lambda t: _message("ping", t=t), _number | st.none()),
    st.sampled_from([_message("pause"), _message("resume")]),
    # a known type with a field it does not have, or an unknown type
    st.builds(
        lambda kind, key, value: {"type": kind, key: value},
        st.sampled_from(["prompt", "action", "ping", "pause", "teleport", ""]),
        st.text(min_size=1, max_size=8),
        _scalars,
    ),
)


def control_messages(*, pause: bool = True) -> st.SearchStrategy[str | bytes]:
    """One wire message: mostly JSON text, sometimes raw text or bytes. ``pause=False`` leaves
    out ``pause`` messages (a live fuzz that measures streaming keeps the session live)."""
    structured = _structured
    if not pause:
        structured = structured.filter(lambda m: m.get("type") != "pause")
    return st.one_of(
        structured.map(json.dumps),
        structured.map(json.dumps),
        _json.map(json.dumps),
        st.text(max_size=80),
        structured.map(lambda m: json.dumps(m)[:-3]),  # truncated JSON
        st.builds(
            lambda n: json.dumps(_message("prompt", text="x" * n)), st.integers(16_380, 17_000)
        ),
        st.binary(max_size=40),
    )


def expected_error(
    raw: str | bytes, *, capabilities: Collection[str], max_prompt_chars: int
) -> str | None:
    """The ``error`` code the server answers ``raw`` with, or None when it accepts it."""
    try:
        msg = decode_control(raw)
    except ControlError as exc:
        return exc.code
    if isinstance(msg, PromptMessage):
        if len(msg.text) > max_prompt_chars:
            return "prompt_too_long"
        return None if f"prompt.{msg.mode}" in capabilities else "rejected"
    if isinstance(msg, ActionMessage):
        if "input.action" not in capabilities:
            return "rejected"
        mouse = msg.mouse or (0.0, 0.0)
        try:
            normalize_keys(msg.keys)
            action_vector(msg.keys, mouse)
        except ValueError:
            return "rejected"
        return None if all(math.isfinite(v) for v in mouse) else "rejected"
    return None
