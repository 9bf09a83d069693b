"""Where the time to steer goes: the latency breakdown of a session's inputs and of its start.

Per input (seconds after the server received it; ``sessions.events.InputLatency``)::

    received ─► latched ─► started ─► generated ─► decoded ─► enqueued ─► sent
                a chunk or  its first   the chunk's  frames on   in the       the first frame
                step        plan runs   last step    the host    media queue  reflecting it
                boundary    (re-cache                                         went on the wire
                            included)                                         (the pacer's send)

``latched`` .. ``decoded`` come from the runtime (``runtime.contract.InputTiming``, measured
from the push, which happens at receipt); ``enqueued`` and ``sent`` are measured here. The
``*.applied`` event carries the stages up to ``enqueued`` and ``dropped_frames`` (queued media
generated before the input that its acknowledgement flushed: the backlog is not shown); the
``input.shown`` event, published when the first fresh frame with a PTS at or after the applied
PTS goes on the wire, carries them all. An input the loop did not count as a change (a held
key sent again, audio) has no runtime stages.

Session start (``sessions.events.StartLatency``, seconds after the session was created):
``offer`` (the first viewer's offer arrived), ``answered`` (its SDP answer went back),
``connected`` (ICE + DTLS up), ``generated`` (the first frame was enqueued), ``sent`` (the first
frame went on the wire); published once, as ``viewer.first_frame``.

Single-threaded (the session's event loop); clock seconds (monotonic in the server).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from runtime.contract import InputTiming
from sessions.events import Event, InputLatency, InputShown, StartLatency, ViewerFirstFrame

__all__ = ["SessionLatency"]

_MAX_TRACKED = 256  # received inputs waiting for their acknowledgement or their first frame


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(slots=True)
class _Pending:
    kind: str
    received_s: float
    pts_90k: int | None = None
    chunk: int = 0
    latency: InputLatency | None = None


class SessionLatency:
    """The breakdowns of one session (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], created_s: float) -> None:
        self._clock = clock
        self._created_s = created_s
        self._inputs: OrderedDict[int, _Pending] = OrderedDict()
        self.start = StartLatency()
        self._start_published = False

    # ---------------------------------------------------------------- inputs

    def received(self, seq: int, kind: str) -> None:
        self._inputs[seq] = _Pending(kind, self._clock())
        while len(self._inputs) > _MAX_TRACKED:
            self._inputs.popitem(last=False)

    def applied(
        self, seq: int, *, chunk: int, pts_90k: int, timing: InputTiming | None, dropped: int
    ) -> InputLatency | None:
        """The input's first frames are in the media queue: its breakdown so far (None for
        an unknown seq); it then waits for its first frame to be sent."""
        pending = self._inputs.get(seq)
        if pending is None:
            return None
        latency = InputLatency(
            enqueued_s=_rounded(self._clock() - pending.received_s), dropped_frames=dropped
        )
        if timing is not None:
            latency.latched_s = _rounded(timing.latched_s)
            latency.started_s = _rounded(timing.started_s)
            latency.generated_s = _rounded(timing.generated_s)
            latency.decoded_s = _rounded(timing.decoded_s)
        pending.pts_90k, pending.chunk, pending.latency = pts_90k, chunk, latency
        return msgspec.structs.replace(latency)

    def inherit(self, parent: SessionLatency) -> None:
        """A fork candidate times ``parent``'s inputs not acknowledged yet from their receipt
        (the candidate's loop applies them; the parent's acknowledged ones are not its own)."""
        for seq, pending in parent._inputs.items():
            if pending.latency is None:
                self._inputs[seq] = _Pending(pending.kind, pending.received_s)

    def forget(self, seq: int) -> None:
        """A superseded input: it will never be shown."""
        self._inputs.pop(seq, None)

    def frame_sent(self, pts_90k: int, sent_s: float) -> list[Event]:
        """A fresh frame with ``pts_90k`` went on the wire at ``sent_s``: ``input.shown`` for
        every applied input whose PTS it reached, and ``viewer.first_frame`` the first time."""
        events: list[Event] = []
        if not self._start_published:
            self._start_published = True
            self.start.sent_s = round(sent_s - self._created_s, 4)
            events.append(
                ViewerFirstFrame(pts=pts_90k, latency=msgspec.structs.replace(self.start))
            )
        for seq, pending in list(self._inputs.items()):
            if pending.latency is None or pending.pts_90k is None or pending.pts_90k > pts_90k:
                continue
            del self._inputs[seq]
            pending.latency.sent_s = _rounded(sent_s - pending.received_s)
            events.append(
                InputShown(
                    seq=seq,
                    kind=pending.kind,
                    chunk=pending.chunk,
                    pts=pts_90k,
                    latency=pending.latency,
                )
            )
        return events

    # ---------------------------------------------------------------- session start

    def _mark(self, stage: str) -> None:
        if getattr(self.start, stage) is None:
            setattr(self.start, stage, round(self._clock() - self._created_s, 4))

    def offer(self) -> None:
        self._mark("offer_s")

    def answered(self) -> None:
        self._mark("answered_s")

    def connected(self) -> None:
        self._mark("connected_s")

    def first_generated(self) -> None:
        self._mark("generated_s")
