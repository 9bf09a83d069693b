"""Typed session/job events and the one ordered event stream per session (docs/architecture.md §5).

Every event is a ``msgspec.Struct`` tagged by its ``type`` (``"session.state"``,
``"input.received"``, ``"prompt.applied"``, ``"media.chunk"`` …), so the wire form is exactly
the JSON of docs/api.md "Events" and decoding an unknown type is an error, not a silent dict.
``event_id`` is the position in its stream (from 1, strictly increasing; SSE uses it as
``id:``) and ``time_s`` the wall time (Unix seconds) it was published.

``EventStream`` is single-threaded: publish and subscribe on the asyncio loop thread that owns
the session (the engine delivers emissions there). Subscribers are bounded: one that falls
``max_backlog`` events behind is closed with ``overflowed=True`` rather than growing memory
without limit; a slow SSE reader never slows the session down.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable

import msgspec

from runtime.contract import PromptMode

__all__ = [
    "ActionApplied",
    "AudioApplied",
    "ErrorEvent",
    "Event",
    "EventStream",
    "FeedbackRecorded",
    "InputLatency",
    "InputReceived",
    "InputShown",
    "InputSuperseded",
    "JobArtifact",
    "JobPreview",
    "JobProgress",
    "JobStateChanged",
    "MediaChunk",
    "ModelSleep",
    "Pong",
    "PromptApplied",
    "RoomStateChanged",
    "SessionStateChanged",
    "StartLatency",
    "Subscription",
    "ViewerFirstFrame",
    "WeightsUpdated",
    "decode_event",
    "encode_event",
]

log = logging.getLogger(__name__)


class _Base(msgspec.Struct, kw_only=True, tag_field="type", omit_defaults=False):
    event_id: int = 0
    time_s: float = 0.0


class SessionStateChanged(_Base, tag="session.state"):
    state: str
    previous: str | None = None
    reason: str = ""


class InputReceived(_Base, tag="input.received"):
    """First acknowledgement: the input got sequence number ``seq`` and is queued for the loop."""

    seq: int
    kind: str  # runtime.contract.InputKind: "prompt" (a cut too) | "action" | "audio"


class InputSuperseded(_Base, tag="input.superseded"):
    """A latched input (action or prompt) that a later one replaced before any chunk used it."""

    seq: int
    kind: str
    by_seq: int


class InputLatency(msgspec.Struct, kw_only=True):
    """Where an input's time went (``sessions.latency``): seconds after the server received it,
    per stage; ``None`` where not reached or not timed. ``dropped_frames``: queued media made
    before it that its acknowledgement flushed (never shown)."""

    latched_s: float | None = None
    started_s: float | None = None
    generated_s: float | None = None
    decoded_s: float | None = None
    enqueued_s: float | None = None
    sent_s: float | None = None
    dropped_frames: int = 0


class StartLatency(msgspec.Struct, kw_only=True):
    """A session's first frame (``sessions.latency``): seconds after the session was created."""

    offer_s: float | None = None
    answered_s: float | None = None
    connected_s: float | None = None
    generated_s: float | None = None
    sent_s: float | None = None


class PromptApplied(_Base, tag="prompt.applied"):
    """Second acknowledgement of a prompt: ``chunk``/``pts`` is the first chunk that reflects it."""

    seq: int
    chunk: int
    pts: int  # 90 kHz, generation media time
    mode: PromptMode = PromptMode.SWITCH
    segment: int = 0
    text: str = ""
    latency: InputLatency | None = None  # up to "enqueued"; "input.shown" adds "sent"


class ActionApplied(_Base, tag="action.applied"):
    seq: int
    chunk: int
    pts: int
    latency: InputLatency | None = None


class AudioApplied(_Base, tag="audio.applied"):
    seq: int
    chunk: int
    pts: int
    latency: InputLatency | None = None


class InputShown(_Base, tag="input.shown"):
    """The first frame reflecting input ``seq`` went on the wire with wire PTS ``pts``;
    ``latency`` is its whole breakdown, ``sent_s`` included."""

    seq: int
    kind: str  # "prompt" | "action" | "audio"
    chunk: int
    pts: int
    latency: InputLatency


class ViewerFirstFrame(_Base, tag="viewer.first_frame"):
    """The session's first frame went on the wire (PTS ``pts``), with its start breakdown."""

    pts: int
    latency: StartLatency


class MediaChunk(_Base, tag="media.chunk"):
    """A generated chunk entered the session's media queue.

    ``digest`` is the first 16 hex characters of sha256 over the chunk's uint8 RGB frames
    (``[frames, H, W, 3]``, C order): equal digests mean bit-identical generated frames,
    independent of the lossy video codec.
    """

    chunk: int
    pts_start: int
    frames: int
    segment: int = 0
    fps: int = 0
    digest: str = ""


class ErrorEvent(_Base, tag="error"):
    code: str
    message: str
    seq: int | None = None


class Pong(_Base, tag="pong"):
    t: float


class FeedbackRecorded(_Base, tag="feedback.recorded"):
    feedback_id: int
    rating: int
    chunk: int | None = None


class RoomStateChanged(_Base, tag="livekit.state"):
    """The session's LiveKit participant: ``connecting``, ``connected``, ``reconnecting``,
    ``reconnected`` or ``disconnected``; ``reason`` is the SDK's (e.g. ``ROOM_DELETED``)."""

    state: str
    room: str
    reason: str = ""


class JobStateChanged(_Base, tag="job.state"):
    state: str
    previous: str | None = None
    error: str | None = None


class JobProgress(_Base, tag="job.progress"):
    progress: float  # 0..1
    done: int
    total: int


class JobArtifact(_Base, tag="job.artifact"):
    media_type: str
    size_bytes: int


class JobPreview(_Base, tag="job.preview"):
    """Frames a program's stream node received (``preview``: the tiny decoder's), as they are
    decoded: their place in the clip and the last of them as a JPEG."""

    stream: str
    frame_start: int
    num_frames: int
    pts_90k: int
    width: int
    height: int
    jpeg_b64: str  # the last frame of the piece, base64 JPEG


class WeightsUpdated(_Base, tag="weights.updated"):
    """The model's weights changed (a weight sync): chunks from ``chunk`` on are made by
    ``weights_version`` (the previous one made the chunks before it)."""

    weights_version: str
    previous: str
    chunk: int


class ModelSleep(_Base, tag="model.sleep"):
    """``components`` of the session's model went to sleep (``asleep``) or woke up: while one
    sleeps, the session's loop stands still at a step boundary and resumes where it stood."""

    components: list[str]
    asleep: bool


Event = (
    SessionStateChanged
    | InputReceived
    | InputSuperseded
    | PromptApplied
    | ActionApplied
    | AudioApplied
    | InputShown
    | ViewerFirstFrame
    | MediaChunk
    | ErrorEvent
    | Pong
    | FeedbackRecorded
    | RoomStateChanged
    | JobStateChanged
    | JobProgress
    | JobArtifact
    | JobPreview
    | WeightsUpdated
    | ModelSleep
)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode_event(event: Event) -> bytes:
    """The JSON wire form (``{"type": ..., ...}``) used on SSE, the data channel and in SQLite."""
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event:
    """Inverse of ``encode_event``; raises ``msgspec.ValidationError`` naming the bad field."""
    return _decoder.decode(data)


class Subscription:
    """One reader of an EventStream: ``async for event in subscription``.

    Iteration ends when the stream closes or this subscription is closed/overflows.
    ``close()`` is idempotent.
    """

    def __init__(self, stream: EventStream, backlog: list[Event], max_backlog: int) -> None:
        self._stream = stream
        self._queue: collections.deque[Event] = collections.deque(backlog)
        self._max_backlog = max_backlog
        self._wakeup = asyncio.Event()
        self._closed = False
        self.overflowed = False
        if backlog:
            self._wakeup.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def _offer(self, event: Event) -> None:
        if self._closed:
            return
        if len(self._queue) >= self._max_backlog:
            log.warning("event subscriber fell %d events behind; closing it", self._max_backlog)
            self.overflowed = True
            self.close()
            return
        self._queue.append(event)
        self._wakeup.set()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        self._stream._forget(self)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    async def next(self, timeout_s: float | None = None) -> Event | None:
        """The next event, or None on timeout or when the subscription has ended."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout_s)
        except (StopAsyncIteration, TimeoutError):
            return None


class EventStream:
    """The ordered event stream of one session or job.

    ``publish`` stamps ``event_id`` (1, 2, 3 …) and ``time_s``, keeps the last ``history``
    events for late subscribers (``subscribe(after_id=...)`` replays what it still has) and
    hands the event to every live subscriber and sink, in publish order. Sinks are plain
    callables (e.g. persistence) and must not block; a sink that raises is logged and kept.
    """

    def __init__(
        self,
        *,
        history: int = 512,
        max_backlog: int = 1024,
        clock: Callable[[], float] = time.time,
        first_id: int = 1,
    ) -> None:
        self._history: collections.deque[Event] = collections.deque(maxlen=history)
        self._subscribers: list[Subscription] = []
        self._sinks: list[Callable[[Event], None]] = []
        self._max_backlog = max_backlog
        self._clock = clock
        self._next_id = first_id  # > 1: a resumed session's stream goes on after its stored one
        self.first_id = first_id
        self._closed = False

    @property
    def last_id(self) -> int:
        return self._next_id - 1

    @property
    def closed(self) -> bool:
        return self._closed

    def add_sink(self, sink: Callable[[Event], None]) -> None:
        self._sinks.append(sink)

    def publish(self, event: Event) -> Event:
        """Stamp and deliver ``event``; returns it. Publishing to a closed stream is a no-op."""
        if self._closed:
            log.debug("dropping %s published after close", type(event).__name__)
            return event
        event.event_id = self._next_id
        event.time_s = self._clock()
        self._next_id += 1
        self._history.append(event)
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, type(event).__name__)
        for subscriber in list(self._subscribers):
            subscriber._offer(event)
        return event

    def subscribe(self, *, after_id: int | None = None) -> Subscription:
        """A new reader; with ``after_id`` it first replays retained events with larger ids.

        Subscribing to a closed stream yields the retained events and then ends.
        """
        backlog = [] if after_id is None else [e for e in self._history if e.event_id > after_id]
        subscription = Subscription(self, backlog, self._max_backlog)
        if self._closed:
            subscription._closed = True
            subscription._wakeup.set()
        else:
            self._subscribers.append(subscription)
        return subscription

    def history(self) -> list[Event]:
        return list(self._history)

    def close(self) -> None:
        """Ends every subscription after it drains what it already holds. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for subscriber in list(self._subscribers):
            subscriber.close()

    def _forget(self, subscription: Subscription) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)
