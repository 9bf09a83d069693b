"""A session's intake of its loop's emissions: each one goes to the part it concerns.

What playout needs happens at once; what the stream reads follows in emission order
(``sessions.emission_order``)::

    media     frames into ``ChunkAssembly`` (playable at once; ``media.chunk`` and the record
              once the chunk's digest is there), the start breakdown's ``generated`` stage, and
              ``on_chunk`` after a chunk's last part
    applied   an input the chunk first reflects: when it changes the picture (a prompt, a
              changed key: ``AppliedMeta.changes``) the older backlog is flushed at once, so it
              shows as soon as it exists; then ``InputLedger.applied`` measures its latency and
              publishes ``*.applied`` in order
    progress  nothing (a session has no progress; jobs use it)

Never raises: a failure goes to ``on_error`` (an ``error`` event) and the loop goes on.
Event-loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.contract import AppliedMeta, Emission, InputKind, MediaMeta, Stream
from sessions.chunk_assembly import ChunkAssembly
from sessions.input_ledger import InputLedger
from sessions.latency import SessionLatency
from sessions.media_queue import MediaQueue

__all__ = ["LoopEmissions"]

log = logging.getLogger(__name__)


class LoopEmissions:
    """See the module docstring. ``name`` (``"session ses_…"``) prefixes log lines."""

    def __init__(
        self,
        name: str,
        *,
        chunks: ChunkAssembly,
        media: MediaQueue,
        ledger: InputLedger,
        latency: SessionLatency,
        on_chunk: Callable[[], None],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._name = name
        self._chunks = chunks
        self._media = media
        self._ledger = ledger
        self._latency = latency
        self._on_chunk = on_chunk
        self._on_error = on_error

    def take(self, emission: Emission, *, playable: bool) -> None:
        """One emission; ``playable``: its frames may still be shown (the session is open)."""
        try:
            stream = emission.spec.stream
            if stream == Stream.MEDIA:
                meta: MediaMeta = emission.spec.meta
                if playable:
                    self._latency.first_generated()
                self._chunks.add(meta, emission.output, playable=playable)
                if meta.final:
                    self._on_chunk()
            elif stream == Stream.APPLIED:
                applied: AppliedMeta = emission.spec.meta
                kind = InputKind(applied.kind)
                changes = kind is InputKind.PROMPT or (kind is InputKind.ACTION and applied.changes)
                pts = applied.pts_90k
                dropped = self._media.flush_before(pts, show_next=True) if changes else 0
                self._ledger.applied(applied, emission.timing, dropped=dropped)
            elif stream != Stream.PROGRESS:
                log.debug("%s: ignoring emission stream %r", self._name, stream)
        except Exception as exc:
            self._on_error(exc)
