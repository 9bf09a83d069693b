"""A simulated viewer of one live session, for ``infra.bench.multisession``.

It plays the session's frames out at the profile's fps the way ``server.media.track`` paces
the WebRTC track (with ``sessions.playout``'s anchor rule), without encoding anything:

- the engine's ``on_emit`` (``SimViewer.on_emit``) queues each media emission's frames with
  their PTS (``pts_of_frame``) and the time they arrived; frames are uint8 on the host by
  then (the engine resolves a ``PendingOutput`` off the event loop before calling it);
- ``run()`` shows the first frame as soon as it exists, then one frame per slot of ``1/fps``:
  a fresh frame is due at ``anchor + pts / PTS_HZ`` (never before its slot); if none is there
  when the slot comes, the last frame is repeated (a *repeat*; the first repeat after fresh
  frames opens a *stall*), and the next fresh frame after a stall is shown at once;
- the anchor is media time 0 on the clock: set by the first frame shown and moved when a fresh
  frame is shown more than half a frame away from it (after a stall); every move goes to
  ``on_anchor`` (the loop's ``LoopHandle.set_media_t0``: the engine's deadlines follow the
  viewer, as a session forwards them).

What it measures (``summary``): delivered fps (fresh frames shown / seconds since the first),
stalls per minute, fresh-frame interval percentiles at the playout, slack of every media
emission after the first (``anchor + pts`` of its first frame minus its arrival; negative: it
came after it was due), and input-to-applied latency: from ``push`` to the arrival of the first
media of the chunk an ``applied`` acknowledgement names. With ``keep_chunks`` it also keeps the
uint8 frames of the first chunks, up to the first chunk that reflects one of its inputs
(``gate_chunks``: the interleave gate of ``infra.bench.multisession_gate``). Event-loop thread
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from runtime.contract import (
    PTS_HZ,
    AppliedMeta,
    Emission,
    InputEvent,
    InputKind,
    MediaMeta,
    Stream,
    pts_of_frame,
)

__all__ = ["SimViewer", "percentile"]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` in [0, 1] (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True, slots=True)
class _Frame:
    pts_90k: int
    arrival_s: float


class SimViewer:
    """See the module docstring. ``max_hold_s``: a fresh frame due further ahead than this is
    shown at its slot instead (a stale anchor never freezes the picture), as the track does."""

    def __init__(
        self,
        fps: int,
        *,
        on_anchor: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_hold_s: float = 1.0,
        keep_chunks: int = 0,
    ) -> None:
        self.fps = fps
        self._frame_s = 1.0 / fps
        self._on_anchor = on_anchor
        self._clock = clock
        self._max_hold_s = max_hold_s
        self._pending: deque[_Frame] = deque()
        self._arrived = asyncio.Event()
        self.anchor_s: float | None = None
        self.first_arrival_s: float | None = None
        self.fresh_shown_s: list[float] = []
        self.repeats = 0
        self.stalls = 0
        self.slack_s: list[float] = []
        self._chunk_arrival_s: dict[int, float] = {}
        self._pushed: dict[int, tuple[InputKind, float]] = {}
        self.applied_latency_s: dict[str, list[float]] = {"prompt": [], "action": []}
        self._next_seq = 0
        self._keep_chunks = keep_chunks
        self._kept: dict[int, list[np.ndarray]] = defaultdict(list)
        self.first_applied_chunk: int | None = None

    # -- the engine side -------------------------------------------------------------------

    def on_emit(self, emission: Emission) -> None:
        """The loop's ``on_emit``: media frames to the playout queue, acks to latencies."""
        now = self._clock()
        meta = emission.spec.meta
        if emission.spec.stream == Stream.MEDIA and isinstance(meta, MediaMeta):
            frames = int(emission.output.shape[0])  # uint8 [n, H, W, 3] on the host
            if self.anchor_s is not None:
                self.slack_s.append(self.anchor_s + meta.pts_90k / PTS_HZ - now)
            if self.first_arrival_s is None:
                self.first_arrival_s = now
            self._chunk_arrival_s.setdefault(meta.chunk, now)
            if meta.chunk < self._keep_chunks:
                out = emission.output  # a host torch tensor or an ndarray
                self._kept[meta.chunk].append(
                    (out.numpy() if hasattr(out, "numpy") else np.asarray(out)).copy()
                )
            self._pending.extend(
                _Frame(pts_of_frame(meta.frame_start + i, meta.fps), now) for i in range(frames)
            )
            self._arrived.set()
        elif emission.spec.stream == Stream.APPLIED and isinstance(meta, AppliedMeta):
            pushed = self._pushed.pop(meta.seq, None)
            arrival = self._chunk_arrival_s.get(meta.chunk)
            if pushed is not None and (
                self.first_applied_chunk is None or meta.chunk < self.first_applied_chunk
            ):
                self.first_applied_chunk = meta.chunk
            if pushed is not None and arrival is not None:
                kind, push_s = pushed
                self.applied_latency_s.setdefault(kind.value, []).append(arrival - push_s)

    def push(self, handle: Any, kind: InputKind, payload: Any) -> None:
        """Push one input through the loop's handle and time it until it is applied."""
        seq = self._next_seq
        self._next_seq += 1
        self._pushed[seq] = (kind, self._clock())
        handle.push_input(InputEvent(kind, seq, payload, received_s=time.time()))

    def gate_chunks(self) -> dict[int, np.ndarray]:
        """chunk -> its uint8 frames ``[n, H, W, 3]``, for the kept chunks before the first one
        that reflects an input (all kept chunks if none was applied)."""
        end = self.first_applied_chunk if self.first_applied_chunk is not None else 1 << 30
        return {c: np.concatenate(parts) for c, parts in sorted(self._kept.items()) if c < end}

    # -- the playout -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Play out until ``stop`` is set."""
        last_sent_s: float | None = None
        stalling = False
        while not stop.is_set():
            now = self._clock()
            slot_s = now if last_sent_s is None else max(now, last_sent_s + self._frame_s)
            if not self._pending:
                # before the first frame there is nothing to repeat: wait as long as it takes
                wait_s = None if last_sent_s is None else slot_s - now
                await self._wait_arrival(wait_s, stop)
                if stop.is_set():
                    return
                if not self._pending:
                    await self._sleep_until(slot_s, stop)
                if not self._pending:  # nothing came by the slot: repeat the last frame
                    self.repeats += 1
                    self.stalls += not stalling
                    stalling = True
                    last_sent_s = self._clock()
                    continue
            frame = self._pending[0]
            due_s = slot_s
            if last_sent_s is not None and not stalling and self.anchor_s is not None:
                by_pts = self.anchor_s + frame.pts_90k / PTS_HZ
                if by_pts <= slot_s + self._max_hold_s:
                    due_s = max(slot_s, by_pts)
            await self._sleep_until(due_s, stop)
            if stop.is_set():
                return
            self._pending.popleft()
            shown_s = self._clock()
            self.fresh_shown_s.append(shown_s)
            anchor = shown_s - frame.pts_90k / PTS_HZ
            if self.anchor_s is None or abs(anchor - self.anchor_s) > 0.5 * self._frame_s:
                self.anchor_s = anchor
                if self._on_anchor is not None:
                    self._on_anchor(anchor)
            stalling = False
            last_sent_s = shown_s

    async def _wait_arrival(self, timeout_s: float | None, stop: asyncio.Event) -> None:
        self._arrived.clear()
        if self._pending:
            return
        waits = {asyncio.ensure_future(self._arrived.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(
                waits,
                timeout=None if timeout_s is None else max(0.0, timeout_s),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for waiter in waits:
                waiter.cancel()

    async def _sleep_until(self, when_s: float, stop: asyncio.Event) -> None:
        delay = when_s - self._clock()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    # -- results ---------------------------------------------------------------------------

    def summary(self, spawned_s: float, end_s: float) -> dict[str, Any]:
        """Per-session numbers over [first frame shown, ``end_s``] (see the module docstring);
        times in seconds unless the key says ms; None where nothing was measured."""
        shown = self.fresh_shown_s
        span_s = end_s - shown[0] if shown else 0.0
        intervals = [b - a for a, b in pairwise(shown)]

        def ms(value: float | None) -> float | None:
            return None if value is None else value * 1e3

        def median(values: list[float]) -> float | None:
            return percentile(values, 0.5)

        return {
            "fresh_frames": len(shown),
            "fps": len(shown) / span_s if span_s > 0 else 0.0,
            "stalls": self.stalls,
            "repeats": self.repeats,
            "stalls_per_min": self.stalls / (span_s / 60.0) if span_s > 0 else None,
            "interval_ms": {f"p{q}": ms(percentile(intervals, q / 100)) for q in (50, 95, 99)},
            "slack_ms": {
                "min": ms(min(self.slack_s, default=None)),
                "p5": ms(percentile(self.slack_s, 0.05)),
                "n": len(self.slack_s),
            },
            "first_frame_s": (
                None if self.first_arrival_s is None else self.first_arrival_s - spawned_s
            ),
            "prompt_to_applied_s": median(self.applied_latency_s["prompt"]),
            "action_to_applied_s": median(self.applied_latency_s["action"]),
            "applied_latency_s": {k: list(v) for k, v in self.applied_latency_s.items()},
            "inputs_not_applied": len(self._pushed),
        }
