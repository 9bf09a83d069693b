"""Behaviour records: one per generated chunk, enough to replay it (docs/architecture.md §5).

A record holds the static facts of the session's loop (``template``: weights version, loop id,
sampler, steps, timesteps, precision), the seed, the chunk's place (segment, chunk, PTS range,
frame count), the content digest of its frames, and the inputs it reflects: the prompt in force
and the action/audio latched for that chunk.

The loop emits a chunk's media *before* the acknowledgements of the inputs that chunk reflects
(they ride on the same plan), so ``ChunkRecorder`` keeps the newest record open, completes it
from the ``applied`` emissions that follow, and writes it when the next chunk arrives or the
session ends (``flush``). Writes go through ``Store.defer`` (never blocking the event loop).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.contract import InputKind
from sessions.store import Store

__all__ = ["ChunkRecorder", "frames_digest"]


def frames_digest(frames: np.ndarray) -> str:
    """First 16 hex chars of sha256 over uint8 ``[n, H, W, 3]`` frames in C order.

    Hashes the array's buffer in place (no copy); hashlib releases the GIL meanwhile, so a
    worker thread runs it beside the event loop (``sessions.emission_order``)."""
    return hashlib.sha256(np.ascontiguousarray(frames).data).hexdigest()[:16]


class ChunkRecorder:
    """Builds and writes the behaviour records of one session (see the module docstring)."""

    def __init__(
        self,
        store: Store | None,
        *,
        session_id: str,
        model_id: str,
        seed: int,
        template: Mapping[str, Any],
    ) -> None:
        self._store = store
        self._base = {**template, "session_id": session_id, "model_id": model_id, "seed": seed}
        self._open: dict[str, Any] | None = None
        self.written = 0

    def media(
        self,
        *,
        chunk: int,
        segment: int,
        pts_start: int,
        pts_end: int,
        num_frames: int,
        digest: str,
        prompt: str,
        prompt_seq: int,
    ) -> None:
        """A new chunk: writes the previous record and opens this one."""
        self.flush()
        self._open = {
            **self._base,
            "segment": segment,
            "chunk": chunk,
            "prompt": prompt,
            "prompt_seq": prompt_seq,
            "actions": {"action": None, "audio_seqs": []},
            "pts_start": pts_start,
            "pts_end": pts_end,
            "num_frames": num_frames,
            "digest": digest,
            "replay_key": f"{self._base['session_id']}/{segment}/{chunk}/{self._base['seed']}",
        }

    def applied(
        self, kind: InputKind, seq: int, chunk: int, payload: Mapping[str, Any] | None
    ) -> None:
        """An input the loop reports as first reflected by ``chunk`` (a cut is a prompt)."""
        record = self._open
        if record is None or record["chunk"] != chunk:
            return
        if kind is InputKind.PROMPT and payload is not None:
            record["prompt"], record["prompt_seq"] = str(payload["text"]), seq
        elif kind is InputKind.ACTION:
            record["actions"]["action"] = {"seq": seq, **dict(payload or {})}
        elif kind is InputKind.AUDIO:
            record["actions"]["audio_seqs"].append(seq)

    def flush(self) -> None:
        """Writes the open record, if any. Idempotent."""
        record, self._open = self._open, None
        if record is not None and self._store is not None:
            self._store.defer(self._store.add_record, record)
            self.written += 1
