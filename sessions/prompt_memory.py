"""Prompt memory of one session: what was asked, when, and what the stream shows now.

A prompt goes through two moments, matching the two-phase acknowledgement of docs/api.md "Events":
``receive`` (it got a sequence number, the loop will see it at its next step boundary) and
``apply`` (the loop reports the first chunk that reflects it). The *active* prompt is the last
applied one. Its embedding is cached by the model's text encoder under the sha256 of the text
(``runtime.contract.CacheKey.input_hash``); prompt memory keeps that hash (``embedding_ref``),
never the tensor, so it stays serialisable and model-free.

``mode`` is ``runtime.contract.PromptMode`` (the one name of it from the API to the loop):
``switch`` (the stream continues, KV re-cached under the new prompt) or ``cut`` (a new
Dreamverse segment). The loop counts the segments; an applied prompt is told the segment of the
chunk that first reflects it (``MediaMeta.segment``). The session's first prompt (sequence
number 0) has the mode ``"initial"``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Literal

from runtime.contract import PromptMode

__all__ = ["PromptEntry", "PromptMemory", "UnknownPromptError", "text_hash"]


def text_hash(text: str) -> str:
    """sha256 hex of the UTF-8 text: the feature-cache key of its embedding."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class UnknownPromptError(KeyError):
    """``apply``/``supersede`` named a sequence number prompt memory never received."""


@dataclass(slots=True)
class PromptEntry:
    seq: int
    text: str
    mode: PromptMode | Literal["initial"]
    received_s: float
    applied_s: float | None = None
    chunk: int | None = None  # first chunk that reflects it
    pts_90k: int | None = None
    segment: int | None = None
    superseded_by: int | None = None

    @property
    def pending(self) -> bool:
        return self.applied_s is None and self.superseded_by is None

    def to_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "text": self.text,
            "mode": self.mode,
            "received_s": self.received_s,
            "applied_s": self.applied_s,
            "chunk": self.chunk,
            "pts": self.pts_90k,
            "segment": self.segment,
            "superseded_by": self.superseded_by,
        }


class PromptMemory:
    """History with timestamps, the active prompt and the reference of its cached embedding.

    The initial prompt is active from chunk 0 of segment 0 (sequence number 0).
    """

    def __init__(self, initial_text: str, *, received_s: float) -> None:
        first = PromptEntry(
            seq=0,
            text=initial_text,
            mode="initial",
            received_s=received_s,
            applied_s=received_s,
            chunk=0,
            pts_90k=0,
            segment=0,
        )
        self._entries: dict[int, PromptEntry] = {0: first}
        self._active = first

    @property
    def active(self) -> PromptEntry:
        return self._active

    @property
    def active_text(self) -> str:
        return self._active.text

    @property
    def embedding_ref(self) -> str:
        return text_hash(self._active.text)

    def continue_from(self, other: PromptMemory) -> None:
        """Becomes a copy of ``other`` (a fork candidate goes on with its parent's prompts)."""
        self._entries = {seq: dataclasses.replace(e) for seq, e in other._entries.items()}
        self._active = self._entries[other._active.seq]

    def history(self) -> list[PromptEntry]:
        return sorted(self._entries.values(), key=lambda e: e.seq)

    def pending(self) -> list[PromptEntry]:
        return [e for e in self.history() if e.pending]

    def receive(self, seq: int, text: str, mode: PromptMode, *, received_s: float) -> PromptEntry:
        if seq in self._entries:
            raise ValueError(f"prompt seq {seq} already received")
        entry = PromptEntry(seq=seq, text=text, mode=mode, received_s=received_s)
        self._entries[seq] = entry
        return entry

    def apply(
        self, seq: int, *, chunk: int, pts_90k: int, segment: int, applied_s: float
    ) -> tuple[PromptEntry, list[PromptEntry]]:
        """Marks ``seq`` applied at ``chunk`` of ``segment``; returns it and the still-pending
        older prompts it superseded (latest wins)."""
        entry = self._entries.get(seq)
        if entry is None:
            raise UnknownPromptError(
                f"prompt seq {seq} was never received (known: {sorted(self._entries)})"
            )
        if not entry.pending:
            raise ValueError(
                f"prompt seq {seq} is not pending (applied at chunk {entry.chunk}, "
                f"superseded by {entry.superseded_by})"
            )
        superseded = [e for e in self.pending() if e.seq < seq]
        for older in superseded:
            older.superseded_by = seq
        entry.applied_s = applied_s
        entry.chunk = chunk
        entry.pts_90k = pts_90k
        entry.segment = segment
        self._active = entry
        return entry, superseded
