"""Applies control messages from one peer to its session: the one path shared by the WebRTC
``control`` data channel and the LiveKit ``dreamrt.control`` topic.

``handle(message)`` runs the message through the peer's ``TokenBucket`` and
``server.live.control.decode_control`` (size limit, msgspec validation) and applies it: prompts and
actions to the session's input ledger (which checks them: the prompt limit, the capability),
pause/resume to the session; ``ping`` is answered with a ``pong`` through ``reply``;
feedback is stored (a background task) and published as ``feedback.recorded``. A refused or
malformed message becomes an ``error`` event on the session's stream; the session goes on.
Messages over the rate are dropped and answered together: at most one ``rate_limited`` error
per second, naming how many were dropped since the last one, so a flooding peer costs the
session a bounded number of events (and store rows), however fast it sends.
It returns the sequence number of an accepted input (prompt, action), so the caller can route
that input's two-phase acks (``input.received``, then ``*.applied``) back to the sender.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from runtime.task_set import TaskSet
from server.live.control import (
    MAX_MESSAGE_BYTES,
    ActionMessage,
    ControlError,
    FeedbackMessage,
    PauseMessage,
    PingMessage,
    PromptMessage,
    ResumeMessage,
    TokenBucket,
    decode_control,
)
from sessions.events import FeedbackRecorded, Pong, encode_event
from sessions.session import (
    PromptTooLongError,
    Session,
    SessionStateError,
    UnsupportedInputError,
)
from sessions.store import Store

__all__ = ["ControlInbox"]

log = logging.getLogger(__name__)


class ControlInbox:
    """Rate limit + validation + application of one peer's control messages (module doc)."""

    def __init__(
        self,
        session: Session,
        *,
        store: Store | None,
        reply: Callable[[bytes], None],
        rate_per_s: float = 30.0,
        burst: int = 60,
        max_bytes: int = MAX_MESSAGE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self._store = store
        self._reply = reply
        self._clock = clock
        self.bucket = TokenBucket(rate_per_s, burst, clock=clock)
        self.max_bytes = max_bytes
        self._dropped = 0  # over the rate since the last rate_limited report
        self._reported_s: float | None = None
        self._tasks = TaskSet()

    def handle(self, message: str | bytes) -> int | None:
        """Applies one message; returns the accepted input's seq (prompt/action) or None."""
        session = self.session
        if not self.bucket.take():
            self._rate_limited()
            return None
        try:
            msg = decode_control(message, max_bytes=self.max_bytes)
        except ControlError as exc:
            session.report_error(exc.code, exc.message)
            return None
        try:
            return self._apply(msg)
        except PromptTooLongError as exc:
            session.report_error("prompt_too_long", str(exc))
            return None
        except (UnsupportedInputError, SessionStateError, ValueError) as exc:
            session.report_error("rejected", str(exc))
            return None

    def _rate_limited(self) -> None:
        self._dropped += 1
        now = self._clock()
        if self._reported_s is not None and now - self._reported_s < 1.0:
            return
        self.session.report_error(
            "rate_limited",
            f"more than {self.bucket.rate_per_s:g} control messages per second: "
            f"{self._dropped} dropped",
        )
        self._reported_s, self._dropped = now, 0

    def _apply(self, msg: Any) -> int | None:
        session = self.session
        if isinstance(msg, PromptMessage):
            return session.push_prompt(msg.text, msg.mode)[0]
        if isinstance(msg, ActionMessage):
            return session.push_action(msg.keys, msg.mouse)
        if isinstance(msg, PingMessage):
            self._reply(encode_event(Pong(t=msg.t)))
        elif isinstance(msg, PauseMessage):
            session.pause()
        elif isinstance(msg, ResumeMessage):
            session.resume()
        elif isinstance(msg, FeedbackMessage):
            self._tasks.spawn(self._record_feedback(msg), f"peer-{session.id}-feedback")
        return None

    async def _record_feedback(self, msg: FeedbackMessage) -> None:
        if self._store is None:
            return
        chunk = msg.chunk if msg.chunk is not None else max(self.session.last_chunk, 0)
        feedback_id = await self._store.run(
            self._store.add_feedback,
            session_id=self.session.id,
            rating=msg.rating,
            chunk=chunk,
            note=msg.note,
        )
        self.session.publish(
            FeedbackRecorded(feedback_id=feedback_id, rating=msg.rating, chunk=chunk)
        )

    async def close(self) -> None:
        """Cancels feedback writes still in flight (idempotent)."""
        await self._tasks.close()
