"""The session's media stream: generated frames with PTS in a bounded drop-oldest queue.

Frames carry the generation PTS on a 90 kHz clock starting at 0 (``pts_90k``), strictly
increasing within a session: ``put_chunk`` rejects (drops and counts) any frame whose PTS is not
greater than the last accepted one, so a misbehaving producer can never make the stream go
backwards. The queue holds at most ``capacity_frames``; when full the *oldest* frame is dropped
(a viewer wants the newest picture, not a backlog). ``flush_before(pts)`` drops every queued
frame older than ``pts`` — used when a prompt switch or cut is applied, so the viewer sees the
new direction as soon as it exists instead of the stale backlog generated under the old one.

Single-threaded: producer (engine emissions) and consumer (the WebRTC track) both run on the
session's asyncio loop. ``wait_nonempty`` lets a consumer sleep until a frame arrives.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

import numpy as np

__all__ = ["MediaFrame", "MediaQueue"]


@dataclass(frozen=True, slots=True)
class MediaFrame:
    rgb: np.ndarray  # [H, W, 3] uint8
    pts_90k: int
    chunk: int
    segment: int


class MediaQueue:
    """Bounded, drop-oldest FIFO of ``MediaFrame`` with strictly increasing PTS (see module doc)."""

    def __init__(self, capacity_frames: int) -> None:
        if capacity_frames < 1:
            raise ValueError(f"capacity_frames must be >= 1, got {capacity_frames}")
        self.capacity_frames = capacity_frames
        self._frames: collections.deque[MediaFrame] = collections.deque()
        self._last_pts: int | None = None
        self._nonempty = asyncio.Event()
        self._flushed = asyncio.Event()
        self._closed = False
        self.frames_in = 0
        self.dropped_overflow = 0
        self.dropped_flush = 0
        self.dropped_non_monotonic = 0
        # flush_before calls that dropped at least one frame or asked to show the next at once
        self.flushes = 0

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_pts(self) -> int | None:
        return self._last_pts

    def skip_to(self, pts_90k: int) -> None:
        """The stream goes on after ``pts_90k`` (a fork choice: the chosen candidate's frames
        up to there were shown in its preview); nothing queued is dropped."""
        if self._last_pts is None or pts_90k > self._last_pts:
            self._last_pts = int(pts_90k)

    def put_chunk(self, frames: np.ndarray, pts_90k: list[int], *, chunk: int, segment: int) -> int:
        """Enqueue a chunk. # frames: [n, H, W, 3] uint8; ``pts_90k``: n PTS values.

        Returns how many frames were accepted.
        """
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(
                f"frames must be uint8 [n, H, W, 3], got {frames.dtype} {tuple(frames.shape)}"
            )
        if len(pts_90k) != frames.shape[0]:
            raise ValueError(f"{frames.shape[0]} frames but {len(pts_90k)} PTS values")
        if self._closed:
            return 0
        accepted = 0
        for rgb, pts in zip(frames, pts_90k, strict=True):
            if self._last_pts is not None and pts <= self._last_pts:
                self.dropped_non_monotonic += 1
                continue
            if len(self._frames) >= self.capacity_frames:
                self._frames.popleft()
                self.dropped_overflow += 1
            self._frames.append(MediaFrame(rgb, int(pts), chunk, segment))
            self._last_pts = int(pts)
            accepted += 1
        self.frames_in += accepted
        if self._frames:
            self._nonempty.set()
        return accepted

    def pop(self) -> MediaFrame | None:
        """The oldest queued frame, or None when empty (the consumer then repeats/stalls)."""
        if not self._frames:
            return None
        frame = self._frames.popleft()
        if not self._frames:
            self._nonempty.clear()
        return frame

    def peek(self) -> MediaFrame | None:
        return self._frames[0] if self._frames else None

    def flush_before(self, pts_90k: int, *, show_next: bool = False) -> int:
        """Drops queued frames with PTS < ``pts_90k``; returns how many. ``show_next``: the
        consumer should show the next frame at once even when nothing was dropped (it starts
        something the viewer waits for); a flush that drops frames always does."""
        dropped = 0
        while self._frames and self._frames[0].pts_90k < pts_90k:
            self._frames.popleft()
            dropped += 1
        self.dropped_flush += dropped
        if dropped or show_next:
            self.flushes += 1
            self._flushed.set()
        if not self._frames:
            self._nonempty.clear()
        return dropped

    async def wait_nonempty(self, timeout_s: float | None = None) -> bool:
        """True once a frame is queued (or the queue closed), False on timeout."""
        if self._frames or self._closed:
            return True
        try:
            await asyncio.wait_for(self._nonempty.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def wait_flushed(self, seen: int) -> None:
        """Returns once ``flushes`` differs from ``seen`` (a flush happened) or the queue closed."""
        while self.flushes == seen and not self._closed:
            self._flushed.clear()
            await self._flushed.wait()

    def close(self) -> None:
        """Drops everything and wakes waiters; later puts are ignored. Idempotent."""
        self._closed = True
        self._frames.clear()
        self._nonempty.set()
        self._flushed.set()
