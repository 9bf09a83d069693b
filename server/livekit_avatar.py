"""The LiveKit Agents avatar convention: dreamrt as the avatar worker of a voice agent.

Names and payloads are those of livekit-agents (``voice/avatar/_datastream_io.py``,
``DataStreamAudioOutput`` on the agent side, ``DataStreamAudioReceiver`` on the worker side;
``voice/room_io``: ``ATTRIBUTE_PUBLISH_ON_BEHALF``):

- the worker joins with participant attribute ``lk.publish_on_behalf`` = the agent's identity
  (set in the token ``server.livekit_token`` mints when the ``livekit`` block has
  ``avatar_of``);
- the agent streams its speech to the worker as one byte stream per speech segment on topic
  ``lk.audio_stream`` (attributes ``sample_rate``, ``num_channels``; payload: interleaved
  int16 PCM), sent to the worker's identity only; the stream's end ends the segment;
- the agent calls RPC ``lk.clear_buffer`` (payload ``""``) on the worker to interrupt; the
  worker answers ``"ok"`` (``"reject"`` to anyone but the agent);
- the worker calls RPC ``lk.playback_started`` (payload ``""``) on the agent when a segment
  starts playing, and ``lk.playback_finished`` with JSON ``{"playback_position": seconds,
  "interrupted": bool}`` when it has played or was cleared.

Here the speech becomes the session's audio input (16 kHz mono, pushed every
``AUDIO_PUSH_S``); a segment "plays" from its first push and finishes once as many seconds of
wall time as it holds have passed after its last byte. ``lk.clear_buffer`` drops the unpushed
audio and the rest of the segment, pushes a ``cut`` with the active prompt when the card can
cut (the engine replaces the in-flight chunk at its next step boundary), flushes the queued
frames, and reports ``interrupted: true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

import numpy as np

from runtime.task_set import TaskSet
from server.livekit_inputs import AUDIO_PUSH_S
from server.livekit_room import RoomConnection
from sessions.audio import TARGET_RATE_HZ, AudioClip, resample
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
        self._clock = clock
        self._segments: asyncio.Queue[tuple[AsyncIterator[bytes], Mapping[str, str]]] = (
            asyncio.Queue(maxsize=8)
        )
        self._cleared = False
        self._playing = False  # a segment is being read or played out
        self._tasks = TaskSet()  # the playout task and the RPCs to the agent
        self._task: asyncio.Task[None] | None = None  # the playout task, once started
        self.segments_played = 0
        self.segments_interrupted = 0
        self.samples_in = 0

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
        self._cleared = True
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
            self._cleared = False
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
                await self._play_segment(chunks, rate, channels)
            finally:
                self._playing = False

    async def _play_segment(self, chunks: AsyncIterator[bytes], rate: int, channels: int) -> None:
        push_n = int(AUDIO_PUSH_S * rate) * channels * 2  # bytes per push
        pending = bytearray()
        started_s: float | None = None
        seconds = 0.0
        async for data in chunks:
            if self._cleared:
                break
            pending += data
            while len(pending) >= push_n:
                seconds += self._push(bytes(pending[:push_n]), rate, channels)
                del pending[:push_n]
                if started_s is None:
                    started_s = self._clock()
                    self._notify(RPC_PLAYBACK_STARTED, "")
        if pending and not self._cleared:
            usable = len(pending) - len(pending) % (2 * channels)
            seconds += self._push(bytes(pending[:usable]), rate, channels)
            if started_s is None:
                started_s = self._clock()
                self._notify(RPC_PLAYBACK_STARTED, "")
        if started_s is None:
            started_s = self._clock()
        if not self._cleared:
            remaining = started_s + seconds - self._clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_cleared(), max(0.0, remaining))
        interrupted = self._cleared
        position = min(seconds, self._clock() - started_s) if interrupted else seconds
        self.segments_played += 1
        self.segments_interrupted += int(interrupted)
        payload = {"playback_position": round(position, 3), "interrupted": interrupted}
        self._notify(RPC_PLAYBACK_FINISHED, json.dumps(payload))

    async def _wait_cleared(self) -> None:
        while not self._cleared:
            await asyncio.sleep(0.05)

    def _push(self, pcm: bytes, rate: int, channels: int) -> float:
        """Pushes int16 interleaved PCM to the session; returns its duration in seconds."""
        if not pcm:
            return 0.0
        frames = np.frombuffer(pcm, dtype=np.int16).reshape(-1, channels)  # [n, channels]
        mono = frames.astype(np.float32).mean(axis=1) / 32768.0  # [n]
        samples = np.clip(resample(mono, rate, TARGET_RATE_HZ), -1.0, 1.0)
        self.samples_in += samples.shape[0]
        session = self.session
        if session.accepts_inputs and "input.audio" in session.config.capabilities:
            session.push_audio(AudioClip(samples, rate, channels))
        return frames.shape[0] / rate

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
