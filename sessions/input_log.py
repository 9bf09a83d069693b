"""The input log: every input as a loop absorbed it, so a replay can feed it back exactly.

The engine calls the log with ``(step, inputs)`` when it hands inputs to the loop at the
boundary after ``step`` completed plans (``LoopHandle.set_input_log``); the rows go to the
store's ``inputs`` table, keyed by the *engine loop* (a chosen fork candidate's loop carries
its parent's stream on, and its log with it). Payloads are msgpack: prompts and actions as
their fields, audio as float32 little-endian sample bytes (exactly what the loop received).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from runtime.contract import (
    ActionInput,
    AudioInput,
    InputEvent,
    InputKind,
    PromptInput,
    PromptMode,
)
from sessions.store import Store
from sessions.store_rows import InputRow

__all__ = ["InputLog", "decode_input", "encode_input"]


def encode_input(event: InputEvent) -> tuple[int, str, bytes, float]:
    """-> (seq, kind, payload, received_s) as the store keeps them."""
    payload = event.payload
    if isinstance(payload, PromptInput):
        body: dict[str, object] = {"text": payload.text, "mode": payload.mode.value}
    elif isinstance(payload, ActionInput):
        body = {"keys": list(payload.keys), "mouse": list(payload.mouse)}
    elif isinstance(payload, AudioInput):
        samples = np.ascontiguousarray(np.asarray(payload.samples, dtype="<f4")).ravel()
        body = {"samples": samples.tobytes()}
    else:
        raise TypeError(f"input {event.kind!r} has an unloggable payload {type(payload)}")
    kind = getattr(event.kind, "value", event.kind)
    return event.seq, str(kind), msgspec.msgpack.encode(body), float(event.received_s)


def decode_input(row: InputRow) -> InputEvent:
    """A stored row (``Store.inputs``) back into the ``InputEvent`` the loop absorbed."""
    body = msgspec.msgpack.decode(row["payload"])
    kind = InputKind(row["kind"])
    if kind is InputKind.PROMPT:
        payload: PromptInput | ActionInput | AudioInput = PromptInput(
            text=body["text"], mode=PromptMode(body["mode"])
        )
    elif kind is InputKind.ACTION:
        payload = ActionInput(keys=tuple(body["keys"]), mouse=tuple(body["mouse"]))
    else:
        payload = AudioInput(samples=np.frombuffer(body["samples"], dtype="<f4").copy())
    return InputEvent(kind=kind, seq=row["seq"], payload=payload, received_s=row["received_s"])


class InputLog:
    """The engine's input-log callback for one loop: rows are deferred to the store writer."""

    def __init__(self, store: Store, loop_id: str) -> None:
        self._store = store
        self.loop_id = loop_id

    def __call__(self, step: int, inputs: Sequence[InputEvent]) -> None:
        rows = [encode_input(event) for event in inputs]
        self._store.defer(self._store.add_inputs, self.loop_id, step, rows)
