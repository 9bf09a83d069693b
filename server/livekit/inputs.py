"""Inputs from a LiveKit room to its session, and the session's events back to the room.

Control: data packets and text streams on ``dreamrt.control`` carry the messages of the
WebRTC ``control`` data channel and go through the same ``ControlInbox`` (msgspec validation,
size limit, one token bucket per sending participant). The two-phase acks of an accepted input
(``input.received`` at once, ``prompt.applied`` / ``action.applied`` / ``input.superseded``
later) and a ``pong`` go back to the sender only, on the same topic; events without a sequence
number (``session.state``, ``media.chunk``, ``error`` …) go to the whole room. Outgoing
messages queue in a bounded outbox (``outbox_capacity``; the oldest is dropped and counted when
the room cannot keep up), so a slow room never slows the session.

Audio: every participant's audio track (or only ``audio_identity``'s) feeds the session's
audio input when its card has ``input.audio``: 16 kHz mono blocks from ``rtc.AudioStream``
(bounded by the room adapter) are pushed every ``AUDIO_PUSH_S`` seconds; pushes stop while the
session accepts no inputs.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence

import numpy as np

from runtime.task_set import TaskSet
from server.live.control_inbox import ControlInbox
from server.livekit.room import AUDIO_RATE_HZ, CONTROL_TOPIC, RoomConnection
from sessions.audio import AudioClip
from sessions.events import encode_event
from sessions.session import Session
from sessions.store import Store

__all__ = ["AUDIO_PUSH_S", "RoomInputs"]

log = logging.getLogger(__name__)

AUDIO_PUSH_S = 0.5
_MAX_ROUTED = 4096  # seq -> sender entries kept for acks still to come


class RoomInputs:
    """Control messages and audio from ``room`` to ``session``; events back (module doc)."""

    def __init__(
        self,
        session: Session,
        room: RoomConnection,
        *,
        store: Store | None,
        control_rate_per_s: float = 30.0,
        control_burst: int = 60,
        audio_identity: str | None = None,
        topic: str = CONTROL_TOPIC,
        outbox_capacity: int = 256,
    ) -> None:
        self.session = session
        self._room = room
        self._store = store
        self._rate = control_rate_per_s
        self._burst = control_burst
        self._audio_identity = audio_identity
        self._topic = topic
        self._inboxes: dict[str, ControlInbox] = {}
        self._routes: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._outbox: collections.deque[tuple[bytes, tuple[str, ...]]] = collections.deque(
            maxlen=outbox_capacity
        )
        self._outbox_ready = asyncio.Event()
        self._subscription = session.events.subscribe(after_id=session.events.last_id)
        self._tasks = TaskSet(log, f"session {session.id}")
        self._closed = False
        self.messages_in = 0
        self.outbox_dropped = 0
        self.audio_tracks = 0

    def start(self) -> None:
        self._spawn(self._forward_events(), "events")
        self._spawn(self._drain_outbox(), "outbox")

    # ---------------------------------------------------------------- control

    def on_data(self, payload: bytes, sender: str) -> None:
        if self._closed:
            return
        self.messages_in += 1
        inbox = self._inboxes.get(sender)
        if inbox is None:
            inbox = self._inboxes[sender] = ControlInbox(
                self.session,
                store=self._store,
                reply=lambda data: self._post(data, (sender,)),
                rate_per_s=self._rate,
                burst=self._burst,
            )
        seq = inbox.handle(payload)
        if seq is not None:
            self._route(seq, sender)

    def _route(self, seq: int, sender: str) -> None:
        self._routes[seq] = sender
        while len(self._routes) > _MAX_ROUTED:
            self._routes.popitem(last=False)

    def _post(self, payload: bytes, to: Sequence[str]) -> None:
        if len(self._outbox) == self._outbox.maxlen:
            self.outbox_dropped += 1
        self._outbox.append((payload, tuple(to)))
        self._outbox_ready.set()

    async def _forward_events(self) -> None:
        try:
            async for event in self._subscription:
                seq = getattr(event, "seq", None)
                sender = self._routes.get(seq) if seq is not None else None
                self._post(encode_event(event), () if sender is None else (sender,))
        finally:
            self._subscription.close()

    async def _drain_outbox(self) -> None:
        while True:
            await self._outbox_ready.wait()
            while self._outbox:
                payload, to = self._outbox.popleft()
                try:
                    await self._room.send(payload, topic=self._topic, to=to)
                except Exception as exc:  # noqa: BLE001 - a lost ack must not end the bridge
                    log.warning("session %s: LiveKit send failed: %s", self.session.id, exc)
            self._outbox_ready.clear()

    async def flush(self, timeout_s: float = 1.0) -> None:
        """The session ended: let its last events (``closing``, ``closed``) reach the room."""
        forwarders = [t for t in self._tasks if t.get_name().endswith("-events")]
        if forwarders:
            await asyncio.wait(forwarders, timeout=timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._outbox and loop.time() < deadline:
            await asyncio.sleep(0.01)

    # ---------------------------------------------------------------- audio

    def wants_audio(self, identity: str) -> bool:
        """Whether a track of ``identity`` feeds the session (the room subscribes only then)."""
        return (
            not self._closed
            and "input.audio" in self.session.config.capabilities
            and (self._audio_identity is None or identity == self._audio_identity)
        )

    def on_audio(self, identity: str, blocks: AsyncIterator[np.ndarray]) -> None:
        self.audio_tracks += 1
        self._spawn(self._ingest_audio(identity, blocks), "audio")

    async def _ingest_audio(self, identity: str, blocks: AsyncIterator[np.ndarray]) -> None:
        push_n = int(AUDIO_PUSH_S * AUDIO_RATE_HZ)
        pending: list[np.ndarray] = []
        pending_n = 0
        async for block in blocks:  # block: [n] float32 16 kHz mono
            pending.append(block)
            pending_n += block.shape[0]
            if pending_n < push_n:
                continue
            samples = np.clip(np.concatenate(pending), -1.0, 1.0)
            pending, pending_n = [], 0
            if self.session.accepts_inputs:
                self._route(self.session.push_audio(AudioClip(samples, AUDIO_RATE_HZ, 1)), identity)

    # ---------------------------------------------------------------- lifecycle

    def _spawn(self, coro: Coroutine[object, None, None], what: str) -> None:
        self._tasks.spawn(coro, f"peer-{self.session.id}-livekit-{what}")

    async def close(self) -> None:
        """Ends the forwarding and audio tasks (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._subscription.close()
        await self._tasks.close()
        for inbox in self._inboxes.values():
            await inbox.close()
