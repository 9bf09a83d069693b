"""The input ledger of one session: the life of an input of every kind, from its receipt to
its acknowledgement.

    received   checked (the prompt's length, the card's capability for its kind or prompt mode,
               the model's check of an action), the session open, the loop's backlog under
               ``max_pending``; then numbered (the session's next sequence number, ``0`` is
               the initial prompt), its time to steer started (``sessions.latency``), sent to
               the loop as an ``InputEvent`` and ``input.received`` published at once
    applied    the loop reports the first chunk that reflects it (an ``"applied"`` emission,
               handed over by ``sessions.chunk_stream`` with the chunk's segment and the frames
               its flush dropped): its latency is measured at once (its frames are in the media
               queue then); ``prompt.applied`` / ``action.applied`` / ``audio.applied`` with
               that chunk and PTS, and the chunk's behaviour record completed, in emission order
               (after the ``media.chunk`` events before it)
    superseded prompts and actions are latched latest-wins per chunk, so the pending ones of
               the same kind older than an applied one were skipped by the loop: each gets
               ``input.superseded`` and its latency is forgotten (it will never be shown)

A live input is checked here, once, whichever edge it came through: the server's edges (REST,
the data channel, LiveKit) only decode the wire and map these errors to their answers (the
audio route also asks for the capability before it decodes a body, to spare the decode). A
prompt's ``mode`` becomes a
``runtime.contract.PromptMode`` on entry and stays one to the loop and the wire. Prompts
themselves live in prompt memory (``sessions.prompt_memory``), the one ledger of what was
asked; this one keeps only what the record needs of the other inputs until they are applied.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from runtime.contract import (
    ActionInput,
    AppliedMeta,
    AudioInput,
    InputEvent,
    InputKind,
    InputTiming,
    PromptInput,
    PromptMode,
)
from runtime.errors import DreamrtError
from sessions.audio import TARGET_RATE_HZ, AudioClip
from sessions.chunk_stream import ChunkStream
from sessions.events import (
    ActionApplied,
    AudioApplied,
    EventStream,
    InputLatency,
    InputReceived,
    InputSuperseded,
    PromptApplied,
)
from sessions.latency import SessionLatency
from sessions.prompt_memory import PromptMemory
from sessions.records import ChunkRecorder

__all__ = [
    "InputBacklogError",
    "InputLedger",
    "InvalidInputError",
    "PromptTooLongError",
    "UnsupportedInputError",
]

ActionValidator = Callable[[list[str], tuple[float, float]], list[str]]


class UnsupportedInputError(DreamrtError, ValueError):
    """The session's model card does not declare the capability this input needs (a 422;
    ``field`` names the request field that asks for it, if one does)."""

    code = "unsupported_input"
    status = 422


class InputBacklogError(DreamrtError, ValueError):
    """``max_pending`` inputs already wait for the loop (paused or busy): this one is refused
    (429 on REST, an ``error`` event on the data channel) rather than held without bound."""

    code = "input_backlog"
    status = 429
    retry_after_s = 1.0


class InvalidInputError(DreamrtError, ValueError):
    """The input's payload is not one the model accepts (e.g. an unknown action key): a 422
    naming the field."""

    code = "invalid_field"
    status = 422


class PromptTooLongError(InvalidInputError):
    """A prompt over the server's ``max_prompt_chars`` (422 ``prompt_too_long`` on REST, an
    ``error`` event of that code on the data channel)."""


class InputLedger:
    """See the module docstring.

    ``require_open`` raises when the session accepts no more inputs; ``send`` hands an input to
    the loop; ``action_validator`` is the model's check of an action (keys, (dx, dy)) ->
    canonical keys, raising ``ValueError``. ``backlog`` counts the inputs sent that the loop
    has not taken yet, refused from ``max_pending`` on (0: unbounded); ``max_prompt_chars`` is
    the prompt limit. ``clock`` stamps ``received_s`` (monotonic), ``wall`` the prompt memory
    (Unix seconds).
    """

    def __init__(
        self,
        *,
        model_id: str,
        capabilities: frozenset[str],
        events: EventStream,
        prompts: PromptMemory,
        records: ChunkRecorder,
        latency: SessionLatency,
        chunks: ChunkStream,
        require_open: Callable[[], None],
        send: Callable[[InputEvent], None],
        clock: Callable[[], float],
        wall: Callable[[], float],
        action_validator: ActionValidator | None = None,
        backlog: Callable[[], int] = lambda: 0,
        max_pending: int = 0,
        max_prompt_chars: int = 4000,
    ) -> None:
        self._model_id = model_id
        self._capabilities = capabilities
        self._events = events
        self._prompts = prompts
        self._records = records
        self._latency = latency
        self._chunks = chunks
        self._require_open = require_open
        self._send = send
        self._clock = clock
        self._wall = wall
        self._action_validator = action_validator
        self._backlog = backlog
        self.max_pending = max_pending
        self.max_prompt_chars = max_prompt_chars
        self._next_seq = 1
        # seq -> (kind, what the record keeps) of actions and audio until applied
        self._pending: dict[int, tuple[InputKind, Mapping[str, object] | None]] = {}
        self.audio_samples_in = 0
        self.last_input_s = clock()  # when the last input arrived (or the ledger was made)

    # ---------------------------------------------------------------- received

    def prompt(
        self, text: str, mode: PromptMode | Literal["switch", "cut"] = "switch"
    ) -> tuple[int, int]:
        """Queues a prompt (``mode`` switch or cut); returns ``(seq, applies_at_chunk)``.

        ``applies_at_chunk`` is a prediction: a switch lands after the in-flight chunk, a cut
        replaces it. The ``prompt.applied`` event carries the authoritative chunk.
        """
        if len(text) > self.max_prompt_chars:
            raise PromptTooLongError(
                f"prompt is {len(text)} characters; the limit is {self.max_prompt_chars}"
            )
        mode = PromptMode(mode)  # the wire's name, once: the enum from here to the loop
        self._require_capability(
            f"prompt.{mode.value}", f"prompt mode {mode.value!r}", field="mode"
        )
        seq = self._receive(InputKind.PROMPT, PromptInput(text=text, mode=mode))
        in_flight = self._chunks.last_chunk + 1
        return seq, in_flight if mode is PromptMode.CUT else in_flight + 1

    def action(self, keys: list[str], mouse: tuple[float, float] | None = None) -> int:
        """Queues held keys and a mouse move (dx, dy pixels), checked by the model first."""
        self._require_capability("input.action", "actions", field="keys")
        dx, dy = mouse if mouse is not None else (0.0, 0.0)
        keys = list(keys)
        if self._action_validator is not None:
            try:
                keys = self._action_validator(keys, (float(dx), float(dy)))
            except ValueError as exc:
                raise InvalidInputError(str(exc), field="keys") from None
        payload = ActionInput(keys=tuple(keys), mouse=(float(dx), float(dy)))
        return self._receive(InputKind.ACTION, payload, {"keys": keys, "mouse": [*payload.mouse]})

    def audio(self, clip: AudioClip) -> int:
        """Queues 16 kHz mono audio; the samples travel as the ndarray they are."""
        self._require_capability("input.audio", "audio")
        seq = self._receive(
            InputKind.AUDIO, AudioInput(samples=clip.samples), {"seconds": clip.duration_s}
        )
        self.audio_samples_in += clip.samples.shape[0]
        return seq

    @property
    def audio_seconds_in(self) -> float:
        return self.audio_samples_in / TARGET_RATE_HZ

    def _receive(
        self,
        kind: InputKind,
        payload: PromptInput | ActionInput | AudioInput,
        recorded: Mapping[str, object] | None = None,
    ) -> int:
        """Admits a checked input (the session open, the backlog under its limit), numbers it
        and sends it; ``recorded`` is what the behaviour record keeps of an action or audio
        clip until it is applied (a prompt goes to prompt memory)."""
        self._require_open()
        self._check_backlog()
        now = self._clock()
        self.last_input_s = now
        seq = self._next_seq
        self._next_seq += 1
        if isinstance(payload, PromptInput):
            self._prompts.receive(seq, payload.text, payload.mode, received_s=self._wall())
        else:
            self._pending[seq] = (kind, recorded)
        self._latency.received(seq, kind.value)  # before the send: runtime stages count from it
        self._send(InputEvent(kind=kind, seq=seq, payload=payload, received_s=now))
        self._events.publish(InputReceived(seq=seq, kind=kind.value))
        return seq

    def idle_for_s(self) -> float:
        """Seconds since the last input (or since the session began)."""
        return self._clock() - self.last_input_s

    def _check_backlog(self) -> None:
        waiting = self._backlog()
        if self.max_pending and waiting >= self.max_pending:
            raise InputBacklogError(
                f"{waiting} inputs already wait for the loop; the limit is {self.max_pending}"
            )

    def _require_capability(self, capability: str, what: str, field: str | None = None) -> None:
        if capability not in self._capabilities:
            raise UnsupportedInputError(
                f"model {self._model_id!r} does not accept {what} "
                f"(it lacks the {capability!r} capability; "
                f"it has {sorted(self._capabilities)})",
                field=field,
            )

    def inherit(self, parent: InputLedger) -> None:
        """A fork candidate goes on with ``parent``'s prompts, the inputs it has not applied
        yet, its sequence numbers and its segment (the forked loop state holds the same
        inputs)."""
        self._prompts.continue_from(parent._prompts)
        self._chunks.continue_segment(parent._chunks.segment)
        self._pending = dict(parent._pending)
        self._next_seq = parent._next_seq

    # ---------------------------------------------------------------- applied

    def applied(
        self, meta: AppliedMeta, timing: InputTiming | None, segment: int, dropped: int
    ) -> None:
        """The loop's acknowledgement that chunk ``meta.chunk`` (of ``segment``) is the first
        to reflect ``meta.seq``, whose frames just entered the media queue; ``timing``: the
        runtime's stages of the input, ``dropped``: the queued frames its acknowledgement
        flushed (``sessions.chunk_stream`` calls it). The events follow in emission order."""
        latency = self._latency.applied(
            meta.seq, chunk=meta.chunk, pts_90k=meta.pts_90k, timing=timing, dropped=dropped
        )
        self._chunks.after(lambda: self._acknowledge(meta, segment, latency))

    def _acknowledge(self, meta: AppliedMeta, segment: int, latency: InputLatency | None) -> None:
        """Publishes ``*.applied`` (raises ``UnknownPromptError`` for a prompt never received)."""
        kind, seq, chunk, pts = meta.kind, meta.seq, meta.chunk, meta.pts_90k
        if kind is InputKind.PROMPT:
            entry, superseded = self._prompts.apply(
                seq, chunk=chunk, pts_90k=pts, segment=segment, applied_s=self._wall()
            )
            self._supersede(seq, kind, [e.seq for e in superseded])
            recorded: Mapping[str, object] | None = {"text": entry.text}
            self._events.publish(
                PromptApplied(
                    seq=seq,
                    chunk=chunk,
                    pts=pts,
                    mode=PromptMode(entry.mode),  # it was pending: never the initial prompt
                    segment=segment,
                    text=entry.text,
                    latency=latency,
                )
            )
        else:
            if kind is InputKind.ACTION:
                older = [s for s, (k, _) in self._pending.items() if k is kind and s < seq]
                self._supersede(seq, kind, older)
                self._events.publish(ActionApplied(seq=seq, chunk=chunk, pts=pts, latency=latency))
            else:
                self._events.publish(AudioApplied(seq=seq, chunk=chunk, pts=pts, latency=latency))
            _, recorded = self._pending.pop(seq, (kind, None))
        self._records.applied(kind, seq, chunk, recorded)

    def _supersede(self, by_seq: int, kind: InputKind, seqs: list[int]) -> None:
        for older in sorted(seqs):
            self._pending.pop(older, None)
            self._latency.forget(older)
            self._events.publish(InputSuperseded(seq=older, kind=kind.value, by_seq=by_seq))
