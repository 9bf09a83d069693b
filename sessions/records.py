"""Behaviour records: one per generated chunk, enough to replay it (docs/architecture.md §5).

A record holds the static facts of the session's loop (``template``: model, recipe, weights
version = content hash of the loaded weights - the chunk's capture overrides it with the version
that made the chunk, which a weight sync changes -, loop id, sampler, steps, profile), the facts the
loop captured when it generated the chunk (``MediaMeta.capture``: seed and noise seeds, the
RNG rule, timesteps and sigmas, the prompt and its embedding digest, action and audio-feature
digests, segment, latent position, K/V window, precision, the restart policy that decided
when inputs restarted its chunk), the chunk's place (segment, chunk,
PTS range, frame count), the content digest of its frames, the inputs it reflects (the prompt
in force, the action and audio latched for it, with their sequence numbers), its replay key
(``sessions.snapshot_keeper``), the engine loop that made it (``loop_ref``: a chosen fork
candidate's loop carries its parent's stream on) and its media reference.

The loop emits a chunk's media *before* the acknowledgements of the inputs that chunk reflects
(they ride on the same plan), so ``ChunkRecorder`` keeps the newest record open, completes it
from the ``applied`` emissions that follow, and writes it when the next chunk arrives or the
session ends (``flush``). Writes go through ``Store.defer`` (never blocking the event loop); the
chunk's frames go to the recording writer (MP4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.contract import InputKind
from sessions.input_log import InputLog
from sessions.loop_handle import LoopHandleLike
from sessions.recording import Recording, media_ref
from sessions.snapshot_keeper import SnapshotKeeper
from sessions.store import Store

__all__ = ["ChunkRecorder", "frames_digest"]

# capture fields that become record columns as they are
_CAPTURED = (
    "seed",
    "rng",
    "noise_seeds",
    "timesteps",
    "sigmas",
    "precision",
    "prompt_digest",
    "action_digest",
    "audio_digest",
    "kv_window",
    "latent_frame_start",
    "restart_policy",
    "adapters",
    "decoder",
    "step_batch",
)


def frames_digest(frames: np.ndarray) -> str:
    """First 16 hex chars of sha256 over uint8 ``[n, H, W, 3]`` frames in C order.

    Hashes the array's buffer in place (no copy); hashlib releases the GIL meanwhile, so a
    worker thread runs it beside the event loop (``sessions.chunk_stream``)."""
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
        recording: Recording | None = None,
    ) -> None:
        self._store = store
        self._recording = recording
        self._base = {**template, "session_id": session_id, "model_id": model_id, "seed": seed}
        self._open: dict[str, Any] | None = None
        # acks of a chunk whose record is not open yet (they came with its first part)
        self._early: dict[int, list[tuple[InputKind, int, Mapping[str, object] | None]]] = {}
        self.keeper: SnapshotKeeper | None = None
        self.loop_ref: str | None = None
        self.written = 0

    def bind(self, handle: LoopHandleLike) -> None:
        """The session's loop is ``handle``: log its inputs and keep its replay snapshots."""
        self.loop_ref = handle.loop_id
        if self._store is not None:
            handle.set_input_log(InputLog(self._store, handle.loop_id))
        if self._recording is not None and self._recording.snapshot_every > 0:
            self.keeper = SnapshotKeeper(self._recording, handle)
            self.keeper.start()

    def adopt(self, other: ChunkRecorder) -> None:
        """This session continues ``other``'s loop (a chosen fork candidate): its snapshots
        and loop reference carry on."""
        self.flush()
        self.keeper, self.loop_ref = other.keeper, other.loop_ref
        other.keeper = None

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
        capture: Mapping[str, object] | None = None,
        frames: np.ndarray | None = None,
        fps: int | None = None,
    ) -> None:
        """A new chunk: writes the previous record and opens this one. ``capture`` is what
        the loop reported of it; ``frames`` (uint8 [n, H, W, 3]) become its MP4."""
        self.flush()
        facts = dict(capture or {})
        session_id = self._base["session_id"]
        ref = media_ref(session_id, segment, chunk)
        step = facts.get("step")
        replay_key = self.keeper.key_for(step) if self.keeper and isinstance(step, int) else ""
        self._open = {
            **self._base,
            **{name: facts[name] for name in _CAPTURED if name in facts},
            "segment": segment,
            "chunk": chunk,
            "prompt": str(facts.get("prompt", prompt)),
            "prompt_seq": prompt_seq,
            "actions": {"action": None, "audio_seqs": []},
            "pts_start": pts_start,
            "pts_end": pts_end,
            "num_frames": num_frames,
            "digest": digest,
            "replay_key": replay_key,
            "loop_ref": self.loop_ref,
            "media_ref": None,
        }
        if facts.get("weights_version"):  # the version that made it (a sync changes it)
            self._open["weights_version"] = str(facts["weights_version"])
        if frames is not None and self._recording is not None:
            rate = fps or int(self._base.get("fps", 0)) or 1
            if self._recording.write_media(ref, frames, rate):
                self._open["media_ref"] = ref
        for early in sorted(c for c in self._early if c <= chunk):  # older ones: never opened
            for ack in self._early.pop(early):
                if early == chunk:
                    self._apply(self._open, *ack)

    def chunk_emitted(self) -> None:
        """The loop emitted a chunk's last frames (its record follows once its digest is
        there): the snapshot keeper counts it now, so a snapshot it asks for is taken at the
        loop's boundary right after the chunk."""
        if self.keeper is not None:
            self.keeper.chunk_done()

    def applied(
        self, kind: InputKind, seq: int, chunk: int, payload: Mapping[str, object] | None
    ) -> None:
        """An input the loop reports as first reflected by ``chunk`` (a cut is a prompt). A
        chunk that shows a changing input comes in parts, and its acks come with the first part,
        before the record opens with the last one: they wait for it (``media``)."""
        record = self._open
        if record is None or record["chunk"] < chunk:
            self._early.setdefault(chunk, []).append((kind, seq, payload))
            return
        if record["chunk"] != chunk:
            return
        self._apply(record, kind, seq, payload)

    def _apply(
        self,
        record: dict[str, Any],
        kind: InputKind,
        seq: int,
        payload: Mapping[str, object] | None,
    ) -> None:
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
