"""A realtime session: one engine loop ("chunk_rollout"), its inputs, media, events and records.

Lifecycle (``sessions.states``): ``created`` on admission; ``negotiating`` while a WebRTC offer
is answered; ``live`` once the viewer's video track is first pulled; ``paused`` on request or
when the viewer leaves; ``closing -> closed`` on DELETE or when the loop completes; ``failed``
when the loop fails. Every transition goes through ``_transition`` (checked against the table,
logged ``old -> new``, published as ``session.state``, persisted).

Wiring (decided, see README "API"):

- The loop is spawned at admission and **paused until a viewer pulls the track**: no GPU time is
  spent on frames nobody will see. The deadline anchor is set at that first pull and then
  follows the actual playout (``sessions.playout``); every move is forwarded to the engine.
- Inputs get the session's next sequence number (``0`` is the initial prompt), an
  ``input.received`` event at once, and reach the loop as ``InputEvent``s. The loop's
  ``"applied"`` emissions become ``prompt.applied`` / ``action.applied`` / ``audio.applied``
  with the chunk and PTS; older pending inputs of the same latched kind that the loop skipped
  (latest wins) get ``input.superseded``. An applied switch or cut flushes the media queue's
  backlog older than the applied PTS.
- ``"media"`` emissions enter the bounded drop-oldest ``MediaQueue`` and publish
  ``media.chunk`` (with a content digest); ``sessions.records`` keeps one record per chunk.

Event-loop thread only (the engine calls ``on_emission`` there). A failed loop publishes an
``error`` event and the session becomes ``failed``; an exception inside ``on_emission`` is
logged and reported as an ``error`` event without touching the loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from runtime.contract import (
    PTS_HZ,
    ActionInput,
    AppliedMeta,
    AudioInput,
    Cancelled,
    Emission,
    InputEvent,
    InputKind,
    LoopFailed,
    MediaMeta,
    PromptInput,
    PromptMode,
    Stream,
    pts_of_frame,
)
from sessions.audio import AudioClip
from sessions.events import (
    ActionApplied,
    AudioApplied,
    ErrorEvent,
    Event,
    EventStream,
    InputReceived,
    InputSuperseded,
    MediaChunk,
    PromptApplied,
    SessionStateChanged,
    encode_event,
)
from sessions.loop_handle import LoopHandleLike
from sessions.media_queue import MediaFrame, MediaQueue
from sessions.playout import Playout
from sessions.prompt_memory import PromptMemory
from sessions.recording import Recording
from sessions.records import ChunkRecorder, frames_digest
from sessions.states import SESSION_TERMINAL, SessionState, check_session_transition
from sessions.store import Store

__all__ = [
    "InvalidInputError",
    "Session",
    "SessionClosedError",
    "SessionConfig",
    "SessionStateError",
    "UnsupportedInputError",
]

log = logging.getLogger(__name__)

# Events written to the store: what is needed to reconstruct the session's story.
_PERSISTED = frozenset(
    {
        "session.state",
        "input.received",
        "input.superseded",
        "prompt.applied",
        "action.applied",
        "audio.applied",
        "error",
        "feedback.recorded",
        "livekit.state",
    }
)


class SessionStateError(RuntimeError):
    """The request does not fit the session's current state (e.g. resume without a viewer)."""


class SessionClosedError(SessionStateError):
    """The session is closing, closed or failed; it accepts no more inputs."""


class UnsupportedInputError(ValueError):
    """The session's model card does not declare the capability this input needs."""


class InvalidInputError(ValueError):
    """The input's payload is not one the model accepts (e.g. an unknown action key)."""


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Static facts of one session, fixed at admission."""

    session_id: str
    model_id: str
    prompt: str
    seed: int
    fps: int
    width: int
    height: int
    priority_class: Literal["realtime", "batch"]
    capabilities: frozenset[str]
    record_template: Mapping[str, Any] = field(
        default_factory=dict
    )  # static behaviour-record fields
    # The model's check of an action (keys, (dx, dy)) -> canonical keys; raises ValueError.
    action_validator: Callable[[list[str], tuple[float, float]], list[str]] | None = None


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
    ) -> None:
        self.config = config
        self.id = config.session_id
        self._store = store
        self._wall = wall_clock
        self._clock = clock
        self.created_at = wall_clock()
        self.events = EventStream(clock=wall_clock)
        self.events.add_sink(self._persist)
        self.media = MediaQueue(media_capacity_frames)
        self.prompts = PromptMemory(config.prompt, received_s=self.created_at)
        self._state = SessionState.CREATED
        self._next_seq = 1
        self._pending: dict[int, tuple[str, Any]] = {}  # seq -> (kind, payload) until applied
        self.records = ChunkRecorder(
            store,
            session_id=config.session_id,
            model_id=config.model_id,
            seed=config.seed,
            template=config.record_template,
            recording=recording,
        )
        self._handle: LoopHandleLike | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._finished = asyncio.Event()
        self._on_finished: list[Callable[[Session], None]] = []
        self._viewers: set[object | None] = set()  # sinks pulling video (None: WebRTC)
        self._unwatched_since: float | None = clock()  # no viewer and no offer in progress since
        self.playout = Playout(config.fps, clock=clock)
        self._playing = asyncio.Event()  # set while live or terminal: wakes the track
        self.last_chunk = -1
        self.chunks_generated = 0
        # the parts so far of a chunk that arrives in parts: (chunk, segment, pts_start, frames)
        self._partial: tuple[int, int, int, np.ndarray] | None = None
        self.audio_samples_in = 0
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

    def _transition(self, target: SessionState, reason: str = "") -> None:
        old = self._state
        check_session_transition(f"session {self.id}", old, target)
        self._state = target
        if target is SessionState.LIVE or target in SESSION_TERMINAL:
            self._playing.set()
        else:
            self._playing.clear()
        log.info(
            "session %s: %s -> %s%s",
            self.id,
            old.value,
            target.value,
            f" ({reason})" if reason else "",
        )
        self.events.publish(
            SessionStateChanged(state=target.value, previous=old.value, reason=reason)
        )
        if self._store is not None:
            self._store.defer(
                self._store.update_session, self.id, state=target.value, error=self.error
            )

    def attach(
        self, handle: LoopHandleLike, *, on_finished: Callable[[Session], None] | None = None
    ) -> None:
        """Binds the engine's loop handle (spawned paused) and starts watching its result."""
        if self._handle is not None:
            raise SessionStateError(f"session {self.id} already has loop {self._handle.loop_id!r}")
        self._handle = handle
        self.records.bind(handle)
        if on_finished is not None:
            self._on_finished.append(on_finished)
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(handle), name=f"session-{self.id}"
        )

    async def _watch(self, handle: LoopHandleLike) -> None:
        try:
            await handle.result()
            outcome: BaseException | None = None
        except Exception as exc:
            outcome = exc
        if handle is not self._handle:  # a fork choice replaced the loop: the new one goes on
            return
        if outcome is None or isinstance(outcome, Cancelled):
            if not self.terminal and self._state is not SessionState.CLOSING:
                why = "loop complete" if outcome is None else f"loop cancelled: {outcome.reason}"
                self._transition(SessionState.CLOSING, why)
        elif isinstance(outcome, LoopFailed):
            self._fail(outcome.code, outcome.message)
        else:
            log.error("session %s: loop result raised %r", self.id, outcome, exc_info=outcome)
            self._fail("internal", repr(outcome))
        self._finish()

    def _finish(self) -> None:
        if self._state is SessionState.CLOSING:
            self._transition(SessionState.CLOSED)
        self._shutdown_streams()
        self._finished.set()
        for callback in self._on_finished:
            try:
                callback(self)
            except Exception:
                log.exception("session %s: on_finished callback failed", self.id)

    def _fail(self, code: str, message: str) -> None:
        if self.terminal:
            return
        self.error = f"{code}: {message}"
        self.events.publish(ErrorEvent(code=code, message=message))
        self._transition(SessionState.FAILED, code)

    def _shutdown_streams(self) -> None:
        self.records.flush()
        self.media.close()
        if self._store is not None:
            self._store.defer(
                self._store.update_session,
                self.id,
                frames_sent=self.frames_sent,
                stalls=self.stalls,
                fps_measured=self.fps_measured(),
                segment=self.prompts.segment,
            )
        self.events.close()

    def fail(self, code: str, message: str) -> None:
        """Something the session depends on outside the engine failed (e.g. its LiveKit room):
        ``error`` event, ``failed``, and the loop is cancelled (its slab and reservation are
        returned when it ends). No-op once terminal."""
        if self.terminal:
            return
        self._fail(code, message)
        if self._handle is None:
            self._shutdown_streams()
            self._finished.set()
            return
        self._handle.cancel(f"{code}: {message}")

    async def close(self, reason: str = "deleted") -> None:
        """Cancels the loop and waits until the session is closed. Idempotent."""
        if self._state is SessionState.CLOSING or self.terminal:
            await self._finished.wait()
            return
        self._transition(SessionState.CLOSING, reason)
        if self._handle is None:
            self._transition(SessionState.CLOSED)
            self._shutdown_streams()
            self._finished.set()
            return
        self._handle.cancel(reason)
        await self._finished.wait()

    async def wait_finished(self) -> None:
        await self._finished.wait()

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
        if self._handle is not None:
            self._handle.resume()
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
            if self._handle is not None:
                self._handle.pause()
            self._transition(SessionState.PAUSED, reason)

    def pause(self, reason: str = "requested") -> None:
        if self._state is SessionState.PAUSED:
            return
        if self._state is not SessionState.LIVE:
            raise SessionStateError(
                f"session {self.id} is {self._state.value}; only a live session can pause"
            )
        if self._handle is not None:
            self._handle.pause()
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
        if self._handle is not None:
            self._handle.resume()
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
        if moved is not None and self._handle is not None:
            self._handle.set_media_t0(moved)

    def _anchor_now(self) -> None:
        """Deadlines restart from now at the next frame to show (first pull, resume)."""
        nxt = self.media.peek()
        last = self.media.last_pts
        if nxt is not None:
            next_pts = nxt.pts_90k
        elif last is not None:
            fps = self.config.fps
            index = -(-last * fps // PTS_HZ)  # ceil: the frame whose PTS is ``last``
            next_pts = pts_of_frame(index + 1, fps)
        else:
            next_pts = 0
        anchor = self.playout.anchor_at(next_pts)
        if self._handle is not None:
            self._handle.set_media_t0(anchor)

    # ---------------------------------------------------------------- inputs

    def _require_open(self) -> None:
        if not self.accepts_inputs:
            raise SessionClosedError(
                f"session {self.id} is {self._state.value}; it accepts no inputs"
            )

    def _push(
        self, kind: InputKind, payload: PromptInput | ActionInput | AudioInput, recorded: Any
    ) -> int:
        """Sends an input to the loop; ``recorded`` is what the behaviour record keeps of it."""
        self._require_open()
        seq = self._next_seq
        self._next_seq += 1
        if self._handle is not None:
            self._handle.push_input(
                InputEvent(kind=kind, seq=seq, payload=payload, received_s=self._clock())
            )
        self._pending[seq] = (kind, recorded)
        self.events.publish(InputReceived(seq=seq, kind=kind.value))
        return seq

    def push_prompt(self, text: str, mode: Literal["switch", "cut"] = "switch") -> tuple[int, int]:
        """Queues a prompt; returns ``(seq, applies_at_chunk)``.

        ``applies_at_chunk`` is a prediction: a switch lands after the in-flight chunk, a cut
        replaces it. The ``prompt.applied`` event carries the authoritative chunk.
        """
        capability = "prompt.cut" if mode == "cut" else "prompt.switch"
        self._require_capability(capability, f"prompt mode {mode!r}")
        self._require_open()
        seq = self._next_seq
        self.prompts.receive(seq, text, mode, received_s=self._wall())
        self._push(InputKind.PROMPT, PromptInput(text=text, mode=PromptMode(mode)), {"text": text})
        in_flight = self.last_chunk + 1
        return seq, in_flight if mode == "cut" else in_flight + 1

    def push_action(self, keys: list[str], mouse: tuple[float, float] | None = None) -> int:
        self._require_capability("input.action", "actions")
        dx, dy = mouse if mouse is not None else (0.0, 0.0)
        keys = list(keys)
        if self.config.action_validator is not None:
            try:
                keys = self.config.action_validator(keys, (float(dx), float(dy)))
            except ValueError as exc:
                raise InvalidInputError(str(exc)) from None
        payload = ActionInput(keys=tuple(keys), mouse=(float(dx), float(dy)))
        return self._push(InputKind.ACTION, payload, {"keys": keys, "mouse": [*payload.mouse]})

    def push_audio(self, clip: AudioClip) -> int:
        """Queues 16 kHz mono audio; the samples travel as the ndarray they are."""
        self._require_capability("input.audio", "audio")
        self.audio_samples_in += clip.samples.shape[0]
        return self._push(
            InputKind.AUDIO, AudioInput(samples=clip.samples), {"seconds": clip.duration_s}
        )

    def _require_capability(self, capability: str, what: str) -> None:
        if capability not in self.config.capabilities:
            raise UnsupportedInputError(
                f"model {self.config.model_id!r} does not accept {what} "
                f"(it lacks the {capability!r} capability; "
                f"it has {sorted(self.config.capabilities)})"
            )

    def report_error(self, code: str, message: str, seq: int | None = None) -> None:
        """Publishes an ``error`` event (e.g. a malformed control message); the session goes on."""
        self.events.publish(ErrorEvent(code=code, message=message, seq=seq))

    def publish(self, event: Event) -> Event:
        return self.events.publish(event)

    # ---------------------------------------------------------------- emissions from the loop

    def on_emission(self, emission: Emission) -> None:
        """The engine's ``on_emit`` callback (event-loop thread). Never raises."""
        try:
            stream = emission.spec.stream
            if stream == Stream.MEDIA:
                self._on_media(emission.spec.meta, emission.output)
            elif stream == Stream.APPLIED:
                self._on_applied(emission.spec.meta)
            elif stream != Stream.PROGRESS:
                log.debug("session %s: ignoring emission stream %r", self.id, stream)
        except Exception as exc:
            log.exception("session %s: emission %r failed", self.id, emission.spec)
            self.report_error("emission", f"{type(exc).__name__}: {exc}")

    def _on_media(self, meta: MediaMeta, output: Any) -> None:
        """Frames go to the media queue at once; a chunk that comes in parts (``final`` False
        on all but its last) is counted, published and recorded once, whole, at its last."""
        frames = np.array(
            output, copy=True
        )  # [n, H, W, 3] uint8, owned: the loop may reuse its buffer
        chunk, segment, fps = meta.chunk, meta.segment, meta.fps
        pts_start = meta.pts_90k
        last_index = meta.frame_start + frames.shape[0] - 1  # of the whole chunk, once final
        if self._state not in SESSION_TERMINAL:
            pts = [pts_of_frame(meta.frame_start + i, fps) for i in range(frames.shape[0])]
            self.media.put_chunk(frames, pts, chunk=chunk, segment=segment)
        earlier = self._partial if self._partial and self._partial[:2] == (chunk, segment) else None
        if earlier is not None:  # join the chunk's earlier parts
            pts_start, frames = earlier[2], np.concatenate((earlier[3], frames))
        if not meta.final:
            self._partial = (chunk, segment, pts_start, frames)
            return
        self._partial = None
        n = frames.shape[0]
        digest = frames_digest(frames)
        self.last_chunk = max(self.last_chunk, chunk)
        self.chunks_generated += 1
        self.events.publish(
            MediaChunk(
                chunk=chunk, pts_start=pts_start, frames=n, segment=segment, fps=fps, digest=digest
            )
        )
        active = self.prompts.active
        self.records.media(
            chunk=chunk,
            segment=segment,
            pts_start=pts_start,
            pts_end=pts_of_frame(last_index, fps),
            num_frames=n,
            digest=digest,
            prompt=active.text,
            prompt_seq=active.seq,
            capture=meta.capture,
            frames=frames,
            fps=fps,
        )

    def _on_applied(self, meta: AppliedMeta) -> None:
        kind, seq, chunk, pts = InputKind(meta.kind), meta.seq, meta.chunk, meta.pts_90k
        if kind is InputKind.PROMPT:
            entry, superseded = self.prompts.apply(
                seq, chunk=chunk, pts_90k=pts, applied_s=self._wall()
            )
            self._supersede(seq, "prompt", [e.seq for e in superseded])
            self.media.flush_before(pts)
            self.events.publish(
                PromptApplied(
                    seq=seq,
                    chunk=chunk,
                    pts=pts,
                    mode=entry.mode,
                    segment=entry.segment or 0,
                    text=entry.text,
                )
            )
        elif kind is InputKind.ACTION:
            older = [s for s, (k, _) in self._pending.items() if k is InputKind.ACTION and s < seq]
            self._supersede(seq, "action", older)
            self.events.publish(ActionApplied(seq=seq, chunk=chunk, pts=pts))
        else:
            self.events.publish(AudioApplied(seq=seq, chunk=chunk, pts=pts))
        _, recorded = self._pending.pop(seq, (kind, None))
        self.records.applied(kind.value, seq, chunk, recorded)

    def _supersede(self, by_seq: int, family: str, seqs: list[int]) -> None:
        for older in sorted(seqs):
            self._pending.pop(older, None)
            self.events.publish(InputSuperseded(seq=older, kind=family, by_seq=by_seq))

    # ---------------------------------------------------------------- fork support
    # (the fork logic lives in sessions.forks; these are the session's own moves)

    @property
    def handle(self) -> LoopHandleLike | None:
        return self._handle

    @property
    def has_viewer(self) -> bool:
        return bool(self._viewers)

    def _check_not_held(self, action: str) -> None:
        if self.held is not None:
            raise SessionStateError(f"session {self.id} cannot {action}: {self.held}")

    def add_finished_callback(self, callback: Callable[[Session], None]) -> None:
        self._on_finished.append(callback)

    def inherit_inputs(self, parent: Session) -> None:
        """A fork candidate continues ``parent``'s inputs: its prompt memory, the inputs still
        waiting for acknowledgement and the sequence numbers (the loop state carries them)."""
        self.prompts = copy.deepcopy(parent.prompts)
        self._pending = dict(parent._pending)
        self._next_seq = parent._next_seq

    def replace_loop(
        self, handle: LoopHandleLike, after_pts: int | None = None
    ) -> LoopHandleLike | None:
        """A fork choice: ``handle`` (the chosen candidate's loop, already emitting to this
        session) carries the session on after the candidate's last PTS ``after_pts`` (so the
        playout anchors at its next frame); returns the old loop for the caller to cancel."""
        old, self._handle = self._handle, handle
        if after_pts is not None:
            self.media.skip_to(after_pts)
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(handle), name=f"session-{self.id}"
        )
        return old

    def release_loop(self, reason: str) -> None:
        """The chosen candidate ends: closing -> closed, its loop goes on (another session
        took it over with ``replace_loop``)."""
        self._handle = None
        if self._state is not SessionState.CLOSING and not self.terminal:
            self._transition(SessionState.CLOSING, reason)
        self._finish()

    # ---------------------------------------------------------------- views

    def snapshot(self) -> dict[str, Any]:
        """The body of ``GET /v1/sessions/{id}``."""
        return {
            "id": self.id,
            "state": self._state.value,
            "prompt": self.prompts.active_text,
            "segment": self.prompts.segment,
            "frames_sent": self.frames_sent,
            "stalls": self.stalls,
            "fps_measured": round(self.fps_measured(), 3),
            "created_at": self.created_at,
            "model": self.config.model_id,
            "profile": {
                "fps": self.config.fps,
                "width": self.config.width,
                "height": self.config.height,
            },
            "chunks": self.chunks_generated,
            "media_dropped": self.media.dropped_overflow,
            "audio_seconds_in": round(self.audio_samples_in / 16_000, 3),
            "error": self.error,
        }

    def _persist(self, event: Event) -> None:
        if self._store is None:
            return
        event_type = type(event).__struct_config__.tag
        if event_type in _PERSISTED:
            self._store.defer(
                self._store.add_event,
                self.id,
                event.event_id,
                event_type,
                encode_event(event),
                event.time_s,
            )
