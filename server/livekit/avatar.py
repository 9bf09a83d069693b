"""The LiveKit Agents avatar convention: dreamrt as the avatar worker of a voice agent.

Names and payloads are those of livekit-agents (``voice/avatar/_datastream_io.py``,
``DataStreamAudioOutput`` on the agent side, ``DataStreamAudioReceiver`` on the worker side;
``voice/room_io``: ``ATTRIBUTE_PUBLISH_ON_BEHALF``):

- the worker joins with participant attribute ``lk.publish_on_behalf`` = the agent's identity
  (set in the token ``server.livekit.token`` mints when the ``livekit`` block has
  ``avatar_of``);
- the agent streams its speech to the worker as one byte stream per speech segment on topic
  ``lk.audio_stream`` (attributes ``sample_rate``, ``num_channels``; payload: interleaved
  int16 PCM), sent to the worker's identity only; the stream's end ends the segment;
- the agent calls RPC ``lk.clear_buffer`` (payload ``""``) on the worker to interrupt; the
  worker answers ``"ok"`` (``"reject"`` to anyone but the agent);
- the worker calls RPC ``lk.playback_started`` (payload ``""``) on the agent when a segment
  starts playing, and ``lk.playback_finished`` with JSON ``{"playback_position": seconds,
  "interrupted": bool}`` when it has played or was cleared.

Here the speech does both jobs of an avatar worker (``server.livekit.speech``): it drives the
video (the session's audio input, 16 kHz mono, for cards with ``input.audio``) and it is
published as the participant's audio track, delayed so that each sample plays with the frames
it drove. ``lk.playback_started`` is sent when the segment's first sample is played out,
``lk.playback_finished`` when its last one was (or at the interrupt, with the position
reached). ``lk.clear_buffer`` drops the speech not played yet (queued samples, the room's
audio queue, blocks not pushed), pushes a ``cut`` with the active prompt when the card can cut
(the engine replaces the in-flight chunk at its next step boundary), flushes the queued
frames, and reports ``interrupted: true``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

from runtime.task_set import TaskSet
from server.livekit.room import RoomConnection
from server.livekit.speech import SpeechPlayout
from sessions.session import Session

__all__ = [
    "AUDIO_STREAM_TOPIC",
    "RPC_CLEAR_BUFFER",
    "RPC_PLAYBACK_FINISHED",
    "RPC_PLAYBACK_STARTED",
    "AvatarBridge",
]

log = logging.getLogger(__name__)

AUDIO_STREAM_TOPIC = "lk.audio_stream"
RPC_CLEAR_BUFFER = "lk.clear_buffer"
RPC_PLAYBACK_STARTED = "lk.playback_started"
RPC_PLAYBACK_FINISHED = "lk.playback_finished"


class AvatarBridge:
    """The worker side of the convention for one session (module doc)."""

    def __init__(
        self,
        session: Session,
        room: RoomConnection,
        *,
        agent_identity: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.room = room
        self.agent_identity = agent_identity
        self.speech = SpeechPlayout(session, room, clock=clock)
        self._segments: asyncio.Queue[tuple[AsyncIterator[bytes], Mapping[str, str]]] = (
            asyncio.Queue(maxsize=8)
        )
        self._playing = False  # a segment is being read or played out
        self._tasks = TaskSet()  # the playout task and the RPCs to the agent
        self._task: asyncio.Task[None] | None = None  # the playout task, once started
        self.segments_played = 0
        self.segments_interrupted = 0

    def register(self) -> None:
        """RPC and byte-stream handlers (before the join, so no early call is missed)."""
        self.room.register_rpc(RPC_CLEAR_BUFFER, self._on_clear_buffer)
        self.room.register_byte_stream(AUDIO_STREAM_TOPIC, self._on_stream)

    def start(self) -> None:
        self._task = self._tasks.spawn(self._play(), f"peer-{self.session.id}-livekit-avatar")

    # ---------------------------------------------------------------- agent -> worker

    def _on_stream(
        self, chunks: AsyncIterator[bytes], sender: str, attributes: Mapping[str, str]
    ) -> None:
        if sender != self.agent_identity:
            log.warning("session %s: lk.audio_stream from %r ignored", self.session.id, sender)
            return
        try:
            self._segments.put_nowait((chunks, attributes))
        except asyncio.QueueFull:
            log.warning("session %s: avatar speech backlog full; segment dropped", self.session.id)

    async def _on_clear_buffer(self, caller: str, payload: str) -> str:
        if caller != self.agent_identity:
            return "reject"
        if not self._playing:
            return "ok"  # nothing to interrupt (like livekit-agents' AvatarRunner)
        self.speech.clear()
        session = self.session
        if session.accepts_inputs and "prompt.cut" in session.config.capabilities:
            session.push_prompt(session.prompts.active_text, "cut")
        last = session.media.last_pts
        if last is not None:
            session.media.flush_before(last + 1)
        return "ok"

    # ---------------------------------------------------------------- playing segments

    async def _play(self) -> None:
        while True:
            chunks, attributes = await self._segments.get()
            try:
                rate = int(attributes.get("sample_rate", "0"))
                channels = int(attributes.get("num_channels", "0"))
            except ValueError:
                rate = channels = 0
            if rate <= 0 or channels <= 0:
                log.warning(
                    "session %s: lk.audio_stream without sample_rate/num_channels", self.session.id
                )
                continue
            self._playing = True
            try:
                report = await self.speech.play(
                    chunks, rate, channels, lambda: self._notify(RPC_PLAYBACK_STARTED, "")
                )
            finally:
                self._playing = False
            self.segments_played += 1
            self.segments_interrupted += int(report.interrupted)
            payload = {"playback_position": report.played_s, "interrupted": report.interrupted}
            self._notify(RPC_PLAYBACK_FINISHED, json.dumps(payload))

    def stats(self) -> dict[str, object]:
        """``avatar`` of ``GET /v1/sessions/{id}``."""
        return {"agent": self.agent_identity, "speech": self.speech.stats()}

    def _notify(self, method: str, payload: str) -> None:
        self._tasks.spawn(self._call(method, payload), f"peer-{self.session.id}-livekit-rpc")

    async def _call(self, method: str, payload: str) -> None:
        try:
            await self.room.perform_rpc(self.agent_identity, method, payload)
        except Exception as exc:  # noqa: BLE001 - an agent without the method is not fatal
            log.warning(
                "session %s: %s on %r failed: %s", self.session.id, method, self.agent_identity, exc
            )

    async def close(self) -> None:
        await self._tasks.close()
        self._task = None
        self.speech.close()
