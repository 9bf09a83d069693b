"""A realtime session: one engine loop ("chunk_rollout"), its lifecycle, viewers and playout.

Lifecycle (``sessions.states``): ``created`` on admission; ``negotiating`` while a WebRTC offer
is answered; ``live`` once the viewer's video track is first pulled; ``paused`` on request or
when the viewer leaves; ``closing -> closed`` on DELETE or when the loop completes; ``failed``
when the loop fails. Every transition goes through ``_transition`` (checked against the table,
logged ``old -> new``, published as ``session.state``, persisted).

The loop is spawned at admission and **paused until a viewer pulls the track**: no GPU time is
spent on frames nobody will see. The deadline anchor is set at that first pull and then follows
the actual playout (``sessions.playout``); every move is forwarded to the engine.

The session itself is a facade for that lifecycle and its viewers; the rest is two parts
(docs/architecture.md §5) and what they use:

- ``ledger`` (``sessions.input_ledger``): the life of an input of every kind - checked,
  numbered, sent to the loop, acknowledged twice, superseded, its time to steer started;
  prompts in ``prompts`` (``sessions.prompt_memory``);
- ``chunks`` (``sessions.chunk_stream``): the loop's emissions - frames into the bounded
  drop-oldest ``media`` queue at once, a changing input's flush, then ``media.chunk`` (with a
  digest hashed off the event loop), one behaviour record per chunk (``records``) and the
  ledger's acknowledgements, in emission order;
- ``latency`` (``sessions.latency``): where the time to steer goes, per input (on
  ``*.applied`` and ``input.shown``) and at the session's start (``viewer.first_frame``);
- ``sessions.loop_watch`` and ``sessions.persistence``: the loop's end (and, for a fork choice,
  its move to another session), and the store writes, shared with ``sessions.job``.

Event-loop thread only (the engine calls ``on_emission`` there). A failed loop publishes an
``error`` event and the session becomes ``failed``; an exception while handling an emission is
logged and reported as an ``error`` event without touching the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from runtime.contract import Emission, InputEvent, LoopResult
from sessions.audio import AudioClip
from sessions.chunk_stream import ChunkStream
from sessions.events import ErrorEvent, Event, EventStream, SessionStateChanged
from sessions.input_ledger import (
    InputLedger,
    InvalidInputError,
    PromptTooLongError,
    UnsupportedInputError,
)
from sessions.latency import SessionLatency
from sessions.loop_handle import LoopHandleLike
from sessions.loop_watch import LoopWatch
from sessions.media_queue import MediaFrame, MediaQueue
from sessions.persistence import SESSION_EVENT_TYPES, Persistence
from sessions.playout import Playout
from sessions.prompt_memory import PromptMemory
from sessions.recording import Recording
from sessions.records import ChunkRecorder, frames_digest
from sessions.session_config import SessionConfig
from sessions.states import (
    SESSION_TERMINAL,
    SessionClosedError,
    SessionState,
    SessionStateError,
    check_session_transition,
)
from sessions.store import Store

__all__ = [
    "InvalidInputError",
    "PromptTooLongError",
    "Session",
    "SessionClosedError",
    "SessionConfig",
    "SessionStateError",
    "UnsupportedInputError",
]

log = logging.getLogger(__name__)


class Session:
    """See the module docstring. Construct, then ``attach`` the engine handle."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        media_capacity_frames: int,
        store: Store | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        recording: Recording | None = None,
        first_event_id: int = 1,
    ) -> None:
        self.config = config
        self.id = config.session_id
        self._clock = clock
        self.created_at = wall_clock()
        self._persistence = Persistence(
            store, self.id, row="session", event_types=SESSION_EVENT_TYPES
        )
        self.events = EventStream(clock=wall_clock, first_id=first_event_id)
        self.events.add_sink(self._persistence.event)
        self.media = MediaQueue(media_capacity_frames)
        self.prompts = PromptMemory(config.prompt, received_s=self.created_at)
        self._state = SessionState.CREATED
        self.records = ChunkRecorder(
            store,
            session_id=config.session_id,
            model_id=config.model_id,
            seed=config.seed,
            template=config.record_template,
            recording=recording,
        )
        self.loop_watch = LoopWatch(f"session {self.id}")
        self.latency = SessionLatency(clock, clock())  # time to steer: per input and at start
        self.hold_after_first_chunk = False  # "start": "now": generate chunk 0, then wait
        self.chunks = ChunkStream(
            f"session {self.id}",
            media=self.media,
            events=self.events,
            records=self.records,
            prompts=self.prompts,
            latency=self.latency,
            hash_frames=frames_digest,
            on_applied=lambda *applied: self.ledger.applied(*applied),
            on_chunk=self._chunk_made,
            on_error=self._emission_failed,
        )
        self.ledger = InputLedger(
            model_id=config.model_id,
            capabilities=config.capabilities,
            events=self.events,
            prompts=self.prompts,
            records=self.records,
            latency=self.latency,
            chunks=self.chunks,
            require_open=self._require_open,
            send=self._send,
            clock=clock,
            wall=wall_clock,
            action_validator=config.action_validator,
            backlog=lambda: getattr(self.handle, "pending_inputs", 0),
            max_pending=config.max_pending_inputs,
            max_prompt_chars=config.max_prompt_chars,
        )
        self._viewers: set[object | None] = set()  # sinks pulling video (None: WebRTC)
        self._unwatched_since: float | None = clock()  # no viewer and no offer in progress since
        self.playout = Playout(config.fps, clock=clock)
        self._playing = asyncio.Event()  # set while live or terminal: wakes the track
        self.error: str | None = None
        self.held: str | None = None  # why it may not resume (its fork candidates exist)
        self.events.publish(SessionStateChanged(state=self._state.value))

    # ---------------------------------------------------------------- lifecycle

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def terminal(self) -> bool:
        return self._state in SESSION_TERMINAL

    @property
    def accepts_inputs(self) -> bool:
        return self._state not in SESSION_TERMINAL and self._state is not SessionState.CLOSING

    @property
    def handle(self) -> LoopHandleLike | None:
        return self.loop_watch.handle

    def _transition(self, target: SessionState, reason: str = "") -> None:
        old = self._state
        check_session_transition(f"session {self.id}", old, target)
        self._state = target
        if target is SessionState.LIVE or target in SESSION_TERMINAL:
            self._playing.set()
        else:
            self._playing.clear()
        why = f" ({reason})" if reason else ""
        log.info("session %s: %s -> %s%s", self.id, old.value, target.value, why)
        self.events.publish(
            SessionStateChanged(state=target.value, previous=old.value, reason=reason)
        )
        self._persistence.update(state=target.value, error=self.error)

    def attach(
        self, handle: LoopHandleLike, *, on_finished: Callable[[Session], None] | None = None
    ) -> None:
        """Binds the engine's loop handle (spawned paused) and starts watching its result."""
        if self.loop_watch.handle is not None:
            raise SessionStateError(
                f"session {self.id} already has loop {self.loop_watch.handle.loop_id!r}"
            )
        self.records.bind(handle)
        self.loop_watch.attach(
            handle,
            self,
            settle=self.chunks.drain,  # every chunk emitted is published before the end
            on_finished=None if on_finished is None else lambda: on_finished(self),
        )

    # LoopOutcome: how the loop's end moves the session (sessions.loop_watch)

    async def loop_completed(self, result: LoopResult) -> None:
        if self.accepts_inputs:
            self._transition(SessionState.CLOSING, "loop complete")

    def loop_cancelled(self, reason: str) -> None:
        if self.accepts_inputs:
            self._transition(SessionState.CLOSING, f"loop cancelled: {reason}")

    def loop_failed(self, code: str, message: str) -> None:
        self._fail(code, message)

    def loop_raised(self, exc: Exception) -> None:
        self._fail("internal", repr(exc))

    def loop_ended(self) -> None:
        if self._state is SessionState.CLOSING:
            self._transition(SessionState.CLOSED)
        self._shutdown_streams()

    def _fail(self, code: str, message: str) -> None:
        if self.terminal:
            return
        self.error = f"{code}: {message}"
        self.events.publish(ErrorEvent(code=code, message=message))
        self._transition(SessionState.FAILED, code)

    def _shutdown_streams(self) -> None:
        self.records.flush()
        self.media.close()
        self._persistence.update(
            frames_sent=self.frames_sent,
            stalls=self.stalls,
            fps_measured=self.fps_measured(),
            segment=self.chunks.segment,
        )
        self.events.close()

    def fail(self, code: str, message: str) -> None:
        """Something the session depends on outside the engine failed (e.g. its LiveKit room):
        ``error`` event, ``failed``, and the loop is cancelled (its slab and reservation are
        returned when it ends). No-op once terminal."""
        if self.terminal:
            return
        self._fail(code, message)
        if self.handle is None:
            self._shutdown_streams()
            self.loop_watch.finish()
            return
        self.handle.cancel(f"{code}: {message}")

    async def close(self, reason: str = "deleted") -> None:
        """Cancels the loop and waits until the session is closed. Idempotent."""
        if self._state is SessionState.CLOSING or self.terminal:
            await self.loop_watch.wait()
            return
        self._transition(SessionState.CLOSING, reason)
        if self.handle is None:
            self._transition(SessionState.CLOSED)
            self._shutdown_streams()
            self.loop_watch.finish()
            return
        self.handle.cancel(reason)
        await self.loop_watch.wait()

    async def wait_finished(self) -> None:
        await self.loop_watch.wait()

    # ---------------------------------------------------------------- viewer and playout

    def begin_negotiation(self) -> None:
        """An offer arrived (created or paused -> negotiating)."""
        if not self.accepts_inputs:
            raise SessionClosedError(f"session {self.id} is {self._state.value}")
        self._check_not_held("take a viewer")
        if self._state is SessionState.LIVE and self._viewers:
            # another sink (a LiveKit room) keeps it live; the new viewer just joins
            self._unwatched_since = None
            return
        self._transition(SessionState.NEGOTIATING, "offer")
        self._unwatched_since = None

    def negotiation_failed(self, reason: str) -> None:
        """The offer could not be answered: back to where the session was before it."""
        if self._state is SessionState.NEGOTIATING:
            previous = SessionState.PAUSED if self.chunks_generated else SessionState.CREATED
            self._transition(previous, f"offer failed: {reason}")
            self._unwatched_since = self._clock()

    def viewer_started(self, viewer: object | None = None) -> None:
        """A sink's video was pulled for the first time: anchor deadlines, run, go live.
        ``viewer`` names the sink (None: the WebRTC viewer)."""
        if self._state is not SessionState.NEGOTIATING:
            if self._state is SessionState.LIVE:
                self._viewers.add(viewer)
            log.debug("session %s: viewer started in state %s", self.id, self._state.value)
            return
        self._viewers.add(viewer)
        self._anchor_now()
        if self.handle is not None:
            self.handle.resume()
        self._transition(SessionState.LIVE, "viewer connected")

    def viewer_left(
        self, reason: str = "viewer disconnected", viewer: object | None = None
    ) -> None:
        """A sink ended (None: the WebRTC viewer): when it was the last one, stop generating
        until a new viewer arrives."""
        self._viewers.discard(viewer)
        if self._viewers and self._state is SessionState.LIVE:
            log.info(
                "session %s: %s; %d sink(s) still watching", self.id, reason, len(self._viewers)
            )
            return
        self._unwatched_since = self._clock()
        if self._state in (SessionState.LIVE, SessionState.NEGOTIATING):
            if self.handle is not None:
                self.handle.pause()
            self._transition(SessionState.PAUSED, reason)

    def pause(self, reason: str = "requested") -> None:
        if self._state is SessionState.PAUSED:
            return
        if self._state is not SessionState.LIVE:
            raise SessionStateError(
                f"session {self.id} is {self._state.value}; only a live session can pause"
            )
        if self.handle is not None:
            self.handle.pause()
        self._transition(SessionState.PAUSED, reason)

    def resume(self) -> None:
        if self._state is SessionState.LIVE:
            return
        if self._state is not SessionState.PAUSED:
            raise SessionStateError(
                f"session {self.id} is {self._state.value}; only a paused session can resume"
            )
        if not self._viewers:
            raise SessionStateError(f"session {self.id} has no viewer; send a new offer to resume")
        self._check_not_held("resume")
        self._anchor_now()
        if self.handle is not None:
            self.handle.resume()
        self._transition(SessionState.LIVE, "requested")

    def unwatched_for_s(self) -> float:
        """Seconds without a viewer or an offer in progress (0 while watched)."""
        return 0.0 if self._unwatched_since is None else self._clock() - self._unwatched_since

    @property
    def playing(self) -> bool:
        """The track should advance (live); otherwise it holds the last frame without stalls."""
        return self._state is SessionState.LIVE

    async def wait_playing(self) -> None:
        """Returns once the session is live (or terminal: the track then ends)."""
        await self._playing.wait()

    @property
    def playout_anchor_s(self) -> float | None:
        """Monotonic time at which media PTS 0 is (or would have been) on the wire."""
        return self.playout.anchor_s

    @property
    def frames_sent(self) -> int:
        return self.playout.frames_sent

    @property
    def stalls(self) -> int:
        return self.playout.stalls

    def fps_measured(self) -> float:
        return self.playout.fps_measured()

    def frame_shown(self, frame: MediaFrame | None, shown_s: float) -> None:
        """The track put a frame on the wire: ``frame`` is fresh, None a repeat (a stall)."""
        moved = self.playout.shown(None if frame is None else frame.pts_90k, shown_s)
        if moved is not None and self.handle is not None:
            self.handle.set_media_t0(moved)
        if frame is not None:  # measured now, published after the *.applied it completes
            for event in self.latency.frame_sent(frame.pts_90k, shown_s):
                self.chunks.after(functools.partial(self.events.publish, event))

    def _anchor_now(self) -> None:
        """Deadlines restart from now at the next frame to show (first pull, resume)."""
        head = self.media.peek()
        anchor = self.playout.anchor_next(
            None if head is None else head.pts_90k, self.media.last_pts
        )
        if self.handle is not None:
            self.handle.set_media_t0(anchor)

    # ---------------------------------------------------------------- inputs

    def _require_open(self) -> None:
        if not self.accepts_inputs:
            raise SessionClosedError(
                f"session {self.id} is {self._state.value}; it accepts no inputs"
            )

    def _send(self, event: InputEvent) -> None:
        if self.handle is not None:
            self.handle.push_input(event)

    def push_prompt(self, text: str, mode: Literal["switch", "cut"] = "switch") -> tuple[int, int]:
        """Queues a prompt; returns ``(seq, applies_at_chunk)`` (``InputLedger.prompt``)."""
        return self.ledger.prompt(text, mode)

    def push_action(self, keys: list[str], mouse: tuple[float, float] | None = None) -> int:
        return self.ledger.action(keys, mouse)

    def push_audio(self, clip: AudioClip) -> int:
        """Queues 16 kHz mono audio; the samples travel as the ndarray they are."""
        return self.ledger.audio(clip)

    def report_error(self, code: str, message: str, seq: int | None = None) -> None:
        """Publishes an ``error`` event (e.g. a malformed control message); the session goes on."""
        self.events.publish(ErrorEvent(code=code, message=message, seq=seq))

    def publish(self, event: Event) -> Event:
        return self.events.publish(event)

    # ---------------------------------------------------------------- emissions from the loop

    def on_emission(self, emission: Emission) -> None:
        """The engine's ``on_emit`` callback (event-loop thread; ``sessions.chunk_stream``).
        Never raises."""
        self.chunks.take(emission, playable=not self.terminal)

    def _chunk_made(self) -> None:
        if self.hold_after_first_chunk:  # "start": "now": chunk 0 is made, wait for a viewer
            self.hold_after_first_chunk = False
            if not self._viewers and self.handle is not None:
                self.handle.pause()

    def _emission_failed(self, exc: Exception) -> None:
        log.error("session %s: an emission failed: %r", self.id, exc)
        self.report_error("emission", f"{type(exc).__name__}: {exc}")

    async def settle(self) -> None:
        """Returns once every emission so far took effect (digests are hashed off the loop)."""
        await self.chunks.drain()

    @property
    def last_chunk(self) -> int:
        return self.chunks.last_chunk

    @property
    def chunks_generated(self) -> int:
        return self.chunks.chunks_generated

    # ---------------------------------------------------------------- fork support
    # (sessions.forks moves loops through ``loop_watch`` and inputs through ``ledger``)

    @property
    def has_viewer(self) -> bool:
        return bool(self._viewers)

    def _check_not_held(self, action: str) -> None:
        if self.held is not None:
            raise SessionStateError(f"session {self.id} cannot {action}: {self.held}")

    # ---------------------------------------------------------------- views

    def snapshot(self) -> dict[str, Any]:
        """The body of ``GET /v1/sessions/{id}``."""
        return {
            "id": self.id,
            "state": self._state.value,
            "prompt": self.prompts.active_text,
            "segment": self.chunks.segment,
            "frames_sent": self.frames_sent,
            "stalls": self.stalls,
            "fps_measured": round(self.fps_measured(), 3),
            "created_at": self.created_at,
            "model": self.config.model_id,
            "decoder": self.config.decoder,
            "profile": {
                "fps": self.config.fps,
                "width": self.config.width,
                "height": self.config.height,
            },
            "chunks": self.chunks_generated,
            "media_dropped": self.media.dropped_overflow,
            "media_flushed": self.media.dropped_flush,
            "audio_seconds_in": round(self.ledger.audio_seconds_in, 3),
            "error": self.error,
        }
