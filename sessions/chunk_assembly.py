"""Chunk assembly: a session's ``"media"`` emissions become playable frames, ``media.chunk``
events and behaviour records.

Frames enter the bounded media queue the moment they arrive, each with the PTS of its index in
the stream (``pts_of_frame``), so playout never waits. A chunk may arrive in parts (``final``
False on all but its last: a session's first picture leaves before the rest of its chunk is
decoded); the parts are joined and the chunk is counted, published and recorded once, whole, at
its last part. Its digest (``sessions.records.frames_digest``) is computed on a worker thread
through ``EmissionOrder``, which publishes ``media.chunk`` and opens the chunk's record (with
what the loop captured of it, ``MediaMeta.capture``, and its frames for the recording) in
emission order once the digest is there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.contract import MediaMeta, pts_of_frame
from sessions.emission_order import EmissionOrder
from sessions.events import EventStream, MediaChunk
from sessions.media_queue import MediaQueue
from sessions.prompt_memory import PromptMemory
from sessions.records import ChunkRecorder

__all__ = ["ChunkAssembly"]


class ChunkAssembly:
    """See the module docstring. ``last_chunk`` / ``chunks_generated`` count whole chunks as they
    arrive (their ``media.chunk`` may still wait for its digest)."""

    def __init__(
        self,
        *,
        media: MediaQueue,
        events: EventStream,
        records: ChunkRecorder,
        prompts: PromptMemory,
        order: EmissionOrder,
    ) -> None:
        self._media = media
        self._events = events
        self._records = records
        self._prompts = prompts
        self._order = order
        self.last_chunk = -1
        self.chunks_generated = 0
        # the parts so far of a chunk that arrives in parts: (chunk, segment, pts_start, frames)
        self._partial: tuple[int, int, int, np.ndarray] | None = None

    def add(self, meta: MediaMeta, output: Any, *, playable: bool) -> None:
        """One media emission; its frames are queued for playout at once when ``playable``."""
        frames = np.asarray(output).copy()  # [n, H, W, 3] uint8, owned: the loop reuses its own
        chunk, segment, fps = meta.chunk, meta.segment, meta.fps
        pts_start = meta.pts_90k
        last_index = meta.frame_start + frames.shape[0] - 1  # of the whole chunk, once final
        if playable:
            pts = [pts_of_frame(meta.frame_start + i, fps) for i in range(frames.shape[0])]
            self._media.put_chunk(frames, pts, chunk=chunk, segment=segment)
        earlier = self._partial if self._partial and self._partial[:2] == (chunk, segment) else None
        if earlier is not None:  # join the chunk's earlier parts
            pts_start, frames = earlier[2], np.concatenate((earlier[3], frames))
        if not meta.final:
            self._partial = (chunk, segment, pts_start, frames)
            return
        self._partial = None
        pts_end = pts_of_frame(last_index, fps)
        self.last_chunk = max(self.last_chunk, chunk)
        self.chunks_generated += 1
        # at once, not after the digest: a replay snapshot it asks for lands on the boundary
        # right after this chunk (``SnapshotKeeper``)
        self._records.chunk_emitted()

        def publish(digest: str) -> None:
            self._events.publish(
                MediaChunk(
                    chunk=chunk,
                    pts_start=pts_start,
                    frames=frames.shape[0],
                    segment=segment,
                    fps=fps,
                    digest=digest,
                )
            )
            active = self._prompts.active
            self._records.media(
                chunk=chunk,
                segment=segment,
                pts_start=pts_start,
                pts_end=pts_end,
                num_frames=frames.shape[0],
                digest=digest,
                prompt=active.text,
                prompt_seq=active.seq,
                capture=meta.capture,
                frames=frames,
                fps=fps,
            )

        self._order.digest(frames, publish)
