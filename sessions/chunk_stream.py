"""The media side of a session: what its loop emits becomes playable frames, ``media.chunk``
events and behaviour records, in the order the loop emitted it.

What playout needs happens at once; what the event stream reads follows in emission order::

    media     frames into the bounded media queue at once, each with the PTS of its index in
              the stream (``pts_of_frame``); a chunk that arrives in parts (``final`` False on
              all but its last: a session's first picture leaves before the rest of its chunk
              is decoded) is joined, counted, published and recorded once, whole, at its last
              part; ``on_chunk`` after that part
    applied   an input the chunk first reflects: when it changes the picture
              (``AppliedMeta.changes``) the older backlog is flushed at once, so it shows as
              soon as it exists; then ``on_applied`` (the input ledger) takes it with the
              segment of its chunk and the frames the flush dropped
    progress  nothing (a session has no progress; jobs use it)

The segment and whether an input changes the picture come from the loop's metadata only
(``MediaMeta.segment``, ``AppliedMeta.changes``): the loop counts the cuts and knows what it
latched; the session does not decide either again. The loop emits a chunk's first media before
the acknowledgements it carries, so the segment of the newest media is the applied input's.

**Emission order.** A chunk's sha256 (832x480 RGB x 12 frames is 14 MB, several milliseconds)
must not run on the event loop that paces every session's video, so ``EmissionOrder`` hands the
frames to a worker thread and queues what needs the digest (``media.chunk``, the chunk's
record); ``after`` queues work that must not overtake it (``*.applied``, ``input.shown``).
Queued work runs on the event loop, strictly first in, first out, as soon as everything before
it is ready; with nothing pending, ``after`` runs at once::

    emissions:  media c0 ──► applied s1 ──► media c1 ──► applied s2
    queue:      [digest c0 …] [s1] [digest c1 …] [s2]       workers hash c0, c1 in parallel
    runs:       media.chunk c0, then s1, then media.chunk c1, then s2  (never reordered)

``take`` never raises: a failure goes to ``on_error`` (an ``error`` event) and the loop goes on.
Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
from collections.abc import Callable

import numpy as np

from runtime.contract import AppliedMeta, Emission, InputTiming, MediaMeta, Stream, pts_of_frame
from sessions.events import EventStream, MediaChunk
from sessions.latency import SessionLatency
from sessions.media_queue import MediaQueue
from sessions.prompt_memory import PromptMemory
from sessions.records import ChunkRecorder

__all__ = ["AppliedHandler", "ChunkStream", "EmissionOrder"]

log = logging.getLogger(__name__)

# (the acknowledgement, the runtime's timing of the input, its chunk's segment, frames dropped)
AppliedHandler = Callable[[AppliedMeta, InputTiming | None, int, int], None]


class EmissionOrder:
    """Digests on worker threads, their work and the work queued between them on the event
    loop in submission order (module docstring). ``hash_frames`` maps frames to their digest;
    ``executor`` is where it runs (None: the event loop's default executor). Work that raises is
    logged and reported to ``on_error``; the queue goes on."""

    def __init__(
        self,
        hash_frames: Callable[[np.ndarray], str],
        *,
        on_error: Callable[[Exception], None],
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        self._hash = hash_frames
        self._on_error = on_error
        self._executor = executor
        # (digest future or None, work): work(digest) for a digest entry, work() otherwise
        self._queue: collections.deque[tuple[asyncio.Future[str] | None, Callable[..., object]]] = (
            collections.deque()
        )
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> int:
        """Entries not run yet."""
        return len(self._queue)

    def digest(self, frames: np.ndarray, then: Callable[[str], None]) -> None:
        """Hashes ``frames`` (not to be modified until ``then`` ran) on a worker thread and runs
        ``then(digest)`` on the event loop in its turn."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._hash, frames)
        self._queue.append((future, then))
        self._idle.clear()
        future.add_done_callback(lambda _: self._run_ready())

    def after(self, work: Callable[[], object]) -> None:
        """Runs ``work`` once everything queued before it ran (at once when nothing is)."""
        if not self._queue:
            self._guarded(work)
            return
        self._queue.append((None, work))

    async def drain(self) -> None:
        """Returns once everything queued so far has run."""
        await self._idle.wait()

    def _run_ready(self) -> None:
        while self._queue:
            future, work = self._queue[0]
            if future is not None and not future.done():
                return
            self._queue.popleft()
            if future is None:
                self._guarded(work)
            elif future.cancelled():
                log.warning("a chunk digest was cancelled; its chunk is not published")
            elif future.exception() is not None:
                self._report(future.exception())
            else:
                self._guarded(work, future.result())
        self._idle.set()

    def _guarded(self, work: Callable[..., object], *args: str) -> None:
        try:
            work(*args)
        except Exception as exc:
            self._report(exc)

    def _report(self, exc: BaseException | None) -> None:
        log.error("emission handling failed", exc_info=exc)
        if isinstance(exc, Exception):
            self._on_error(exc)


class ChunkStream:
    """See the module docstring. ``name`` (``"session ses_…"``) prefixes log lines;
    ``hash_frames`` is the chunk digest (``sessions.records.frames_digest``). ``last_chunk`` /
    ``chunks_generated`` count whole chunks as they arrive (their ``media.chunk`` may still wait
    for its digest); ``segment`` is the newest media's."""

    def __init__(
        self,
        name: str,
        *,
        media: MediaQueue,
        events: EventStream,
        records: ChunkRecorder,
        prompts: PromptMemory,
        latency: SessionLatency,
        hash_frames: Callable[[np.ndarray], str],
        on_applied: AppliedHandler,
        on_chunk: Callable[[], None],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._name = name
        self._media = media
        self._events = events
        self._records = records
        self._prompts = prompts
        self._latency = latency
        self._on_applied = on_applied
        self._on_chunk = on_chunk
        self._on_error = on_error
        self._order = EmissionOrder(hash_frames, on_error=on_error)
        self.last_chunk = -1
        self.chunks_generated = 0
        self.segment = 0
        # the parts so far of a chunk that arrives in parts: (chunk, segment, pts_start, frames)
        self._partial: tuple[int, int, int, np.ndarray] | None = None

    def continue_segment(self, segment: int) -> None:
        """The stream goes on in ``segment`` before its next chunk arrives (a session resumed
        from a snapshot, a fork candidate of a parent in that segment)."""
        self.segment = segment

    def take(self, emission: Emission, *, playable: bool) -> None:
        """One emission; ``playable``: its frames may still be shown (the session is open)."""
        try:
            stream = emission.spec.stream
            if stream == Stream.MEDIA:
                meta: MediaMeta = emission.spec.meta
                if playable:
                    self._latency.first_generated()
                self._add(meta, emission.output, playable=playable)
                if meta.final:
                    self._on_chunk()
            elif stream == Stream.APPLIED:
                applied: AppliedMeta = emission.spec.meta
                dropped = (
                    self._media.flush_before(applied.pts_90k, show_next=True)
                    if applied.changes
                    else 0
                )
                self._on_applied(applied, emission.timing, self.segment, dropped)
            elif stream != Stream.PROGRESS:
                log.debug("%s: ignoring emission stream %r", self._name, stream)
        except Exception as exc:
            self._on_error(exc)

    def after(self, work: Callable[[], object]) -> None:
        """Runs ``work`` after everything emitted so far took effect (at once when nothing
        waits for a digest)."""
        self._order.after(work)

    async def drain(self) -> None:
        """Returns once every emission so far took effect."""
        await self._order.drain()

    def _add(self, meta: MediaMeta, output: object, *, playable: bool) -> None:
        frames = np.asarray(output).copy()  # [n, H, W, 3] uint8, owned: the loop reuses its own
        chunk, segment, fps = meta.chunk, meta.segment, meta.fps
        self.segment = segment
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
            active = self._prompts.active  # the prompt in force before this chunk's acks
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
